"""What every generator built from a model shares, whichever engine decodes its rows: the tokenizer and chat
template, the EOS and pad ids, the model's sizes (FLOPs, KV bytes). ``rodeco.core.generator.TorchGenerator`` (rodeco's
engines) and ``rodeco.engines.vllm.VLLMGenerator`` build on it; both implement ``rodeco.common.protocols.Generator``."""

from __future__ import annotations

from typing import Any

import torch

from rodeco.common.shape import ModelShape
from rodeco.engines import HFModel


def chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """The token ids of ``messages`` through ``tokenizer``'s chat template, the assistant's turn opened after them
    (``apply_chat_template`` returns the ids, or a ``BatchEncoding`` holding them, as transformers' version has it)."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return [int(i) for i in (ids if isinstance(ids, list) else ids["input_ids"])]


class ModelGenerator:
    """What the model is (``rodeco.common.protocols.LanguageModel``): its text side, sizes and cost. ``model`` may be on
    the meta device (vLLM holds the weights)."""

    def __init__(
        self,
        model: HFModel,
        tokenizer: Any,
        *,
        chat_template: bool = True,
        system_prompt: str | None = None,
        name: str = "",
    ) -> None:
        self.model, self.tokenizer, self.name = model.eval(), tokenizer, name
        self.use_chat_template = chat_template and getattr(tokenizer, "chat_template", None) is not None
        self.system_prompt = system_prompt
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

    def flops_per_token(self, context: int) -> float:
        return self.shape.flops_per_token(context)

    def encode(self, prompt: str | list[dict[str, str]]) -> list[int]:
        """A prompt's token ids: a text as one user message, or a conversation's messages (``role``/``content``),
        through the chat template (``generator.system_prompt`` first unless the conversation has a system message).
        Without a template, a text is tokenized as it is and a conversation as its contents, one per line."""
        msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
        if self.use_chat_template:
            if self.system_prompt and not any(m["role"] == "system" for m in msgs):
                msgs.insert(0, {"role": "system", "content": self.system_prompt})
            return chat_ids(self.tokenizer, msgs)
        text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in msgs)
        return [int(i) for i in self.tokenizer(text)["input_ids"]]

    def decode_text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

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
