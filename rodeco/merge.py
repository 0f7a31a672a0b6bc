"""``rodeco task=merge merge.dir=SWEEP_DIR``: the shards of a sharded multirun as one run.

Every directory under ``merge.dir`` with a ``.hydra/config.yaml`` is a shard. Their settings must agree on every key
but the shard's own (``MAY_DIFFER``); the merge writes one ``results.jsonl`` ordered by ``prompt_index``, one
``summary.json`` with the shards' compute summed (and their judges' costs apart from it, the judges' means
recomputed over the merged results), and (``output.alpaca_eval=NAME``) AlpacaEval's
``model_outputs.json``. While prompts of the data set are missing it writes what it has, lists them, and fails.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rodeco.common.state import Compute, RunOutput
from rodeco.common.validation import ConfigError, node_dict
from rodeco.compose import prefer_typed
from rodeco.core.data import HubSource, load_prompts
from rodeco.core.judging import summarize as summarize_judges
from rodeco.core.results import ResultsWriter, export_alpaca_eval

log = logging.getLogger(__name__)

# keys that may differ between shards of one run: which shard, and where and how its output was written
MAY_DIFFER = ("data.shard", "output.dir", "output.progress", "output.resume", "output.alpaca_eval", "merge.dir")


class IncompleteMerge(RuntimeError):
    """Some prompts of the data set are in no shard's results (yet)."""


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out if out or not prefix else {prefix[:-1]: {}}
    return {prefix[:-1]: node}


def shard_dirs(root: Path) -> list[Path]:
    """The run directories under ``root`` (a multirun's sweep dir): those holding ``.hydra/config.yaml``."""
    return sorted((p.parent.parent for p in root.glob("**/.hydra/config.yaml")), key=lambda p: str(p))


def run_config(d: Path) -> DictConfig:
    """The settings a run directory's job ran with: its composed config, adjusted for what the user typed as the
    CLI does (``compose.prefer_typed``)."""
    cfg = OmegaConf.load(d / ".hydra/config.yaml")
    if not isinstance(cfg, DictConfig):
        raise TypeError(f"{d / '.hydra/config.yaml'} is not a mapping config")
    overrides = d / ".hydra/overrides.yaml"
    prefer_typed(cfg, list(OmegaConf.load(overrides)) if overrides.is_file() else [])
    return cfg


def launch_dir(d: Path) -> str:
    """The directory a run was started from (``hydra.runtime.cwd``), or the current one if unknown."""
    hydra = d / ".hydra/hydra.yaml"
    cwd = OmegaConf.select(OmegaConf.load(hydra), "hydra.runtime.cwd") if hydra.is_file() else None
    return cwd or "."


def differing_keys(settings: list[dict[str, Any]]) -> list[str]:
    keys = sorted(set().union(*settings))
    return [
        k for k in keys if k not in MAY_DIFFER and len({json.dumps(s.get(k), sort_keys=True) for s in settings}) > 1
    ]


def add_judges(into: dict[str, Any], section: dict[str, Any], d: Path, root: Path) -> None:
    """A shard's judges (its summary's ``judge`` section) into the merge's: the same judge in every shard that has
    it (a shard judged afterwards by another config of it is refused), their costs summed apart from the method's."""
    for name, j in section.items():
        have = into.setdefault(name, {k: j[k] for k in ("config", "identity") if k in j} | {"cost": {}})
        if (have.get("config"), have.get("identity")) != (j.get("config"), j.get("identity")):
            raise ConfigError(
                "merge.dir",
                str(root),
                f"its shards were judged by different {name!r} judges ({d.name}: "
                f"{j.get('config')}; before: {have.get('config')})",
                f"judge every shard alike: rodeco task=judge judge.{name}=... output.dir=SHARD_DIR",
            )
        for k, v in j.get("cost", {}).items():
            have["cost"][k] = have["cost"].get(k, 0) + v
        if "report" in j:  # a judge's own figures (win rates) do not add up across shards: kept by shard
            have.setdefault("report_by_shard", {})[d.name] = j["report"]


@dataclass
class Sweep:
    """A sharded multirun's sweep directory: its shards' run directories and their flattened settings, in order."""

    root: Path
    dirs: list[Path]
    settings: list[dict[str, Any]]


@dataclass
class Gathered:
    """What the shards wrote, together: their results by ``prompt_index`` (a prompt in several shards: the first
    shard's), their compute summed, one line each for the summary, and their judges (``add_judges``)."""

    records: dict[int, dict[str, Any]] = field(default_factory=dict)
    total: Compute = field(default_factory=Compute)
    shards: list[dict[str, Any]] = field(default_factory=list)
    judged: dict[str, Any] = field(default_factory=dict)


def read_sweep(value: Any) -> Sweep:
    """The shards under ``merge.dir`` (``value``), with their settings; a ``ConfigError`` when it is unset or holds
    no run directory."""
    if not value:
        raise ConfigError(
            "merge.dir",
            value,
            "task=merge needs the sweep directory of a sharded multirun",
            "rodeco task=merge merge.dir=multirun/DATE/TIME (the dir with one subdir per shard)",
        )
    root = Path(value)
    dirs = shard_dirs(root) if root.is_dir() else []
    if not dirs:
        raise ConfigError(
            "merge.dir",
            str(root),
            "holds no run directory (none has .hydra/config.yaml)",
            "give the multirun's sweep dir (hydra.sweep.dir), e.g. multirun/DATE/TIME",
        )
    return Sweep(root, dirs, [flatten(node_dict(run_config(d), resolve=False)) for d in dirs])


def check_one_decode(sweep: Sweep) -> None:
    """A ``ConfigError`` unless the shards are decode runs of one setting (they differ only in ``MAY_DIFFER``)."""
    diff = differing_keys(sweep.settings)
    if diff:

        def values(k: str) -> str:
            return ", ".join(f"{d.name}: {s.get(k)!r}" for d, s in zip(sweep.dirs, sweep.settings))

        raise ConfigError(
            "merge.dir",
            str(sweep.root),
            "its runs differ in settings that change results: " + "; ".join(f"{k} ({values(k)})" for k in diff),
            "merge only the shards of one setting (run each setting in its own hydra.sweep.dir)",
        )
    s0 = sweep.settings[0]
    if s0.get("task", "decode") != "decode":
        raise ConfigError(
            "merge.dir",
            str(sweep.root),
            f"its runs are task={s0.get('task')!r}, not decode runs",
            "merge the sweep dir of a sharded decode",
        )


def expected_prompts(sweep: Sweep) -> list[int]:
    """The ``prompt_index`` of every prompt of the shards' data set (its path taken from where the shards ran)."""
    data = OmegaConf.create({k[5:]: v for k, v in sweep.settings[0].items() if k.startswith("data.")})
    if data.get("path") is not None:
        ran_in = Path(launch_dir(sweep.dirs[0]))  # a relative data.path is relative to where the shards ran
        if (ran_in / data.path).exists():
            data.path = str(ran_in / data.path)
    return [
        p.index
        for p in load_prompts(
            data.get("path"),
            data.get("prompts"),
            data.get("field", "prompt"),
            data.get("offset", 0),
            data.get("limit"),
            data.get("indices"),
            data.get("root"),
            HubSource.of(data),
        )
    ]


def gather(sweep: Sweep) -> Gathered:
    """Each shard's results, compute and judges, read in the shards' order."""
    got = Gathered()
    for d, setting in zip(sweep.dirs, sweep.settings):
        recs = ResultsWriter(d).records
        for i, r in recs.items():
            got.records.setdefault(i, r)
        summary = d / "summary.json"
        info = json.loads(summary.read_text(encoding="utf-8")) if summary.is_file() else {}
        got.total.add(Compute.from_dict(info.get("compute", {})))
        add_judges(got.judged, info.get("judge", {}), d, sweep.root)
        got.shards.append(
            {
                "dir": str(d),
                "shard": setting.get("data.shard"),
                "n_prompts": len(recs),
                "complete": bool(info.get("complete", False)),
                "has_summary": bool(info),
            }
        )
    return got


def write_merged(
    out: Path, got: Gathered, expected: list[int], missing: list[int], s0: dict[str, Any]
) -> ResultsWriter:
    """The merged ``results.jsonl`` (when any prompt is present) and ``summary.json`` in ``out``; ``s0``: the
    shards' settings."""
    merged = ResultsWriter(out, resume=False)
    merged.records = got.records
    if got.records:
        merged.save()
    merged.write_json(
        "summary.json",
        {
            "compute": got.total.to_dict(),
            "n_prompts": len(got.records),
            "prompts_total": len(expected),
            "complete": not missing,
            "missing": missing,
            "shards": got.shards,
            "policy": s0.get("policy.name"),
            "reward": s0.get("reward.name"),
            "partial_reward": s0.get("partial_reward.name"),
            **({"judge": summarize_judges(got.records.values(), previous=got.judged)} if got.judged else {}),
        },
    )
    return merged


def check_complete(missing: list[int], expected: list[int], got: Gathered, merged: ResultsWriter) -> None:
    """``IncompleteMerge`` naming the prompts of the data set in no shard's results (``missing``), if any."""
    if missing:
        shown = ", ".join(map(str, missing[:20])) + (" ..." if len(missing) > 20 else "")
        raise IncompleteMerge(
            f"{len(missing)} of {len(expected)} prompts are in no shard's results: prompt_index "
            f"{shown}. The {len(got.records)} present are merged into {merged.path}. Rerun the same "
            f"multirun command (with the same hydra.sweep.dir) to compute only the missing ones, "
            f"then merge again"
        )


def merge(cfg: DictConfig, out_dir: str | Path | None = None) -> RunOutput:
    """Merge the shards under ``cfg.merge.dir`` into ``out_dir`` (default: that directory)."""
    sweep = read_sweep(cfg.merge.dir)
    check_one_decode(sweep)
    expected = expected_prompts(sweep)
    got = gather(sweep)
    out = Path(out_dir) if out_dir is not None else sweep.root
    missing = [i for i in expected if i not in got.records]
    merged = write_merged(out, got, expected, missing, sweep.settings[0])
    check_complete(missing, expected, got, merged)
    if cfg.output.alpaca_eval:
        export_alpaca_eval(merged.path, out / "model_outputs.json", cfg.output.alpaca_eval)
    n = len(got.records)
    log.info("merged %d prompts from %d shard(s) into %s", n, len(sweep.dirs), merged.path)
    return RunOutput([], got.total, out, extra={"merged": str(merged.path), "n_prompts": n, "shards": len(sweep.dirs)})
