"""The ``rodeco`` command: a thin Hydra shell over ``rodeco.api.run``."""

from __future__ import annotations

import logging
import os
import shlex
import signal
import sys

from omegaconf import DictConfig

from rodeco.api import run
from rodeco.compose import CONFIG_MODULE, explain, prefer_typed, prepare
from rodeco.report import summarize
from rodeco.validation import ConfigError, Interrupted, PluginError

log = logging.getLogger("rodeco")


def _main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    prefer_typed(cfg, list(hc.overrides.task))
    out_dir = cfg.output.dir if cfg.output.dir is not None else hc.runtime.output_dir
    try:
        out = run(cfg, out_dir=out_dir)
    except (ConfigError, PluginError) as e:
        _fail(e)
    except Interrupted as e:
        args = [shlex.quote(a) for a in sys.argv[1:]]
        if not any(a.startswith("hydra.run.dir=") for a in sys.argv[1:]):
            args.append(f"hydra.run.dir={shlex.quote(str(out_dir))}")
        _fail(RuntimeError(f"{e}. Resume with: rodeco {' '.join(args)}"), code=128 + int(
            getattr(signal.Signals, e.signal_name, signal.SIGTERM)))
    if cfg.task == "decode":
        print(summarize(out, cfg))


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
