"""How ``preference_rm`` turns (prompt, response) text into the reward model's own token ids.

- The RM's tokenizer has a chat template (``chat_template: auto`` or ``true``): the conversation
  ``[user: prompt, assistant: response]`` is rendered with it and the text tokenized without adding special tokens
  again (the template already holds BOS and the turn markers). A partial response is rendered exactly like a
  finished one (with its end-of-turn marker), the choice of Sun et al. (2024).
- Otherwise (``chat_template: false``, or ``auto`` with no template): ``template``, a format string with
  ``{prompt}`` and ``{response}`` (default ``FALLBACK_TEMPLATE``, the Anthropic HH format), tokenized with the
  tokenizer's special tokens; or ``template: pair``, which encodes (prompt, response) as a sentence pair, as
  BERT/DeBERTa cross-encoder RMs (e.g. OpenAssistant's) expect.

Token ids always come from the text, so the RM's tokenizer need not match the generator's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from rodeco import ConfigError

log = logging.getLogger(__name__)

FALLBACK_TEMPLATE = "\n\nHuman: {prompt}\n\nAssistant: {response}"
PAIR = "pair"


@dataclass(frozen=True)
class RMFormat:
    use_chat_template: bool
    template: str  # a format string, or "pair"
    max_length: int
    truncation_side: str = "right"


def make_format(
    tokenizer,
    chat_template: bool | str,
    template: str | None,
    max_length: int | None,
    truncation_side: str,
    model_max: int | None,
) -> RMFormat:
    """Check the options against the tokenizer; every error names its ``reward.*`` key."""
    has_template = getattr(tokenizer, "chat_template", None) is not None
    if chat_template not in (True, False, "auto"):
        raise ConfigError(
            "reward.chat_template",
            chat_template,
            "must be auto, true or false",
            "use auto (the RM's template when it has one)",
        )
    if chat_template is True and not has_template:
        raise ConfigError(
            "reward.chat_template",
            True,
            "the reward model's tokenizer has no chat template",
            f"use reward.chat_template=auto (falls back to reward.template={FALLBACK_TEMPLATE!r})",
        )
    tmpl = FALLBACK_TEMPLATE if template is None else template
    if tmpl != PAIR:
        if not isinstance(tmpl, str) or "{response}" not in tmpl:
            raise ConfigError(
                "reward.template",
                tmpl,
                "must be 'pair' or a format string with {response}",
                f"use e.g. {FALLBACK_TEMPLATE!r}",
            )
        try:
            tmpl.format(prompt="", response="")
        except (KeyError, IndexError, ValueError) as e:
            raise ConfigError(
                "reward.template",
                tmpl,
                f"not a valid format string ({e!r})",
                "use only the fields {prompt} and {response}; write literal braces as {{ }}",
            ) from None
    if truncation_side not in ("left", "right"):
        raise ConfigError(
            "reward.truncation_side",
            truncation_side,
            "must be left or right",
            "use right (drop the end of over-long inputs) or left (drop the start)",
        )
    if max_length is None:
        limits = [x for x in (getattr(tokenizer, "model_max_length", None), model_max) if x and x < 1_000_000]
        max_length = min(limits) if limits else 4096
    if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 8:
        raise ConfigError("reward.max_length", max_length, "must be an integer >= 8", "use e.g. 4096, or null")
    use_chat = has_template and chat_template in (True, "auto")
    return RMFormat(
        use_chat_template=use_chat, template=tmpl, max_length=int(max_length), truncation_side=truncation_side
    )


def encode(tokenizer, fmt: RMFormat, prompt: str, response: str) -> list[int]:
    """The RM's token ids for one (prompt, response), truncated to ``fmt.max_length``."""
    if fmt.use_chat_template:
        msgs = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
        text = tokenizer.apply_chat_template(msgs, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    elif fmt.template == PAIR:
        ids = tokenizer(prompt, response)["input_ids"]
    else:
        ids = tokenizer(fmt.template.format(prompt=prompt, response=response))["input_ids"]
    ids = [int(i) for i in ids]
    if len(ids) > fmt.max_length:
        log.debug("reward input of %d tokens truncated to reward.max_length=%d", len(ids), fmt.max_length)
        ids = ids[: fmt.max_length] if fmt.truncation_side == "right" else ids[-fmt.max_length :]
    return ids
