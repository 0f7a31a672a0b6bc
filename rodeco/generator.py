"""The generator: a causal LM with its tokenizer, chat template, EOS ids, and the sizes the budget and the FLOPs
count need. ``rodeco.session.Session`` decodes candidate rows with it."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

import torch

from rodeco.budget import kv_bytes_per_token
from rodeco.engines import Engine, engine_class

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a causal LM that its FLOPs and its KV cache's bytes follow from."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_matmul_params: int  # parameters multiplied per token (the input embedding is a lookup)
    dtype_bytes: int
    max_context: int | None = None

    @classmethod
    def of(cls, model: torch.nn.Module) -> ModelShape:
        cfg = model.config
        n_heads = cfg.num_attention_heads
        n_all = sum(p.numel() for p in model.parameters())
        emb = model.get_input_embeddings().weight
        out = model.get_output_embeddings()
        # tied: one parameter (on the meta device, where data_ptr() is 0 for every tensor, identity is the test)
        tied = out is not None and (out.weight is emb or (emb.device.type != "meta"
                                                           and out.weight.data_ptr() == emb.data_ptr()))
        return cls(n_layers=cfg.num_hidden_layers, n_heads=n_heads,
                   n_kv_heads=getattr(cfg, "num_key_value_heads", None) or n_heads,
                   head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads,
                   n_matmul_params=n_all if tied else n_all - emb.numel(),
                   dtype_bytes=next(model.parameters()).dtype.itemsize,
                   max_context=getattr(cfg, "max_position_embeddings", None))

    def flops_per_token(self, context: int) -> float:
        """Forward FLOPs of one token: 2 per matmul parameter plus attention over ``context`` cached tokens."""
        return 2.0 * self.n_matmul_params + 4.0 * self.n_layers * self.n_heads * self.head_dim * context

    @property
    def kv_bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.n_layers, self.n_kv_heads, self.head_dim, self.dtype_bytes)

    def to_dict(self) -> dict:
        return asdict(self)


class Generator:
    """A causal LM ready to decode: tokenizer, chat template, EOS ids, sizes for the budget and FLOPs."""

    kv_block = 1  # the engine allocates its cache in blocks of this many tokens (rodeco.budget)
    kv_pool_tokens: int | None = None  # the engine's own KV capacity, when it has one (vLLM's pool)
    session_factory = None  # what decodes the rows: None for rodeco.session.Session (vLLM: its own session)
    provides_hidden = True  # the engine can hand rewards the final-layer hidden states

    def __init__(self, model: torch.nn.Module, tokenizer, *, chat_template: bool = True,
                 system_prompt: str | None = None, engine: str = "auto", name: str = "") -> None:
        self.model, self.tokenizer, self.name = model.eval(), tokenizer, name
        self.use_chat_template = chat_template and getattr(tokenizer, "chat_template", None) is not None
        self.system_prompt = system_prompt
        self.engine_kind = engine
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        eos = getattr(model.generation_config, "eos_token_id", None)
        eos = eos if isinstance(eos, list) else [eos]
        self.eos_ids = sorted({int(e) for e in [*eos, tokenizer.eos_token_id] if e is not None})
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.eos_ids[0])
        self.shape = ModelShape.of(model)
        self.max_context = self.shape.max_context
        self.kv_bytes_per_token = self.shape.kv_bytes_per_token
        self.eos_tensor = torch.tensor(self.eos_ids, device=self.device)

    def flops_per_token(self, context: int) -> float:
        return self.shape.flops_per_token(context)

    def layer_devices(self) -> dict[str, int]:
        """How many decoder layers each device holds (one device, unless ``generator.device_map`` spread them)."""
        n = self.shape.n_layers
        stack = next((m for m in self.model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == n), None)
        if stack is None:
            return {str(self.device): n}
        out: dict[str, int] = {}
        for layer in stack:
            dev = str(next(layer.parameters(), torch.empty(0, device=self.device)).device)
            out[dev] = out.get(dev, 0) + 1
        return out

    def encode(self, prompt: str) -> list[int]:
        if self.use_chat_template:
            msgs = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else [])
            msgs.append({"role": "user", "content": prompt})
            ids = self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if not isinstance(ids, list) else ids
            return [int(i) for i in ids]
        return [int(i) for i in self.tokenizer(prompt)["input_ids"]]

    def decode_text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def engine_class(self) -> type:
        """The engine ``generator.engine`` selects for this model (``auto``: fast when it can run the model)."""
        return engine_class(self.engine_kind, self.model)

    @property
    def engine_name(self) -> str:
        """The engine's name, as a pool records it (``rodeco.engines.layout.LAYOUTS`` replays its memory)."""
        return self.engine_class().__name__

    @property
    def shares_prefix(self) -> bool:
        """Whether a prompt's KV cache is stored once for all its rows (the budget then counts it once)."""
        return bool(self.engine_class().shares_prefix)

    def new_engine(self) -> Engine:
        return self.engine_class()(self.model)
