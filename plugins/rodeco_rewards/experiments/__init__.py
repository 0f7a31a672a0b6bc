"""The embedded reward model's own experiments: training its head (``rm_train``), its held-out accuracy
(``rm_eval``), its scoring throughput (``rm_bench``); and ``value_train`` (``learned_heads_train.py``), which trains the
learned partial scorers of ``rodeco_rewards.learned_heads``. Registered by ``rodeco_rewards`` through
``rodeco_register_experiments``; their configs are in ``rodeco_rewards/conf/experiment``, their argument schemas below
(the values live in those YAML files)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from rodeco import required


@dataclass
class RMTrainArgs:
    data_dir: Optional[str] = required("the folder with prefs/ and prompts/; null: the data root (data.root's rule)")
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
    surface: bool = required("false: the surface statistics' weights are held at 0 (an embedding-only head)")


@dataclass
class ValueTrainArgs:
    kinds: list[str] = required("heads to train: value_head (hidden state), text_value (the RM's text features)")
    lengths: list[int] = required("decision lengths whose partial states are the examples")
    verdict_lengths: list[int] = required("lengths (some of `lengths`) the verdict's head - same is averaged over")
    length_buckets: list[int] = required(
        "each length bucket's last length (e.g. [8, 16, 32, 64]: <=8, 9-16, 17-32, "
        "33-64, 65+): one weight vector per bucket"
    )
    choose_fraction: float = required("share of the prompts (seeded) that choose the loss, penalty or epoch")
    verdict_fraction: float = required("share of the prompts (seeded) held out for the verdict only, used once")
    losses: list[str] = required(
        "losses tried per bucket, chosen on the choose prompts: mse, bt (Bradley-Terry on within-prompt pairs)"
    )
    hidden_units: int = required(
        "0: linear heads; else value_head is a one-hidden-layer MLP this wide per bucket "
        "(text_value stays linear: it is anchored on the reward's head)"
    )
    ridge_alphas: list[float] = required(
        "penalties on the weights' distance from the anchor (linear heads), chosen "
        "per bucket on the choose prompts; the anchor itself is always a candidate"
    )
    epochs: int = required("MLP epochs (the best on the choose prompts is kept)")
    bootstrap: int = required("bootstrap resamples of the verdict prompts, for the CIs")
    exclude_data: list[str] = required("data options (evaluation sets) none of whose prompts may be trained on")
    install: bool = required("also write the heads to rodeco_rewards/assets (the committed heads)")


@dataclass
class PrefixTrainArgs:
    lengths: list[int] = required("prefix lengths (generator tokens) whose partial texts are the examples")
    verdict_lengths: list[int] = required(
        "lengths (some of `lengths`) that choose the weights and that the verdict's head - same is averaged over"
    )
    choose_fraction: float = required("share of the pool's prompts (seeded) that choose (mc, td)")
    verdict_fraction: float = required("share of the pool's prompts (seeded) held out for the verdict only")
    mc_weights: list[float] = required("weights of the lookahead-consistency (Monte Carlo) term tried")
    td_weights: list[float] = required("weights of the smoothness (temporal-difference) term tried")
    anchor_weights: list[float] = required(
        "0: rm_train's penalty on the weights; k > 0: k times it on their distance "
        "from the committed head's (each tried)"
    )
    pair_holdout: float = required(
        "share of the preference pairs' instructions (seeded) kept out of the fit, to measure final-text accuracy"
    )
    max_accuracy_drop: float = required(
        "a candidate is admissible when its held-out pair accuracy is within this of the Bradley-Terry-only fit's"
    )
    max_iter: int = required("L-BFGS iterations per fit")
    pair_limit: Optional[int] = required("null: every training pair; n: the first n (quick runs, tests)")
    data_dir: Optional[str] = required("the folder with prefs/ and prompts/; null: the data root (data.root's rule)")
    exclude_files: list[str] = required("prompt files (relative to data_dir) whose instructions are held out")
    exclude_prompts: list[str] = required("more prompts held out, by text")
    bootstrap: int = required("bootstrap resamples of the verdict prompts, for the CIs")
    exclude_data: list[str] = required("data options (evaluation sets) none of whose prompts may be trained on")
    install: bool = required("also write the head to rodeco_rewards/assets (partial_reward=minilm_prefix)")


@dataclass
class RMEvalArgs:
    data_dir: Optional[str] = required("the folder with prefs/ and prompts/; null: the data root (data.root's rule)")
    cache: bool = required("route the embedded RM's encoder through its disk cache of embeddings")
    limit: Optional[int] = required("a fixed random sample of this many pairs per split; null: all")


@dataclass
class RMBenchArgs:
    data_dir: Optional[str] = required("the folder with prefs/ and prompts/; null: the data root (data.root's rule)")
    lengths: list[int] = required("partial lengths in generator tokens")
    batches: list[int] = required("requests per score call")
    repeats: int = required("timed calls per cell (the median is reported)")


@dataclass
class VerifierTrainArgs:
    pools: list[str] = required(
        "training pools, one per task, recorded on training seeds with experiment_args.hidden_states=true and "
        "experiment_args.top_logprobs=5"
    )
    holdout: list[dict] = required(
        "held-out problem sets ({seed, size}) regenerated per task: a training problem with one of their texts is "
        "dropped (the selection and report seeds)"
    )
    prefixes: list[int] = required("prefix lengths whose partial states are examples, and the length buckets")
    features: list[str] = required("feature sets tried (hidden+stats, stats, hidden): the ablation")
    objectives: list[str] = required(
        "objectives tried: pointwise (each row's label) and pairwise (right over wrong rows of a problem, calibrated)"
    )
    l2: list[float] = required("L2 penalties tried (chosen with the features on the choose problems)")
    choose_fraction: float = required("share of each task's problems (seeded) that choose the features and penalty")
    report_fraction: float = required("share of each task's problems (seeded) held out for the report only")
    bootstrap: int = required("bootstrap resamples of the report problems, for the AUCs' CIs")
    install: bool = required("also write the head to rodeco_rewards/assets/verifier (the committed one)")
