"""The generator of rodeco's own engines: a causal LM whose rows decode in a torch forward engine (``fast`` or
``hf``, ``rodeco.engines``), one ``rodeco.session.TorchSession`` per batch. It implements
``rodeco.protocols.Generator``; vLLM's is ``rodeco.engines.vllm.VLLMGenerator``, a pool's
``rodeco.replay.ReplayGenerator``."""

from __future__ import annotations

from typing import Any

import torch

from rodeco.engines import Engine, engine_class
from rodeco.engines.base import ModelGenerator
from rodeco.engines.compiled import CompiledStep, compile_setting
from rodeco.session import TorchSession
from rodeco.shape import KVSpec, ModelShape
from rodeco.state import SessionSpec

__all__ = ["ModelShape", "TorchGenerator"]


class TorchGenerator(ModelGenerator):
    """A causal LM ready to decode with rodeco's engines: tokenizer, chat template, EOS ids, sizes for the budget and
    FLOPs, and the engine ``generator.engine`` chose for it. ``compile``: ``generator.compile`` (``auto``, ``true``,
    ``false``); built directly, a generator runs eager unless asked."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        chat_template: bool = True,
        system_prompt: str | None = None,
        engine: str = "auto",
        name: str = "",
        compile: bool | str = False,
    ) -> None:
        super().__init__(model, tokenizer, chat_template=chat_template, system_prompt=system_prompt, name=name)
        self.engine_kind = engine
        self.eos_tensor = torch.tensor(self.eos_ids, device=self.device)
        self._compile_value, self._compile = compile, None
        self._compiled: CompiledStep | None = None  # built on the first session that needs it, shared by the rest
        self._prepared: Any = None  # the engine's prepared weights (FastLlamaEngine.prepare), built once likewise

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

    def engine_class(self) -> type:
        """The engine ``generator.engine`` selects for this model (``auto``: fast when it can run the model)."""
        return engine_class(self.engine_kind, self.model)

    @property
    def engine_name(self) -> str:
        """The engine's name, as a pool records it (``rodeco.engines.layout.LAYOUTS`` replays its memory)."""
        return self.engine_class().__name__

    @property
    def kv(self) -> KVSpec:
        """Token by token; a prompt's cache stored once for all its rows on the fast engine, copied on ``hf``."""
        return KVSpec(shares_prefix=bool(self.engine_class().shares_prefix), block=1)

    def new_engine(self) -> Engine:
        """An engine for one session; what it prepares from the weights (fused, prepacked, compiled) is built for the
        first session and reused by the rest, so the model's weights are read once, then."""
        cls, kw = self.engine_class(), {}
        prepare = getattr(cls, "prepare", None)
        if prepare is not None:
            if self._prepared is None:  # the compiled step's linears on an Intel CPU in fp32: MKL's packed GEMM
                self._prepared = (
                    prepare(self.model, mkl=True)
                    if self.compile and CompiledStep.uses_mkl(self.model)
                    else prepare(self.model)
                )
            kw["weights"] = self._prepared
        if self.compile:
            self._compiled = self._compiled or CompiledStep.of(self.model, self._prepared)
            kw["compiled"] = self._compiled
        return cls(self.model, **kw)

    @property
    def compile(self) -> bool:
        """Whether sessions run the compiled step (``generator.compile`` resolved for this device and engine; checked
        when first asked, so a bad engine name is reported by the first decode, as without it)."""
        if self._compile is None:
            self._compile = compile_setting(self._compile_value, self.device, self.engine_class())
        return self._compile

    @property
    def gathers_prompt(self) -> bool:
        """Whether sessions' compiled step may gather each row's prompt keys and values (``prompt_gather`` in
        ``rodeco.working``): with inductor's attention, not with rodeco's kernel, which reads them in place."""
        return self.compile and not CompiledStep.uses_kernel(self.model)

    @property
    def compiled(self) -> CompiledStep | None:
        """The compiled step (``generator.compile``) once a session has built it: its ``compiles`` and
        ``compile_seconds``."""
        return self._compiled

    def open_session(self, spec: SessionSpec) -> TorchSession:
        return TorchSession(self, spec, self.new_engine())
