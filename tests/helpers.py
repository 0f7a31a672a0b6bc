"""Small helpers shared by the test modules."""

from __future__ import annotations

import torch

import rodeco


def run_tiny(gen, prompts, *, n=4, policy="fixed", overrides=(), **kw):
    """Decode with an in-memory generator; the embedded models are never loaded."""
    ov = ["output.all_candidates=true", "reward=logprob", *overrides]
    return rodeco.decode(prompts, generator=gen, n=n, policy=policy, overrides=ov, **kw)


def hf_greedy(model, gen, prompt: str, max_new_tokens: int) -> list[int]:
    """``model.generate()``'s greedy continuation of one prompt, without the EOS token and what follows."""
    ids = torch.tensor([gen.encode(prompt)])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
                         min_new_tokens=0, eos_token_id=gen.eos_ids, pad_token_id=gen.pad_id)
    new = out[0, ids.shape[1]:].tolist()
    for i, t in enumerate(new):
        if t in gen.eos_ids:
            return new[:i]
    return new


def hf_greedy_logits(gen, prompt: str, max_new_tokens: int) -> tuple[list[int], bool, torch.Tensor]:
    """``model.generate()``'s greedy continuation of one prompt on the generator's device: (the tokens without the
    EOS token, whether it ended with EOS, the logits each token was chosen from [steps, V] in float32)."""
    ids = torch.tensor([gen.encode(prompt)], device=gen.device)
    out = gen.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
                             min_new_tokens=0, eos_token_id=gen.eos_ids, pad_token_id=gen.pad_id, output_logits=True,
                             return_dict_in_generate=True)
    new = out.sequences[0, ids.shape[1]:].tolist()
    logits = torch.stack(out.logits)[:, 0].float().cpu()
    for i, t in enumerate(new):
        if t in gen.eos_ids:
            return new[:i], True, logits[: i + 1]
    return new, False, logits


def compare_survivors(bon, sr) -> tuple[int, int]:
    """(rejected candidates, candidates that break the promise) of a Speculative Rejection run against the Best-of-N
    run with the same seed: every finished candidate must be the Best-of-N sample with its id, every rejected one a
    prefix of it."""
    rejected = broken = 0
    for x, y in zip(bon.results, sr.results):
        full = {c.candidate_id: list(c.token_ids) for c in x.candidates}
        for c in y.candidates:
            ids = list(c.token_ids)
            rejected += not c.finished
            broken += (ids != full[c.candidate_id]) if c.finished else (full[c.candidate_id][: len(ids)] != ids)
    return rejected, broken
