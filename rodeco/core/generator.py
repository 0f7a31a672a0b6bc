"""The generator of rodeco's own engines: a causal LM whose rows decode in a torch forward engine (the Llama engine
``fast``, or ``hf``; ``rodeco.engines``), one ``rodeco.core.session.TorchSession`` per batch. It implements
``rodeco.common.protocols.Generator``; vLLM's is ``rodeco.engines.vllm.VLLMGenerator``, a pool's
``rodeco.replays.pool_session.ReplayGenerator``."""

from __future__ import annotations

from typing import Any

import torch

from rodeco.common.hardware import is_cpu, is_cuda
from rodeco.common.protocols import EngineInfo
from rodeco.common.shape import KVSpec, ModelShape
from rodeco.common.state import SessionSpec
from rodeco.core.session import TorchSession
from rodeco.engines import Engine, HFModel, engine_class
from rodeco.engines.base import ModelGenerator
from rodeco.engines.compiled import CompiledStep, compile_setting
from rodeco.engines.llama import FastWeights

__all__ = ["ModelShape", "TorchGenerator"]


class TorchGenerator(ModelGenerator):
    """A causal LM ready to decode with rodeco's engines: tokenizer, chat template, EOS ids, sizes for the budget and
    FLOPs, and the engine ``generator.engine`` chose for it. ``compile``: ``generator.compile`` (``auto``, ``true``,
    ``false``); built directly, a generator runs eager unless asked."""

    def __init__(
        self,
        model: HFModel,
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
        self._compile_value = compile
        self._compile: bool | None = None  # resolved when first asked (``compile``)
        # built when first needed and shared by every engine the generator opens: the compiled step and the engine's
        # prepared weights (its ``prepare``)
        self._compiled: CompiledStep | None = None
        self._prepared: FastWeights | None = None
        self._info: EngineInfo | None = None

    def memory_report(self) -> dict[str, Any] | None:
        """Nothing to say: the engine's cache lives in torch's memory, counted by the budget."""
        return None

    def engine_class(self) -> type[Engine]:
        """The engine ``generator.engine`` selects for this model (``auto``: fast when it can run the model)."""
        return engine_class(self.engine_kind, self.model)

    @property
    def kv(self) -> KVSpec:
        """In the engine's blocks (the Llama engine's blocks of 16, ``hf`` token by token); a prompt's cache stored once
        for all its rows on the Llama engine, copied on ``hf``."""
        cls = self.engine_class()
        return KVSpec(shares_prefix=bool(cls.shares_prefix), block=cls.block, aligned=bool(cls.aligned))

    def _weights(self) -> FastWeights | None:
        """The engine's prepared weights (fused, prepacked; MKL's packing for the compiled step on an Intel CPU in
        fp32), built once and reused by every engine, so the model's weights are read once; None for an engine that
        prepares none."""
        if self._prepared is None:
            self._prepared = self.engine_class().prepare(self.model, self.compile and CompiledStep.uses_mkl(self.model))
        return self._prepared

    def _step(self) -> CompiledStep | None:
        """The compiled step (``generator.compile``), built once and shared by every session; None when eager."""
        if self.compile and self._compiled is None:
            weights = self._weights()
            assert weights is not None  # compile_setting allows compile only on an engine that prepares weights
            self._compiled = CompiledStep.of(self.model, weights)
        return self._compiled

    def new_engine(self, pool_tokens: int | None = None) -> Engine:
        """An engine for one session, on the weights and compiled step every session shares; ``pool_tokens``: its
        cache's fixed pool (the session's budget), None: it grows."""
        return self.engine_class()(self.model, weights=self._weights(), compiled=self._step(), pool_tokens=pool_tokens)

    @property
    def info(self) -> EngineInfo:
        """What this generator's engine does (``rodeco.common.protocols.EngineInfo``), declared when first asked."""
        if self._info is None:
            cls, weights, step = self.engine_class(), self._weights(), self._step()
            self._info = EngineInfo(
                name=cls.name,
                compiled=step is not None,
                # the torch path gathers each row's blocks; rodeco's paged kernel reads them in place
                gathers_prompt=weights is not None and not CompiledStep.uses_kernel(self.model),
                linear=weights.linear if weights is not None else "torch",
                draws_on_device=not is_cpu(self.device),
                counts_finished_late=is_cuda(self.device),
            )
        return self._info

    @property
    def compile(self) -> bool:
        """Whether sessions run the compiled step (``generator.compile`` resolved for this device and engine; checked
        when first asked, so a bad engine name is reported by the first decode, as without it)."""
        if self._compile is None:
            self._compile = compile_setting(self._compile_value, self.device, self.engine_class())
        return self._compile

    @property
    def compiled(self) -> CompiledStep | None:
        """The compiled step (``generator.compile``) once a session has built it: its ``compiles`` and
        ``compile_seconds``."""
        return self._compiled

    def open_session(self, spec: SessionSpec) -> TorchSession:
        return TorchSession(self, spec, self.new_engine(spec.kv_tokens))
