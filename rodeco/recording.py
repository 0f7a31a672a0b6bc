"""Recording a pool (``rodeco.pool``) with the live model: each prompt's candidates, decoded once with the same
random streams as a live run (``record_prompt``), what they depend on (``pool_settings``), and the decode step
times the time model of replayed runs is fitted to (``measure_step_costs``)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from rodeco.data import Prompt
from rodeco.loop import LoopSettings, session_spec
from rodeco.pool import Pool, PoolCandidate, PoolPrompt
from rodeco.protocols import Generator
from rodeco.state import PromptRef, SessionSpec

# ModelShape fields a pool's settings leave out: pools recorded before they existed must still extend
UNRECORDED_SHAPE = ("vocab_size", "hidden_size")


def pool_settings(gen: Generator, s: LoopSettings, candidates: int, generator_cfg: dict[str, Any]) -> dict[str, Any]:
    """What a pool's candidates depend on; replaying needs the same, extending the pool too."""
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
    }  # pools of rodeco's engines: as before


def record_prompt(gen: Generator, pool: Pool, prompt: Prompt, s: LoopSettings) -> tuple[PoolPrompt, np.ndarray | None]:
    """Decode ``pool.candidates`` candidates of one prompt to the end, as Best-of-M with no budget would, with the
    same random streams as a live run (candidate ``i`` of prompt ``index``). Returns them with their costs, and the
    hidden states ``[M, max_new_tokens, hidden]`` (float16): ``[c, t]`` is the state that sampled candidate ``c``'s
    token ``t`` (what a ``needs_hidden_states`` reward gets at length ``t + 1``; zeros past the candidate's end), or
    None where the engine keeps them to itself (vLLM)."""
    t0 = time.perf_counter()
    sess = gen.open_session(
        session_spec(
            s,
            pool.candidates,
            [PromptRef(prompt.index, prompt.text)],
            needs_logprobs=True,
            record_hidden=gen.provides_hidden,
        )
    )
    ids = gen.encode(prompt.text)
    sess.prefill([ids])
    prefill_s = time.perf_counter() - t0
    rows = sess.decode(until=s.max_new_tokens) + sess.retire_finished()
    rows.sort(key=lambda r: r.candidate_id)
    st = sess.stats
    hidden = None
    if sess.hidden_log:
        width = sess.hidden_log[0][2].shape[-1]
        hidden = np.zeros((pool.candidates, s.max_new_tokens, width), dtype=np.float16)
        for t, cand, h in sess.hidden_log:
            hidden[cand, t] = h.float().cpu().numpy()
    return PoolPrompt(
        index=prompt.index,
        text=prompt.text,
        prompt_ids=ids,
        prefill_seconds=prefill_s,
        candidates=[PoolCandidate(r.token_ids, gen.decode_text(r.token_ids), r.logprobs or [], r.stop) for r in rows],
        steps={"rows": list(st.step_rows), "context": list(st.step_context), "seconds": st.step_seconds},
        record_seconds=time.perf_counter() - t0,
    ), hidden


def measure_step_costs(
    gen: Generator, prompt: Prompt, s: LoopSettings, max_rows: int, steps: int = 48
) -> dict[str, Any]:
    """Decode step times of the live engine at 1, 2, 4, ..., ``max_rows`` rows of one prompt (``steps`` steps each,
    EOS ignored so the batch stays full): what the time model of replayed runs is fitted to."""
    out: dict[str, Any] = {"rows": [], "context": [], "seconds": [], "prompt_index": prompt.index}
    ids = gen.encode(prompt.text)
    rows = [2**j for j in range(int(np.log2(max_rows)) + 1)]
    for r in rows:
        sess = gen.open_session(SessionSpec(r, s.sampling, steps + 1, s.seed, (prompt.index,), ignore_eos=True))
        sess.prefill([ids])
        sess.decode(until=steps + 1)
        st = sess.stats
        out["rows"] += st.step_rows
        out["context"] += st.step_context
        out["seconds"] += st.step_seconds
    return out
