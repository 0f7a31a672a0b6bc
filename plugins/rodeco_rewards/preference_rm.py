"""``preference_rm``: any ``AutoModelForSequenceClassification`` reward model, by hub name or local directory.

Examples: ``reward=preference_rm reward.model=Skywork/Skywork-Reward-Llama-3.1-8B-v0.2`` (chat template),
``reward.model=sfairXC/FsfairX-LLaMA3-RM-v0.1``, ``reward.model=weqweasdas/RM-Mistral-7B``; ArmoRM-style custom
heads need ``reward.trust_remote_code=true`` (an explicit opt-in: it runs the repository's code). Inputs are
formatted as ``rodeco_rewards.rm_format`` describes, sorted by length and batched under ``reward.batch_tokens``
padded tokens; right padding and attention masks make each score independent of its batch neighbours.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Optional, Union

import torch

from rodeco import BuildContext, ConfigError, RewardCost, ScoreRequest, check_positive_int, resolve_device, take_params
from rodeco_rewards.batching import token_batches
from rodeco_rewards.rm_format import RMFormat, encode, make_format

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)


@dataclass
class PreferenceRMParams:
    model: Optional[str] = field(default=None, metadata={"help": "hub name or local directory of the reward model"})
    dtype: str = field(default="auto", metadata={"help": "auto: bf16 on CUDA, fp32 on CPU"})
    device: str = field(default="auto", metadata={"help": "auto: the generator's device"})
    device_map: Optional[Union[str, dict[str, Any]]] = field(
        default=None, metadata={"help": "e.g. auto to shard a large RM over several GPUs"}
    )
    trust_remote_code: bool = field(default=False, metadata={"help": "run the model repository's own code (ArmoRM)"})
    chat_template: Union[bool, Literal["auto"]] = field(
        default="auto",
        metadata={"help": "auto: the RM's own chat template when its tokenizer has one, else `template`"},
    )
    template: Optional[str] = field(
        default=None,
        metadata={
            "help": 'null: "\\n\\nHuman: {prompt}\\n\\nAssistant: {response}"; or "pair" (sentence-pair encoding)'
        },
    )
    max_length: Optional[int] = field(default=None, metadata={"help": "null: the RM's own limit"})
    truncation_side: Literal["right", "left"] = "right"
    batch_tokens: int = field(default=16384, metadata={"help": "padded tokens per forward pass"})
    max_batch_size: int = 64
    label: Optional[int] = field(
        default=None, metadata={"help": "which logit is the reward when the model has several"}
    )


def reward_device(device: str, ctx: BuildContext, key: str = "reward.device") -> torch.device:
    """``auto``: the generator's device when one is loaded, else CUDA when available, else CPU."""
    if device == "auto" and ctx.generator is not None:
        return torch.device(ctx.generator.device)
    return resolve_device(device, key)


def resolve_dtype(dtype: str, device: torch.device, key: str = "reward.dtype") -> torch.dtype:
    from rodeco import resolve_dtype as _resolve

    return _resolve(dtype, device, key=key)


def locate_model(model: Any, key: str = "reward.model") -> str:
    """A local directory (checked) or a hub name (left to ``from_pretrained``)."""
    if not model or not isinstance(model, str):
        raise ConfigError(
            key,
            model,
            "missing",
            "give a hub name (e.g. Skywork/Skywork-Reward-Llama-3.1-8B-v0.2) or a local directory with config.json",
        )
    if model.startswith(("/", "./", "../", "~")) or os.path.exists(model):
        path = Path(model).expanduser()
        if not (path / "config.json").is_file():
            raise ConfigError(
                key,
                model,
                "no config.json in that directory",
                "give a directory saved with save_pretrained(), or a hub name",
            )
        return str(path)
    return model


class PreferenceRM:
    """Scores text with a sequence classifier: the logit of ``label`` (the only one for a 1-logit RM)."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer,
        fmt: RMFormat,
        *,
        batch_tokens: int = 16384,
        max_batch_size: int | None = 64,
        label: int | None = None,
        name: str = "",
    ) -> None:
        self.model, self.tokenizer, self.fmt, self.name = model.eval(), tokenizer, fmt, name
        self.batch_tokens, self.max_batch_size = batch_tokens, max_batch_size
        check_positive_int("reward.batch_tokens", batch_tokens, 16384)
        check_positive_int("reward.max_batch_size", max_batch_size, 64, allow_none=True)
        n_labels = int(getattr(model.config, "num_labels", 1) or 1)
        if label is None and n_labels > 1 and not _has_custom_score(model):
            raise ConfigError(
                "reward.label",
                None,
                f"the model has {n_labels} output logits",
                f"pick the one that is the reward: reward.label=0..{n_labels - 1}",
            )
        if label is not None and not (isinstance(label, int) and 0 <= label < n_labels):
            raise ConfigError("reward.label", label, f"must be an integer in [0, {n_labels})", "use 0")
        self.label = label or 0
        self.pad_id = _pad_id(model, tokenizer)
        self.device = next(model.parameters()).device
        self.n_params = sum(p.numel() for p in model.parameters())
        self.n_matmul_params = self.n_params - _embedding_params(model)  # the lookup is no matmul
        self.cost = RewardCost()

    def token_ids(self, requests: Sequence[ScoreRequest]) -> list[list[int]]:
        return [encode(self.tokenizer, self.fmt, r.prompt, r.response) for r in requests]

    @torch.inference_mode()
    def score(self, requests: Sequence[ScoreRequest]) -> list[float]:
        ids = self.token_ids(requests)
        out = [0.0] * len(ids)
        for batch in token_batches([len(x) for x in ids], self.batch_tokens, self.max_batch_size):
            L = max(len(ids[i]) for i in batch)
            x = torch.full((len(batch), L), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(batch), L), dtype=torch.long)
            for row, i in enumerate(batch):  # right padding: positions stay 0..len-1 for every row
                x[row, : len(ids[i])] = torch.tensor(ids[i])
                mask[row, : len(ids[i])] = 1
            res = self.model(input_ids=x.to(self.device), attention_mask=mask.to(self.device))
            vals = _reward_column(res, self.label)
            for row, i in enumerate(batch):
                out[i] = float(vals[row])
            n_tok = int(mask.sum())
            self.cost.tokens += n_tok
            self.cost.flops += 2.0 * self.n_matmul_params * n_tok
        self.cost.calls += 1
        return out


def _embedding_params(model: PreTrainedModel) -> int:
    try:
        weight = model.get_input_embeddings().weight
        assert isinstance(weight, torch.Tensor)  # a parameter, never a submodule
        return weight.numel()
    except (AttributeError, NotImplementedError):  # custom code without the accessor: count every parameter
        return 0


def _has_custom_score(model: PreTrainedModel) -> bool:
    return type(model).__module__.startswith("transformers_modules")  # remote code (ArmoRM and the like)


def _reward_column(res: Any, label: int) -> torch.Tensor:
    """``[b]`` rewards from a model output: a custom ``score`` field (ArmoRM) or ``logits[:, label]``."""
    score = getattr(res, "score", None)
    t = score if isinstance(score, torch.Tensor) else res.logits
    t = t.float()
    return t[:, label] if t.dim() == 2 else t.reshape(-1)


def _pad_id(model: PreTrainedModel, tokenizer) -> int:
    """Padding id shared by tokenizer and model: the classifier finds each row's last token through it."""
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = getattr(model.config, "pad_token_id", None)
    if pad is None:
        eos = tokenizer.eos_token_id
        pad = eos[0] if isinstance(eos, list) else eos
        log.info("reward model tokenizer has no pad token: padding with EOS id %s", pad)
    if pad is None:
        raise ConfigError(
            "reward.model",
            getattr(model.config, "_name_or_path", "?"),
            "the reward model's tokenizer has neither a pad nor an EOS token",
            "save the tokenizer with a pad_token set",
        )
    model.config.pad_token_id = int(pad)
    return int(pad)


def build_preference_rm(params: dict[str, Any], ctx: BuildContext) -> PreferenceRM:
    p = take_params("reward", params, PreferenceRMParams)
    src = locate_model(p["model"])
    device = reward_device(str(p["device"]), ctx)
    dtype = resolve_dtype(str(p["dtype"]), device)
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    kw: dict[str, Any] = {"trust_remote_code": p["trust_remote_code"]}
    try:
        tok = AutoTokenizer.from_pretrained(src, **kw)
        mkw = dict(kw, dtype=dtype, **({"device_map": p["device_map"]} if p["device_map"] else {}))
        model = AutoModelForSequenceClassification.from_pretrained(src, **mkw)
    except OSError as e:
        raise ConfigError(
            "reward.model",
            p["model"],
            f"could not load it ({type(e).__name__}: {e})",
            "check the name; without internet use a local directory",
        ) from e
    except ValueError as e:
        if "trust_remote_code" in str(e):
            raise ConfigError(
                "reward.trust_remote_code",
                False,
                "this model ships its own code",
                "set reward.trust_remote_code=true if you trust the repository",
            ) from e
        raise ConfigError(
            "reward.model",
            p["model"],
            f"not a sequence classifier ({e})",
            "use a model that loads with AutoModelForSequenceClassification",
        ) from e
    if not p["device_map"]:
        model = model.to(device)
    fmt = make_format(
        tok,
        p["chat_template"],
        p["template"],
        p["max_length"],
        p["truncation_side"],
        getattr(model.config, "max_position_embeddings", None),
    )
    log.info(
        "preference_rm %s: %.0fM parameters, chat template %s",
        p["model"],
        sum(x.numel() for x in model.parameters()) / 1e6,
        "on" if fmt.use_chat_template else "off",
    )
    return PreferenceRM(
        model,
        tok,
        fmt,
        batch_tokens=p["batch_tokens"],
        max_batch_size=p["max_batch_size"],
        label=p["label"],
        name=str(p["model"]),
    )


build_preference_rm.needs_network = True  # type: ignore[attr-defined]  # its config option has no default model
