"""``rodeco task=judge judge=chrf output.dir=RUN_DIR``: judge what was decoded before, from its text, without
decoding again.

- ``rodeco task=judge judge=[chrf,ref_sim] output.dir=RUN``: the run's winners (and its finished candidates, when it
  kept them) that lack a score from these judges are scored in place; ``summary.json``'s ``judge`` section (means,
  cost apart from the method's) and, if the run wrote one, AlpacaEval's ``model_outputs.json`` are rewritten.
- ``rodeco task=judge judge=chrf pool=DIR``: every candidate of the pool is scored into the pool's score cache
  (``scores/<judge key>/``, as its reward's are), where the experiments read judge scores from.

A judge already in the run's summary under the same name with another config is refused (its scores would mix two
judges), and so is a judge that is the run's own guiding reward.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from rodeco.common.state import Compute, RunOutput
from rodeco.common.validation import ConfigError
from rodeco.core.judging import Judges, check_specs, summarize
from rodeco.core.results import ResultsWriter, atomic_write, export_alpaca_eval
from rodeco.plugins import BuildContext, Plugins
from rodeco.roles import Choice, RoleBuilder, choose, choose_judges

log = logging.getLogger(__name__)


def judge_task(cfg: DictConfig, plugins: Plugins) -> RunOutput:
    """``task=judge``: the run in ``output.dir``, or the pool in ``pool``."""
    if not cfg.get("judge"):
        raise ConfigError(
            "judge",
            None,
            "task=judge needs at least one judge",
            "name them: rodeco task=judge judge=[chrf,ref_sim] output.dir=RUN_DIR",
        )
    if cfg.pool:
        return judge_pool(cfg, plugins)
    if not cfg.output.dir:
        raise ConfigError(
            "output.dir",
            None,
            "task=judge scores a run's results in place and needs its directory",
            "rodeco task=judge judge=chrf output.dir=RUN_DIR (or pool=POOL_DIR for a pool)",
        )
    return judge_run(cfg, plugins, Path(cfg.output.dir))


def judges_by_name(names: list[str], guide: str = "minilm_rm", overrides: tuple[str, ...] = ()) -> Judges:
    """Judges by option name (``["chrf", "ref_sim"]``), built as a run with reward option ``guide`` builds them, so
    the guide itself is refused as a judge; ``overrides`` are further Hydra overrides (another judge entry)."""
    from rodeco.compose import load_config
    from rodeco.plugins import default_plugins

    plugins = default_plugins()
    cfg = load_config([f"judge=[{','.join(names)}]", f"reward={guide}", *overrides], plugins)
    choices = choose_judges(cfg.judge, plugins, (choose(cfg.reward, "reward", plugins),))
    return RoleBuilder(plugins, str(cfg.generator.model), BuildContext(plugins=plugins)).judges(choices)


def _guides(run_dir: Path, plugins: Plugins) -> tuple[Choice, ...]:
    """The reward and partial reward a run was guided by (its ``.hydra/config.yaml``), when it has one."""
    f = run_dir / ".hydra" / "config.yaml"
    if not f.is_file():
        return ()
    run_cfg = OmegaConf.load(f)
    assert isinstance(run_cfg, DictConfig)  # Hydra writes a run's config as a mapping
    out = [choose(run_cfg.reward, "reward", plugins)]
    partial = run_cfg.get("partial_reward")
    if partial is not None and partial.get("name") not in ("same", "oracle", None):
        out.append(choose(partial, "partial_reward", plugins))
    return tuple(out)


def judge_run(cfg: DictConfig, plugins: Plugins, run_dir: Path) -> RunOutput:
    """Score what ``run_dir``'s results lack for the run's judges, in place; the summary's judge section and the
    AlpacaEval export follow."""
    writer = ResultsWriter(run_dir)
    if not writer.records:
        raise ConfigError(
            "output.dir",
            str(run_dir),
            "holds no results.jsonl with results to judge",
            "give the directory of a decode run (its results.jsonl)",
        )
    summary_path = run_dir / "summary.json"
    summary: dict[str, Any] = json.loads(summary_path.read_text(encoding="utf-8")) if summary_path.is_file() else {}
    choices = choose_judges(cfg.judge, plugins, _guides(run_dir, plugins))
    judges = RoleBuilder(plugins, "", BuildContext(plugins=plugins)).judges(choices)
    check_specs(summary.get("judge", {}), judges, str(run_dir))
    from tqdm.auto import tqdm

    done = 0
    for rec in tqdm(list(writer.records.values()), desc="judging", unit="prompt", disable=not cfg.output.progress):
        if judges.judge_record(rec):
            done += 1
            writer.save()  # every judged record is kept at once
    summary["judge"] = summarize(writer.records.values(), judges, summary.get("judge", {}))
    writer.write_json("summary.json", summary)
    alpaca = run_dir / "model_outputs.json"
    if alpaca.is_file():
        name = json.loads(alpaca.read_text(encoding="utf-8"))
        export_alpaca_eval(writer.path, alpaca, name[0]["generator"] if name else "rodeco")
    log.info("judged %d of %d result(s) in %s", done, len(writer.records), writer.path)
    return RunOutput(
        [], Compute(), run_dir, extra={"judge": summary["judge"], "judged": done, "results": len(writer.records)}
    )


def judge_pool(cfg: DictConfig, plugins: Plugins) -> RunOutput:
    """Score every candidate of the pool by each judge into the pool's score cache; ``judge_pool.json`` in the pool
    keeps each judge's mean over all candidates and over the first candidate of each prompt (Best-of-1)."""
    from tqdm.auto import tqdm

    from rodeco.replays.pool import Pool
    from rodeco.replays.pool_rewards import PoolReward

    pool = Pool(cfg.pool)
    choices = choose_judges(cfg.judge, plugins, (choose(cfg.reward, "reward", plugins),))
    builder = RoleBuilder(
        plugins, str(pool.settings["generator"].get("model", "")), BuildContext(plugins=plugins), pool=pool
    )
    judges = builder.judges(choices)
    out: dict[str, Any] = {}
    for j in judges.judges:
        cache = j.scorer.reward
        assert isinstance(cache, PoolReward)  # a builder with a pool serves every reward from its cache
        all_scores, first = [], []
        for index in tqdm(pool.indices(), desc=f"judging {j.name}", unit="prompt", disable=not cfg.output.progress):
            s = j.scorer(pool.prompt(index).final_requests())
            cache.save()  # the cache, prompt by prompt
            all_scores.extend(s.tolist())
            first.append(float(s[0]))
        out[j.name] = {
            "mean_all": float(np.mean(all_scores)),
            "mean_best_of_1": float(np.mean(first)),
            "prompts": len(first),
            "candidates": len(all_scores),
            **j.spec,
            "cost": j.cost(),
        }
        log.info(
            "judge %s: %d candidates of %d prompts scored (cached in %s)",
            j.name,
            len(all_scores),
            len(first),
            pool.path / "scores",
        )
    atomic_write(pool.path / "judge_pool.json", json.dumps(out, indent=2) + "\n")
    return RunOutput([], Compute(), pool.path, extra={"judge": out})
