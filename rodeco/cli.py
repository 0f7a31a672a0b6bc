"""The ``rodeco`` command: a thin Hydra shell over ``rodeco.api.run``."""

from __future__ import annotations

import logging
import os
import shlex
import signal
import sys

from omegaconf import DictConfig

from rodeco.api import run
from rodeco.common.hardware import cuda_available
from rodeco.common.validation import ConfigError, Interrupted, PluginError
from rodeco.compose import CONFIG_MODULE, explain, prefer_typed, prepare
from rodeco.core.report import judge_line, summarize
from rodeco.merge import IncompleteMerge

log = logging.getLogger("rodeco")


class JobFailed(Exception):
    """A job of a multirun failed: raised (not ``sys.exit``) so the launcher records it and the other jobs go on;
    ``main`` reports it once every job has run."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message, code)
        self.message, self.code = message, code

    def __str__(self) -> str:
        return self.message


def cpu_share(n_jobs: int, jobs: int, cpus: int) -> int:
    """Threads for one of ``jobs`` processes a joblib launcher with ``n_jobs`` (joblib's convention: -1 = all CPUs)
    runs side by side on ``cpus`` cores: a fair share."""
    parallel = n_jobs if n_jobs > 0 else max(1, cpus + 1 + n_jobs)
    return max(1, cpus // max(1, min(parallel, jobs)))


def _share_threads(cfg: DictConfig, launcher: DictConfig) -> None:
    """Under the joblib launcher on CPU, each process takes its share of the cores (not all of them each)."""
    import torch

    if "joblib" not in str(launcher.get("_target_", "")) or cfg.generator.device not in ("auto", "cpu"):
        return
    if cfg.generator.device == "auto" and cuda_available():
        return
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = cpu_share(int(launcher.get("n_jobs", -1)), int(cfg.data.get("num_shards", 1)), cpus)
    torch.set_num_threads(threads)
    log.info("joblib launcher: %d thread(s) of %d cores for this process", threads, cpus)


def _main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    prefer_typed(cfg, list(hc.overrides.task))
    multirun = hc.mode == RunMode.MULTIRUN
    if multirun:
        _share_threads(cfg, hc.launcher)
    out_dir = cfg.output.dir if cfg.output.dir is not None else hc.runtime.output_dir
    fail = _job_failure if multirun else _fail
    if cfg.task == "serve":
        from rodeco.serve import serve

        try:
            serve(cfg)
        except (ConfigError, PluginError) as e:
            fail(e)
        return
    try:
        out = run(cfg, out_dir=out_dir)
    except (ConfigError, PluginError, IncompleteMerge) as e:
        fail(e, code=1 if isinstance(e, IncompleteMerge) else 2)
    except Interrupted as e:
        code = 128 + int(getattr(signal.Signals, e.signal_name, signal.SIGTERM))
        if multirun:
            fail(
                RuntimeError(
                    f"{e}. Resume with the same multirun command and hydra.sweep.dir={shlex.quote(str(hc.sweep.dir))}"
                ),
                code=code,
            )
        args = [shlex.quote(a) for a in sys.argv[1:]]
        if not any(a.startswith("hydra.run.dir=") for a in sys.argv[1:]):
            args.append(f"hydra.run.dir={shlex.quote(str(out_dir))}")
        fail(RuntimeError(f"{e}. Resume with: rodeco {' '.join(args)}"), code=code)
    if cfg.task == "decode":
        print(summarize(out, cfg))
    elif cfg.task == "merge":
        print(f"merged {out.extra['n_prompts']} prompts from {out.extra['shards']} shard(s): {out.extra['merged']}")
    elif cfg.task == "judge" and "judged" in out.extra:
        print(
            f"judged {out.extra['judged']} of {out.extra['results']} result(s) in {out.out_dir}\n"
            + judge_line(out.extra["judge"])
        )
    elif cfg.task == "judge":
        assert out.out_dir is not None  # judging a pool returns the pool's directory
        for name, j in out.extra["judge"].items():
            print(
                f"judge {name}: mean {j['mean_all']:.4f} over {j['candidates']} candidates of {j['prompts']} "
                f"prompts (Best-of-1: {j['mean_best_of_1']:.4f}); cached in {out.out_dir / 'scores'}"
            )


def _job_failure(e: Exception, code: int = 2) -> None:
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    msg = f"job {hc.job.num} ({' '.join(hc.overrides.task)}): {e}"
    print(f"rodeco: error: {msg}", file=sys.stderr)
    raise JobFailed(msg, code)


def _fail(e: Exception, code: int = 2) -> None:
    print(f"rodeco: error: {e}", file=sys.stderr)
    sys.exit(code)


def main() -> None:
    import hydra
    from hydra.errors import HydraException

    try:
        prepare()
    except ConfigError as e:  # e.g. RODECO_LOAD_PLUGINS names no installed plugin
        _fail(e)
    app = hydra.main(version_base=None, config_path=f"pkg://{CONFIG_MODULE}", config_name="config")(_main)
    # Hydra prints composition errors itself unless HYDRA_FULL_ERROR is set; with it set they reach us, and those we
    # can explain (a misspelled key, a wrong type, an unknown option) are reported in rodeco's words.
    full = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        app()
    except JobFailed as e:  # a multirun's job (its message is printed already; the others have run)
        sys.exit(e.code)
    except HydraException as e:
        if full == "1":
            raise
        why = explain(e, [a for a in sys.argv[1:] if not a.startswith("-")])
        if why is not None:
            _fail(why)
        msg = str(e) + (f"\n{e.__cause__}" if e.__cause__ is not None else "")
        _fail(RuntimeError(msg), code=1)
    finally:
        if full is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = full


def serve_main() -> None:
    """``rodeco-serve ...``: ``rodeco task=serve ...``."""
    sys.argv.insert(1, "task=serve")
    main()
