"""The run config: its schema (dataclasses stored in Hydra's ConfigStore; the values are YAML under ``conf/``),
the checks the schema cannot express, and the values derived from it (plugin nodes, the budget).

``reward`` and ``policy`` are open nodes: ``name`` picks the registered plugin, the other keys are its parameters.
``experiment_args`` takes the schema of the experiment that ``task`` names (``experiment_args/<name>`` in the
ConfigStore, registered with the experiment).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from omegaconf import MISSING, DictConfig

from rodeco.common.budget import MIN_TOKENS_PER_ROUND, Budget
from rodeco.common.hardware import cuda_layers, is_cuda
from rodeco.common.validation import ConfigError, check_compile, node_dict
from rodeco.common.winner import WinnerRule

if TYPE_CHECKING:
    from rodeco.common.protocols import Generator, LanguageModel, SessionMaker

log = logging.getLogger(__name__)


@dataclass
class GeneratorConfig:
    model: str = field(default="smollm2", metadata={"help": "'smollm2' (embedded), a hub name, a local dir or a .gguf"})
    gguf_file: Optional[str] = field(default=None, metadata={"help": "GGUF file inside `model` (a dir or hub repo)"})
    dtype: str = field(
        default="auto", metadata={"help": "auto (fp32 on CPU, bf16 on CUDA), float32, bfloat16, float16"}
    )
    device: str = field(default="auto", metadata={"help": "auto, cpu, cuda, cuda:N"})
    engine: str = field(
        default="auto",
        metadata={
            "help": "auto (fast Llama path when it applies), fast, hf, vllm (rows decode in vLLM: make setup-vllm)"
        },
    )
    device_map: Optional[str] = field(
        default=None,
        metadata={"help": "auto: spread a model too big for one device over all of them (accelerate; hf engine)"},
    )
    compile: str = field(
        default="auto",
        metadata={
            "help": "auto (on CUDA), true, false: the fast engine's decode "
            "step compiled with torch.compile (not part of a pool's "
            "identity)"
        },
    )
    chat_template: bool = field(default=True, metadata={"help": "apply the tokenizer's chat template if it has one"})
    system_prompt: Optional[str] = None
    trust_remote_code: bool = False
    # generator.engine=vllm only (rodeco/engines/vllm.py)
    kv_cache_tokens: Optional[int] = field(
        default=None,
        metadata={"help": "vllm: its KV pool in tokens; null: gpu_memory_utilization on CUDA, 32768 on CPU"},
    )
    gpu_memory_utilization: float = field(
        default=0.7,
        metadata={"help": "vllm: the GPU share vLLM takes (weights, activations, KV pool); the rest is the rewards'"},
    )
    tensor_parallel_size: int = field(default=1, metadata={"help": "vllm: GPUs one model is split over"})
    max_model_len: Optional[int] = field(
        default=None, metadata={"help": "vllm: longest prompt + response; null: the model's"}
    )
    kv_block: Optional[int] = field(
        default=None, metadata={"help": "vllm: tokens per KV block; null: 16 on CUDA, 32 on CPU"}
    )
    max_num_seqs: int = field(default=512, metadata={"help": "vllm: the most rows decoding at once"})
    enforce_eager: bool = field(
        default=False, metadata={"help": "vllm: no compilation or CUDA graphs (starts in seconds; decodes slower)"}
    )


VLLM_ONLY = (
    "kv_cache_tokens",
    "gpu_memory_utilization",
    "tensor_parallel_size",
    "max_model_len",
    "kv_block",
    "max_num_seqs",
    "enforce_eager",
)  # the generator keys only generator.engine=vllm reads


NOT_IDENTITY = ("compile",)  # generator keys that change speed, not which candidates a pool holds


def candidate_settings(generator: DictConfig) -> dict[str, Any]:
    """The ``generator`` keys a candidate's tokens depend on (what a pool records): the vLLM keys only on vLLM, and
    never ``compile`` (a pool recorded eager extends compiled, and the other way round)."""
    d = node_dict(generator)
    skip = NOT_IDENTITY + (() if d.get("engine") == "vllm" else VLLM_ONLY)
    return {k: v for k, v in d.items() if k not in skip}


@dataclass
class SamplingConfig:
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 50
    top_p: float = 1.0
    max_new_tokens: int = 128
    ignore_eos: bool = False  # decode exactly max_new_tokens per row (benchmarks)
    stop: list[str] = field(
        default_factory=list,
        metadata={"help": "stop strings: a candidate ends when its text holds one (cut before it, as at EOS)"},
    )


BUDGET_MODES = {
    "tokens": "budget=cpu: budget.kv_tokens, on any device",
    "unlimited": "budget=unlimited: no limit, on every device",
    "device": "budget=cuda: from free CUDA memory",
    "engine": "budget=engine: the engine's own KV pool (vLLM's)",
}


@dataclass
class BudgetConfig:
    mode: str = field(
        default="tokens",
        metadata={
            "help": "tokens (budget.kv_tokens), unlimited (every device), "
            "device (free CUDA memory), engine (vLLM's KV pool)"
        },
    )
    kv_tokens: Optional[int] = field(
        default=None, metadata={"help": "budget.mode=tokens: KV-cache tokens the batch may hold"}
    )
    memory_fraction: float = 0.9  # CUDA: share of free memory (after the reserve) given to the KV cache
    reserve_gib: float = 2.0  # CUDA: memory kept free for activations and the reward model
    min_tokens_per_round: int = field(
        default=MIN_TOKENS_PER_ROUND, metadata={"help": "each round decodes at least this many tokens per row"}
    )


@dataclass
class DataConfig:
    path: Optional[str] = field(
        default=None,
        metadata={
            "help": "JSON or JSONL file of records with a prompt field "
            "(relative: the working directory, else data.root)"
        },
    )
    prompts: Optional[list[str]] = None
    root: Optional[str] = field(
        default=None,
        metadata={
            "help": "the data folder named options read from (null: $RODECO_DATA, else ../shared/data when it exists)"
        },
    )
    hf: Optional[str] = field(
        default=None,
        metadata={
            "help": "a hub dataset (tatsu-lab/alpaca_eval) or a local folder of JSON/JSONL files, loaded by datasets"
        },
    )
    hf_subset: Optional[str] = field(default=None, metadata={"help": "data.hf's subset (its config name)"})
    split: str = field(default="train", metadata={"help": "data.hf's split"})
    batch_prompts: int = field(default=4, metadata={"help": "prompts decoded together in one batch"})
    indices: Optional[list[int]] = field(default=None, metadata={"help": "positions in the source to keep, in order"})
    offset: int = 0
    limit: Optional[int] = None
    num_shards: int = field(
        default=1, metadata={"help": "split the prompts into this many shards (batches dealt round-robin)"}
    )
    shard: int = field(default=0, metadata={"help": "which shard to run, 0 to num_shards - 1"})
    source: Optional[str] = field(
        default=None,
        metadata={"help": "a registered task source (reasoning_gym): data.size problems of data.task, generated"},
    )
    task: Optional[str] = field(default=None, metadata={"help": "data.source's task, by its name there (chain_sum)"})
    size: Optional[int] = field(default=None, metadata={"help": "how many problems data.source generates, exactly"})
    seed: int = field(default=0, metadata={"help": "the seed data.source draws its problems from"})
    task_config: Any = field(
        default=None, metadata={"help": "the task's own settings ({min_terms: 2}): its difficulty (null: its defaults)"}
    )
    template: str = field(
        default="{question}", metadata={"help": "the prompt made of a generated problem's {question}"}
    )
    holdout_seed: Optional[int] = field(
        default=None,
        metadata={
            "help": "problems that repeat the held-out set (this task, this seed, holdout_size) are dropped and "
            "replaced: set it on training and selection sets to keep report problems out"
        },
    )
    holdout_size: int = field(default=0, metadata={"help": "the held-out set's size (with holdout_seed)"})
    field: str = "prompt"  # the record key that holds the prompt text (defined last: it shadows `field`)


@dataclass
class OutputConfig:
    dir: Optional[str] = None  # null: the Hydra run directory from the CLI; no files from the Python API
    all_candidates: bool = False
    resume: bool = True
    alpaca_eval: Optional[str] = None  # a generator name: also write AlpacaEval's model_outputs.json
    progress: bool = True


@dataclass
class WinnerConfig:
    rule: str = field(
        default="reward",
        metadata={
            "help": "reward (the highest final reward), majority (self-consistency) or weighted (weighted Best-of-N)"
        },
    )
    extractor: str = field(
        default="boxed", metadata={"help": "a vote's answers: boxed, last_number, regex, or package.module:function"}
    )
    pattern: Optional[str] = field(default=None, metadata={"help": "extractor=regex: the pattern (its first group)"})
    temperature: float = field(default=1.0, metadata={"help": "rule=weighted: weights softmax(reward / temperature)"})
    weight: str = field(
        default="reward",
        metadata={"help": "rule=weighted: reward (softmax of the reward) or confidence (the trace's, DeepConf's vote)"},
    )
    top_k: int = field(default=5, metadata={"help": "weight=confidence: a token's confidence is -mean top-k log-prob"})
    window: int = field(default=16, metadata={"help": "weight=confidence: the trace's lowest mean over this many"})
    stop: Optional[str] = field(
        default=None,
        metadata={"help": "stop a prompt once its vote is settled: beta (Adaptive-Consistency), certain, or null"},
    )
    stop_threshold: float = field(default=0.95, metadata={"help": "stop=beta: the chance the leader leads"})
    stop_tokens: int = field(default=8, metadata={"help": "stop: test the vote every this many tokens"})


@dataclass
class MergeConfig:
    dir: Optional[str] = field(default=None, metadata={"help": "task=merge: a sharded multirun's sweep dir"})


@dataclass
class ServeConfig:
    """``rodeco task=serve``: the OpenAI-compatible server (docs/serve.md)."""

    host: str = field(default="127.0.0.1", metadata={"help": "address to bind; off loopback it needs a key"})
    port: int = 8000
    api_key: Optional[str] = field(
        default=None, metadata={"help": "clients send it as a Bearer token (or set RODECO_API_KEY)"}
    )
    allow_public_without_key: bool = field(
        default=False, metadata={"help": "bind off loopback with no key (logs a warning)"}
    )
    model: Optional[str] = field(
        default=None, metadata={"help": "the model name requests use (default: the generator option's name)"}
    )
    policies: list[Any] = field(
        default_factory=lambda: [{"name": "fixed", "alpha": [0.0, 0.95]}, {"name": "none"}],
        metadata={
            "help": "the policy options a request may choose: [{name: OPTION, PARAM: "
            "[lo, hi] or {choices: [...]}}, ...]"
        },
    )
    best_of: int = field(default=16, metadata={"help": "candidates per request when it gives no best_of"})
    max_best_of: int = 64
    max_tokens: int = field(default=512, metadata={"help": "the most max_tokens a request may ask for"})
    request_memory: float = field(
        default=0.25,
        metadata={
            "help": "a rejecting policy's default budget: the memory of this share of best_of rows at full length"
        },
    )
    rejection_start: str = field(
        default="auto",
        metadata={
            "help": "the rows a rejecting policy's request starts: auto (as many as its budget holds at the first "
            "decision point, up to serve.max_best_of) or best_of"
        },
    )
    max_queue: int = field(default=64, metadata={"help": "requests waiting beyond this get 429"})
    batch_requests: int = field(default=16, metadata={"help": "the most requests decoded in one batch"})
    max_batch_rows: int = field(
        default=512,
        metadata={"help": "the most candidate rows a batch starts (on vllm: at most generator.max_num_seqs)"},
    )
    check_tokens: int = field(
        default=8, metadata={"help": "cancelled requests leave the batch within this many tokens"}
    )
    request_timeout_s: float = 300.0
    drain_timeout_s: float = field(default=30.0, metadata={"help": "on SIGTERM, in-flight requests get this long"})
    max_body_bytes: int = 1_000_000
    retry_after_s: int = 1
    reward_thread: bool = field(
        default=False,
        metadata={
            "help": "the rewards score on a thread of their own while the other requests decode (a request waiting "
            "for its scores holds its rows); false: on the decode thread"
        },
    )
    reward_threads: int = field(default=1, metadata={"help": "torch threads of the reward thread"})
    decode_threads: Optional[int] = field(
        default=None, metadata={"help": "torch threads of the decode thread (null: torch's default, every core)"}
    )
    latency_target: Optional[float] = field(
        default=None,
        metadata={
            "help": "seconds from a request's arrival to its last token: a request the step-time plan has miss it, "
            "or push another past its own, gets 429 with Retry-After at once (null: every request queues)"
        },
    )


@dataclass
class RodecoConfig:
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    data: DataConfig = field(default_factory=DataConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    winner: WinnerConfig = field(default_factory=WinnerConfig)
    merge: MergeConfig = field(default_factory=MergeConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    reward: Any = field(default_factory=lambda: {"name": MISSING})
    # scores active rows at decision points: `same` (the reward), or any reward option (partial_reward=logprob)
    partial_reward: Any = field(default_factory=lambda: {"name": "same"})
    policy: Any = field(default_factory=lambda: {"name": MISSING})
    # rewards that score the winners after the decode, never seen by it: {option: reward node} (judge=chrf,
    # judge=[chrf,ref_sim]; any reward option); their cost is reported apart from the method's
    judge: Any = field(default_factory=dict)
    n: Any = 16  # rows per prompt, "auto" (as many as fit), or "policy" (a policy that chooses its start)
    pool: Optional[str] = field(
        default=None,
        metadata={
            "help": "a pool directory (experiment=pool records one; replay, efficiency, perplexity, correlation use it)"
        },
    )
    seed: int = 0
    task: str = "decode"  # what `run` does: decode, merge, serve (the CLI's), or an experiment's name
    experiment_args: Any = field(default_factory=dict)


def required(help: str) -> Any:
    """A schema field whose value must come from the YAML that extends the schema (``MISSING`` here), with its
    help text: ``alphas: list[float] = required("rejection rates to try")``."""
    return field(default=MISSING, metadata={"help": help})


def register_configs(experiment_schemas: Iterable[tuple[str, type]] = ()) -> None:
    """Put the schema in Hydra's ConfigStore, with each experiment's arguments schema as
    ``experiment_args/<name>`` (called by the CLI and the API before composing, never on import)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="rodeco_schema", node=RodecoConfig)
    for name, schema in experiment_schemas:
        cs.store(group="experiment_args", name=name, node=schema)


def validate(cfg: DictConfig) -> None:
    """Checks the schema cannot express; each error names the key and the fix."""
    n = cfg.n
    if not (n in ("auto", "policy", "calibrated") or (isinstance(n, int) and not isinstance(n, bool) and n >= 1)):
        raise ConfigError(
            "n",
            n,
            "must be a positive integer, 'auto' or 'policy'",
            "set n=16, say, or n=auto (n=policy with a policy that chooses its start, policy=calibrated)",
        )
    s = cfg.sampling
    if not (s.temperature >= 0 and math.isfinite(s.temperature)):
        raise ConfigError("sampling.temperature", s.temperature, "must be >= 0", "use 1.0 (the paper), or 0 for greedy")
    if s.top_k < 0:
        raise ConfigError("sampling.top_k", s.top_k, "must be >= 0", "use 50 (the paper), or 0 to disable")
    if not 0 < s.top_p <= 1:
        raise ConfigError("sampling.top_p", s.top_p, "must be in (0, 1]", "use 1.0 to disable nucleus sampling")
    if s.max_new_tokens < 1:
        raise ConfigError("sampling.max_new_tokens", s.max_new_tokens, "must be >= 1", "use e.g. 128")
    if cfg.data.batch_prompts < 1:
        raise ConfigError("data.batch_prompts", cfg.data.batch_prompts, "must be >= 1", "use e.g. 4")
    check_compile(cfg.generator.get("compile", "auto"))
    check_budget_mode(cfg.budget)
    winner_rule(cfg)


def winner_rule(cfg: DictConfig) -> WinnerRule:
    """The ``winner`` node as a rule (checked: its rule, extractor and pattern)."""
    return WinnerRule(**node_dict(cfg.winner))


def check_budget_mode(b: DictConfig) -> None:
    """A budget mode names where the budget comes from; only ``tokens`` reads ``budget.kv_tokens``."""
    if b.mode not in BUDGET_MODES:
        raise ConfigError(
            "budget.mode",
            b.mode,
            "unknown budget mode",
            "use one of " + "; ".join(f"{k} ({v})" for k, v in BUDGET_MODES.items()),
        )
    if b.mode == "tokens" and b.kv_tokens is None:
        raise ConfigError(
            "budget.kv_tokens",
            None,
            "budget.mode=tokens needs a number of tokens",
            "set budget.kv_tokens=4096, say; or budget=unlimited (no limit), budget=cuda (free CUDA "
            "memory), budget=engine (vLLM's KV pool)",
        )
    if b.mode != "tokens" and b.kv_tokens is not None:
        raise ConfigError(
            "budget.kv_tokens",
            b.kv_tokens,
            f"budget.mode={b.mode} does not read it ({BUDGET_MODES[b.mode]})",
            "drop budget.kv_tokens, or use budget.mode=tokens (budget=cpu)",
        )


def split_node(node: Any, key: str) -> tuple[str, dict[str, Any]]:
    """A reward/policy node -> (registry name, parameters)."""
    params = node_dict(node) if isinstance(node, DictConfig) else dict(node)
    name = params.pop("name", None)
    if not name or not isinstance(name, str):
        raise ConfigError(
            f"{key}.name",
            name,
            "missing",
            f"pick one, e.g. {key}=logprob" if key == "reward" else f"pick one, e.g. {key}=fixed",
        )
    return name, params


def make_budget(cfg: DictConfig, gen: Generator, scale: float = 1.0, row_overhead: int = 0) -> Budget:
    """The run's budget in its ``budget.mode``: ``tokens`` (``budget.kv_tokens``), ``unlimited``, ``device`` (what
    the free memory of every CUDA device holding the generator's layers allows, each row charged ``row_overhead``
    tokens' worth of working memory: ``rodeco.common.working``) or ``engine`` (the engine's own KV pool). ``scale`` < 1
    shrinks it after an out-of-memory error (``Backoff``)."""
    b = cfg.budget
    check_budget_mode(b)
    if b.mode == "unlimited":
        return Budget(kv_tokens=None, min_tokens_per_round=b.min_tokens_per_round)
    if b.mode == "device":
        kv = device_budget(b, gen, scale)
        return Budget(kv_tokens=kv, min_tokens_per_round=b.min_tokens_per_round, row_overhead=row_overhead)
    kv = b.kv_tokens if b.mode == "tokens" else engine_pool(gen)
    pool = gen.info.kv_pool_tokens
    if pool is not None and kv > pool:
        log.warning(
            "budget.kv_tokens=%d exceeds vLLM's KV pool (%d tokens): vLLM will queue and may preempt rows "
            "(compute.preemptions counts them); use budget=engine to decide within the pool",
            kv,
            pool,
        )
    kv = max(1, int(kv * scale)) if scale < 1 else kv
    return Budget(kv_tokens=kv, min_tokens_per_round=b.min_tokens_per_round)


def engine_pool(gen: SessionMaker) -> int:
    if (pool := gen.info.kv_pool_tokens) is None:
        raise ConfigError(
            "budget.mode",
            "engine",
            f"the {gen.info.name} engine has no KV pool of its own",
            "use budget=engine with generator.engine=vllm; else budget=cpu (budget.kv_tokens) or "
            "budget=cuda (free CUDA memory)",
        )
    return int(pool)


def device_budget(b: DictConfig, gen: LanguageModel, scale: float) -> int:
    """``budget.mode=device``: the KV tokens the free memory of the CUDA devices holding the generator allows."""
    if not is_cuda(gen.device):
        raise ConfigError(
            "budget.mode",
            "device",
            f"the generator is on {gen.device}: there is no device memory to size the budget from",
            "use budget=cpu (budget.kv_tokens=N) or budget=unlimited",
        )
    import torch

    from rodeco.common.budget import budget_from_devices

    layers = cuda_layers(gen.device, gen.layer_devices())
    free = {d: torch.cuda.mem_get_info(torch.device(d))[0] for d in layers}
    kv = budget_from_devices(
        free, layers, gen.kv_bytes_per_token, b.memory_fraction * scale, int(b.reserve_gib * 2**30)
    )
    log.info(
        "budget from free CUDA memory: %d KV tokens (%s GiB free)",
        kv,
        ", ".join(f"{d} {f / 2**30:.1f}" for d, f in free.items()),
    )
    return kv
