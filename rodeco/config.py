"""Structured-config schema (stored in Hydra's ConfigStore) and validation of values the schema cannot express.

``reward`` and ``policy`` are open nodes: ``name`` picks the registered plugin, the other keys are its parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING


@dataclass
class GeneratorConfig:
    model: str = field(default="smollm2", metadata={"help": "'smollm2' (embedded), a hub name, a local dir or a .gguf"})
    gguf_file: Optional[str] = field(default=None, metadata={"help": "GGUF file inside `model` (a dir or hub repo)"})
    dtype: str = field(default="auto", metadata={"help": "auto (fp32 on CPU, bf16 on CUDA), float32, bfloat16, float16"})
    device: str = field(default="auto", metadata={"help": "auto, cpu, cuda, cuda:N"})
    engine: str = field(default="auto", metadata={"help": "auto (fast Llama path when it applies), fast, hf"})
    chat_template: bool = field(default=True, metadata={"help": "apply the tokenizer's chat template if it has one"})
    system_prompt: Optional[str] = None
    trust_remote_code: bool = False


@dataclass
class SamplingConfig:
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 50
    top_p: float = 1.0
    max_new_tokens: int = 128
    ignore_eos: bool = False  # decode exactly max_new_tokens per row (benchmarks)


@dataclass
class BudgetConfig:
    kv_tokens: Optional[int] = field(default=None, metadata={"help": "KV-cache tokens the batch may hold; null = "
                                                              "unlimited on CPU, from free memory on CUDA"})
    memory_fraction: float = 0.9  # CUDA: share of free memory (after the reserve) given to the KV cache
    reserve_gib: float = 2.0  # CUDA: memory kept free for activations and the reward model
    min_tokens_per_round: int = 8


@dataclass
class DataConfig:
    path: Optional[str] = field(default=None, metadata={"help": "JSON or JSONL file of records with a prompt field"})
    prompts: Optional[list[str]] = None
    batch_prompts: int = field(default=4, metadata={"help": "prompts decoded together in one batch"})
    offset: int = 0
    limit: Optional[int] = None
    field: str = "prompt"  # the record key that holds the prompt text (defined last: it shadows `field`)


@dataclass
class OutputConfig:
    dir: Optional[str] = None  # null: the Hydra run directory from the CLI; no files from the Python API
    all_candidates: bool = False
    resume: bool = True
    alpaca_eval: Optional[str] = None  # a generator name: also write AlpacaEval's model_outputs.json
    progress: bool = True


@dataclass
class RodecoConfig:
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    data: DataConfig = field(default_factory=DataConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    reward: Any = field(default_factory=lambda: {"name": MISSING})
    policy: Any = field(default_factory=lambda: {"name": MISSING})
    n: Any = 16  # rows per prompt, or "auto"
    seed: int = 0
    task: str = "decode"  # what `run` does: decode, or an experiment's name
    experiment_args: Any = field(default_factory=dict)


_stored = False


def register_configs() -> None:
    """Put the schema in Hydra's ConfigStore (idempotent; called by the CLI and the API, not on import)."""
    global _stored
    if _stored:
        return
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="rodeco_schema", node=RodecoConfig)
    _stored = True
