"""The embedded reward model's own experiments: training its head, its held-out accuracy, its scoring throughput.
Registered by ``rodeco_rewards`` through ``rodeco_register_experiments``; their configs are in
``rodeco_rewards/conf/experiment``, their argument schemas below (the values live in those YAML files)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from rodeco import required


@dataclass
class RMTrainArgs:
    data_dir: str = required("the shared data folder (prefs/ inside), relative to the working dir")
    out: Optional[str] = required("where to write the head; null: the committed head in rodeco_rewards/assets")
    exclude_files: list[str] = required("prompt files (relative to data_dir) whose instructions are held out")
    exclude_prompts: list[str] = required("more prompts held out, by text")
    max_length: int = required("encoder tokens per text")
    l2_grid: list[float] = required("L2 penalties on the surface-statistics weights (chosen by CV)")
    l2_embedding_grid: list[float] = required("L2 penalties on the embedding-feature weights (chosen by CV)")
    hidden_grid: list[int] = required("head widths; 0 is a linear head")
    steps: int = required("optimizer steps")
    lr: float = required("learning rate")
    cv_folds: int = required("instruction-grouped cross-validation folds")
    eval: bool = required("also score the test splits and store the metrics next to the head")


@dataclass
class RMEvalArgs:
    data_dir: str = required("the shared data folder (prefs/ inside), relative to the working dir")
    cache: bool = required("route the embedded RM's encoder through its disk cache of embeddings")
    limit: Optional[int] = required("a fixed random sample of this many pairs per split; null: all")


@dataclass
class RMBenchArgs:
    data_dir: str = required("the shared data folder (prefs/ inside), relative to the working dir")
    lengths: list[int] = required("partial lengths in generator tokens")
    batches: list[int] = required("requests per score call")
    repeats: int = required("timed calls per cell (the median is reported)")
