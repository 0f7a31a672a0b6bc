"""Per-token log-probabilities of a response under a causal LM other than the generator (``logprob``'s
``reward.model``). The response is re-tokenized from its text with the scoring LM's tokenizer; the prompt is wrapped
in that LM's chat template when it has one (``reward.chat_template``). The EOS token is not scored, as in the
generator's own log-probs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from rodeco_rewards.batching import token_batches

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class LMScorer:
    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer,
        *,
        chat_template: bool = True,
        batch_tokens: int = 16384,
        max_batch_size: int | None = 64,
        name: str = "",
    ) -> None:
        self.model, self.tokenizer = model.eval(), tokenizer
        self.name = name  # the model's source, as the config named it: what a reward's identity says it scores with
        self.use_chat = chat_template and getattr(tokenizer, "chat_template", None) is not None
        self.batch_tokens, self.max_batch_size = batch_tokens, max_batch_size
        self.device = next(model.parameters()).device
        self.n_params = sum(p.numel() for p in model.parameters())
        emb, out = model.get_input_embeddings().weight, model.get_output_embeddings()
        assert isinstance(emb, torch.Tensor)  # a parameter, never a submodule
        tied = out is not None and out.weight.data_ptr() == emb.data_ptr()
        self.n_matmul_params = self.n_params if tied else self.n_params - emb.numel()  # as Generator counts them
        self.tokens = 0

    def prompt_ids(self, prompt: str) -> list[int]:
        if self.use_chat:
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
            return [int(i) for i in self.tokenizer(text, add_special_tokens=False)["input_ids"]]
        return [int(i) for i in self.tokenizer(prompt)["input_ids"]]

    def _start_id(self) -> int:
        t = self.tokenizer
        return int(next(i for i in (t.bos_token_id, t.eos_token_id, 0) if i is not None))

    def response_ids(self, response: str) -> list[int]:
        return [int(i) for i in self.tokenizer(response, add_special_tokens=False)["input_ids"]]

    def logprobs(self, prompts: Sequence[str], responses: Sequence[str]) -> list[list[float]]:
        """For each pair, log p(response token t | prompt, response tokens < t) for every response token."""
        cache: dict[str, list[int]] = {}
        pairs = []
        for p, r in zip(prompts, responses):
            if p not in cache:
                cache[p] = self.prompt_ids(p) or [self._start_id()]  # the first response token needs a context
            pairs.append((cache[p], self.response_ids(r)))
        return self.logprobs_ids(pairs)

    @torch.inference_mode()
    def logprobs_ids(self, pairs: Sequence[tuple[list[int], list[int]]]) -> list[list[float]]:
        """The same from token ids: (prompt ids, response ids) per row; right-padded, length-sorted batches."""
        seqs = [list(p) + list(r) for p, r in pairs]
        n_resp = [len(r) for _, r in pairs]
        out: list[list[float]] = [[] for _ in seqs]
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        for batch in token_batches([len(s) for s in seqs], self.batch_tokens, self.max_batch_size):
            L = max(len(seqs[i]) for i in batch)
            x = torch.full((len(batch), L), int(pad), dtype=torch.long)
            mask = torch.zeros((len(batch), L), dtype=torch.long)
            for row, i in enumerate(batch):  # right padding keeps positions 0..len-1
                x[row, : len(seqs[i])] = torch.tensor(seqs[i])
                mask[row, : len(seqs[i])] = 1
            logits = self.model(input_ids=x.to(self.device), attention_mask=mask.to(self.device)).logits.float()
            lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, x[:, 1:, None].to(self.device))[..., 0]  # [b, L-1]
            for row, i in enumerate(batch):
                n, k = len(seqs[i]), n_resp[i]
                out[i] = lp[row, n - 1 - k : n - 1].tolist() if k else []
            self.tokens += int(mask.sum())
        return out
