"""The embedded reward model's own experiments: training its head, its held-out accuracy, its scoring throughput.
Registered by ``rodeco_rewards`` through ``rodeco_register_experiments``; their configs are in
``rodeco_rewards/conf/experiment``, their argument schemas below (the values live in those YAML files)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING


def _help(text: str) -> Any:
    return field(default=MISSING, metadata={"help": text})


@dataclass
class RMTrainArgs:
    data_dir: str = _help("the shared data folder (prefs/ inside), relative to the working dir")
    out: Optional[str] = _help("where to write the head; null: the committed head in rodeco_rewards/assets")
    exclude_files: list[str] = _help("prompt files (relative to data_dir) whose instructions are held out")
    exclude_prompts: list[str] = _help("more prompts held out, by text")
    max_length: int = _help("encoder tokens per text")
    l2_grid: list[float] = _help("L2 penalties on the surface-statistics weights (chosen by CV)")
    l2_embedding_grid: list[float] = _help("L2 penalties on the embedding-feature weights (chosen by CV)")
    hidden_grid: list[int] = _help("head widths; 0 is a linear head")
    steps: int = _help("optimizer steps")
    lr: float = _help("learning rate")
    cv_folds: int = _help("instruction-grouped cross-validation folds")
    eval: bool = _help("also score the test splits and store the metrics next to the head")


@dataclass
class RMEvalArgs:
    data_dir: str = _help("the shared data folder (prefs/ inside), relative to the working dir")
    cache: bool = _help("route the embedded RM's encoder through its disk cache of embeddings")
    limit: Optional[int] = _help("a fixed random sample of this many pairs per split; null: all")


@dataclass
class RMBenchArgs:
    data_dir: str = _help("the shared data folder (prefs/ inside), relative to the working dir")
    lengths: list[int] = _help("partial lengths in generator tokens")
    batches: list[int] = _help("requests per score call")
    repeats: int = _help("timed calls per cell (the median is reported)")
