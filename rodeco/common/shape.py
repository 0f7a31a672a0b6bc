"""What memory and FLOPs follow from: a causal LM's sizes (``ModelShape``) and how an engine stores its KV cache
(``KVSpec``). Plain arithmetic; nothing here imports torch (a model is read by duck typing)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


def kv_bytes_per_token(n_layers: int, n_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Bytes of one cached token: keys and values of every layer."""
    return 2 * n_layers * n_kv_heads * head_dim * dtype_bytes


@dataclass(frozen=True)
class KVSpec:
    """How an engine stores the KV cache, which every memory figure needs (``rodeco.common.budget``): in blocks of
    ``block`` tokens (1: token by token), whether a prompt's cache is stored once for all its rows
    (``shares_prefix``), and whether a prompt ends on a block boundary (``aligned``: the Llama engine pads its first
    block at the front, so its rows share all its blocks and their own tokens start in blocks of their own; else, as
    vLLM, a prompt's full blocks before its last token are shared and each row holds the rest). A generator has one
    (``Generator.kv``); a pool records the one it was recorded with. ``shares_prefix`` and ``block`` have no
    default."""

    shares_prefix: bool
    block: int
    aligned: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.block, int) or self.block < 1:
            from rodeco.common.validation import ConfigError

            raise ConfigError(
                "generator.kv_block",
                self.block,
                "must be a positive number of tokens",
                "use the engine's block size (vLLM: 16 on CUDA, 32 on CPU)",
            )


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a causal LM that its FLOPs, its KV cache's bytes and each row's working memory follow from."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_matmul_params: int  # parameters multiplied per token (the input embedding is a lookup)
    dtype_bytes: int
    max_context: int | None = None
    vocab_size: int | None = None  # None: a pool recorded before the working memory was counted
    hidden_size: int | None = None

    @classmethod
    def of(cls, model: Any) -> ModelShape:
        cfg = model.config
        n_heads = cfg.num_attention_heads
        n_all = sum(p.numel() for p in model.parameters())
        emb = model.get_input_embeddings().weight
        out = model.get_output_embeddings()
        # tied: one parameter (on the meta device, where data_ptr() is 0 for every tensor, identity is the test)
        tied = out is not None and (
            out.weight is emb or (emb.device.type != "meta" and out.weight.data_ptr() == emb.data_ptr())
        )
        return cls(
            n_layers=cfg.num_hidden_layers,
            n_heads=n_heads,
            n_kv_heads=getattr(cfg, "num_key_value_heads", None) or n_heads,
            head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads,
            n_matmul_params=n_all if tied else n_all - emb.numel(),
            dtype_bytes=next(model.parameters()).dtype.itemsize,
            max_context=getattr(cfg, "max_position_embeddings", None),
            vocab_size=int(emb.shape[0]),
            hidden_size=int(emb.shape[1]),
        )

    def flops_per_token(self, context: int) -> float:
        """Forward FLOPs of one token: 2 per matmul parameter plus attention over ``context`` cached tokens."""
        return 2.0 * self.n_matmul_params + 4.0 * self.n_layers * self.n_heads * self.head_dim * context

    @property
    def kv_bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.n_layers, self.n_kv_heads, self.head_dim, self.dtype_bytes)

    def to_dict(self) -> dict:
        return asdict(self)
