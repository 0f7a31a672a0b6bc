"""Recording a pool (``rodeco.replays.pool``) with the live model: each prompt's candidates, decoded once with the same
random streams as a live run (``record_prompt``), what they depend on (``pool_settings``), and the decode step
times the time model of replayed runs is fitted to (``measure_step_costs``)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from rodeco.common.protocols import Generator
from rodeco.common.state import OpenPrompt, PromptRef, SessionSpec
from rodeco.common.validation import ConfigError
from rodeco.core.data import Prompt
from rodeco.core.rounds import LoopSettings, open_prompt, session_spec
from rodeco.replays.pool import Pool, PoolCandidate, PoolPrompt, rounded_top, top_k_of

# ModelShape fields a pool's settings leave out: pools recorded before they existed must still extend
UNRECORDED_SHAPE = ("vocab_size", "hidden_size")


def pool_settings(
    gen: Generator, s: LoopSettings, candidates: int, generator_cfg: dict[str, Any], top_logprobs: int = 0
) -> dict[str, Any]:
    """What a pool's candidates depend on; replaying needs the same, extending the pool too. ``top_logprobs``: the
    k most likely tokens' log-probs recorded at each position (left out at 0, as pools recorded before it)."""
    return {
        "candidates": candidates,
        "max_new_tokens": s.max_new_tokens,
        "seed": s.seed,
        "sampling": {"temperature": s.sampling.temperature, "top_k": s.sampling.top_k, "top_p": s.sampling.top_p},
        "generator": generator_cfg,
        "engine": gen.info.name,
        "shape": {k: v for k, v in gen.shape.to_dict().items() if k not in UNRECORDED_SHAPE},
        "dtype": str(gen.dtype),
        "eos_ids": gen.eos_ids,
        "pad_id": gen.pad_id,
        **({"kv_block": gen.kv.block} if gen.kv.block != 1 else {}),
        **({"top_logprobs": top_logprobs} if top_logprobs else {}),
    }  # pools of rodeco's engines: as before


def record_prompt(gen: Generator, pool: Pool, prompt: Prompt, s: LoopSettings) -> tuple[PoolPrompt, np.ndarray | None]:
    """Decode ``pool.candidates`` candidates of one prompt to the end, as Best-of-M with no budget would, with the
    same random streams as a live run (candidate ``i`` of prompt ``index``). Returns them with their costs, and the
    hidden states ``[M, max_new_tokens, hidden]`` (float16): ``[c, t]`` is the state that sampled candidate ``c``'s
    token ``t`` (what a ``needs_hidden_states`` reward gets at length ``t + 1``; zeros past the candidate's end), or
    None where the engine keeps them to itself (vLLM)."""
    ((rec, hidden),) = record_prompts(gen, pool, [prompt], s, hidden=gen.info.hidden)
    return rec, hidden


def record_prompts(
    gen: Generator, pool: Pool, prompts: list[Prompt], s: LoopSettings, hidden: bool = False
) -> list[tuple[PoolPrompt, np.ndarray | None]]:
    """``record_prompt`` of several prompts decoded together in one session (``pool.candidates`` rows each, the
    same random streams: each prompt's candidates are its own samples), so that the steps hold more rows; each
    prompt is charged its share of the prefill and the batch's steps (``PoolPrompt.batch_prompts``). ``hidden``:
    record the hidden states too (one prompt at a time only)."""
    if hidden and len(prompts) > 1:
        raise ConfigError(
            "experiment_args.batch_prompts",
            len(prompts),
            "hidden states are recorded one prompt at a time",
            "set experiment_args.batch_prompts=1, or experiment_args.hidden_states=false",
        )
    t0 = time.perf_counter()
    refs = [PromptRef(p.index, p.text, meta=p.meta) for p in prompts]
    sess = gen.open_session(
        session_spec(s, None, needs_logprobs=True, record_hidden=hidden, top_logprobs=top_k_of(pool.settings))
    )
    ids = [gen.encode(p.text) for p in prompts]
    sess.admit(ids, [open_prompt(s, r, pool.candidates) for r in refs])
    prefill_s = time.perf_counter() - t0
    rows = sess.decode(until=s.max_new_tokens) + sess.retire_finished()
    rows.sort(key=lambda r: (r.prompt, r.candidate_id))
    st = sess.stats
    states = None
    if sess.hidden_log:
        width = sess.hidden_log[0][2].shape[-1]
        states = np.zeros((pool.candidates, s.max_new_tokens, width), dtype=np.float16)
        for t, cand, h in sess.hidden_log:
            states[cand, t] = h.float().cpu().numpy()
    seconds, P = time.perf_counter() - t0, len(prompts)
    out = []
    for b, p in enumerate(prompts):
        mine = [r for r in rows if r.prompt == b]
        rec = PoolPrompt(
            index=p.index,
            text=p.text,
            prompt_ids=ids[b],
            prefill_seconds=prefill_s / P,
            candidates=[
                PoolCandidate(
                    r.token_ids, gen.decode_text(r.token_ids), r.logprobs or [], r.stop, rounded_top(r.top_logprobs)
                )
                for r in mine
            ],
            steps={"rows": list(st.step_rows), "context": list(st.step_context), "seconds": st.step_seconds},
            record_seconds=seconds / P,
            meta=dict(p.meta),
            batch_prompts=P,
        )
        out.append((rec, states))
    return out


def measure_step_costs(
    gen: Generator, prompt: Prompt, s: LoopSettings, max_rows: int, steps: int = 48
) -> dict[str, Any]:
    """Decode step times of the live engine at 1, 2, 4, ..., ``max_rows`` rows of one prompt (``steps`` steps each,
    EOS ignored so the batch stays full): what the time model of replayed runs is fitted to."""
    out: dict[str, Any] = {"rows": [], "context": [], "seconds": [], "prompt_index": prompt.index}
    ids = gen.encode(prompt.text)
    rows = [2**j for j in range(int(np.log2(max_rows)) + 1)]
    for r in rows:
        sess = gen.open_session(SessionSpec(ignore_eos=True))
        sess.admit([ids], [OpenPrompt(r, steps + 1, s.sampling, s.seed, prompt.index)])
        sess.decode(until=steps + 1)
        st = sess.stats
        out["rows"] += st.step_rows
        out["context"] += st.step_context
        out["seconds"] += st.step_seconds
    return out
