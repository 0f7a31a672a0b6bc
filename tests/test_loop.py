"""The decoding loop on a tiny random Llama: equivalence with generate(), pruning, prefill, budget, seeds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import TINY_SHAPE
from helpers import compare_survivors, hf_greedy, open_batch, run_tiny

from rodeco.common.sampling import SamplingParams

PROMPTS = ["write a haiku about autumn leaves", "give three tips", "explain why the sky is blue"]
GREEDY = ["sampling.temperature=0", "budget=unlimited"]


@pytest.mark.parametrize("engine", ["hf", "fast"])
def test_greedy_matches_generate(tiny_gen, tiny_model, engine):
    gen = tiny_gen(engine)
    out = run_tiny(gen, PROMPTS, n=2, policy="none", overrides=[*GREEDY, "sampling.max_new_tokens=24"])
    for prompt, r in zip(PROMPTS, out.results):
        ref = hf_greedy(tiny_model, gen, prompt, 24)
        assert len(ref) > 5
        assert r.best.token_ids == ref
        assert all(c.token_ids == ref for c in r.candidates)


@pytest.mark.parametrize("engine", ["hf", "fast"])
def test_batched_prompts_equal_one_at_a_time(tiny_gen, engine):
    gen = tiny_gen(engine)
    for ov in (GREEDY, ["budget=unlimited"]):  # greedy, and sampling (per-candidate random streams)
        together = run_tiny(gen, PROMPTS, n=3, policy="none", overrides=[*ov, "data.batch_prompts=3"], seed=5)
        alone = run_tiny(gen, PROMPTS, n=3, policy="none", overrides=[*ov, "data.batch_prompts=1"], seed=5)
        for a, b in zip(together.results, alone.results):
            assert [c.token_ids for c in a.candidates] == [c.token_ids for c in b.candidates]


def test_engines_agree_when_sampling(tiny_gen):
    """Same seed, same candidates on both engines. Their decision points differ (the fast engine stores the prompt
    once, so the same budget holds longer rows), so a candidate rejected by one is a prefix of the other's."""
    ov = ["budget.kv_tokens=1500", "sampling.max_new_tokens=60", "policy.alpha=0.5"]
    a = run_tiny(tiny_gen("hf"), PROMPTS[:2], n=16, overrides=ov, seed=1)
    b = run_tiny(tiny_gen("fast"), PROMPTS[:2], n=16, overrides=ov, seed=1)
    assert any(r.rounds for r in a.results) and any(r.rounds for r in b.results)
    for x, y in zip(a.results, b.results):
        ys = {c.candidate_id: c for c in y.candidates}
        assert sorted(ys) == sorted(c.candidate_id for c in x.candidates)
        for cx in x.candidates:
            cy = ys[cx.candidate_id]
            short, long_ = sorted((cx.token_ids, cy.token_ids), key=len)
            assert long_[: len(short)] == short
            if cx.finished and cy.finished:
                assert cx.token_ids == cy.token_ids


def _fresh_last_logits(model, seq: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([seq])).logits[0, -1]


@pytest.mark.parametrize("engine", ["hf", "fast"])
def test_pruned_cache_matches_fresh_forward(tiny_gen, tiny_model, engine):
    gen = tiny_gen(engine)
    prompt_ids = [gen.encode(p) for p in PROMPTS[:2]]
    sess = open_batch(gen, prompt_ids, 3, SamplingParams(1.0, 50, 1.0), 20, ignore_eos=True)  # no row ends early
    sess.decode(until=6)
    sess.select(torch.tensor([4, 0, 2]))  # a subset, across prompts, reordered
    sess.decode(until=9)
    sess.select(torch.tensor([2, 0]))
    sess.decode(until=12)
    assert sess.engine.rows == 2
    for row in range(2):
        seq = prompt_ids[sess.prompt_of[row]] + sess.out[row, : sess.t - 1].tolist()
        torch.testing.assert_close(sess.logits[row], _fresh_last_logits(tiny_model, seq), atol=1e-4, rtol=1e-4)


def test_the_engine_stores_each_prompts_full_blocks_once_and_frees_them_with_its_last_row(tiny_gen, tiny_model):
    gen = tiny_gen("fast")
    prompt_ids = [gen.encode(p) for p in PROMPTS[:2]]
    sess = open_batch(gen, prompt_ids, 4, SamplingParams(1.0, 50, 1.0), 20, ignore_eos=True)
    sess.decode(until=5)  # 5 tokens sampled, 4 of them fed: each row holds its prompt and 4 tokens
    b = sess.engine.block

    def held(L: int, rows: int) -> int:  # the prompt's blocks (whole: padded at the front) once, each row its own
        return b * (-(-L // b) + rows * -(-4 // b))

    L0, L1 = map(len, prompt_ids)
    assert sess.engine.allocated_tokens == held(L0, 4) + held(L1, 4)
    sess.select(torch.tensor([5, 6]))  # only prompt 1's rows remain
    assert sess.engine.allocated_tokens == held(L1, 2)
    sess.decode(until=8)
    for row in range(2):
        seq = prompt_ids[1] + sess.out[row, : sess.t - 1].tolist()
        torch.testing.assert_close(sess.logits[row], _fresh_last_logits(tiny_model, seq), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("engine", ["hf", "fast"])
def test_each_prompt_is_prefilled_once(tiny_gen, tiny_model, engine):
    gen = tiny_gen(engine)
    seen = []
    handle = tiny_model.model.embed_tokens.register_forward_hook(lambda m, i, o: seen.append(i[0].shape))
    try:
        out = run_tiny(
            gen, PROMPTS[:2], n=8, policy="none", overrides=["budget=unlimited", "sampling.max_new_tokens=6"]
        )
    finally:
        handle.remove()
    lens = [len(gen.encode(p)) for p in PROMPTS[:2]]
    L0 = max(lens)
    assert out.compute.gen_prefill_tokens == sum(lens)  # each prompt's own tokens, not 8 rows' each
    if engine == "hf":  # the model itself saw one [2, L0] prefill, then single-token steps
        assert seen[0] == (2, L0) and all(s[1] == 1 for s in seen[1:])
    n1 = run_tiny(gen, PROMPTS[:2], n=1, policy="none", overrides=["budget=unlimited", "sampling.max_new_tokens=6"])
    assert n1.compute.gen_prefill_tokens == out.compute.gen_prefill_tokens


def test_alpha_zero_equals_best_of_n(tiny_gen):
    gen = tiny_gen()
    ov = ["budget.kv_tokens=100000", "sampling.max_new_tokens=30"]
    bon = run_tiny(gen, PROMPTS, n=6, policy="none", overrides=ov, seed=11)
    a0 = run_tiny(gen, PROMPTS, n=6, policy="fixed", overrides=[*ov, "policy.alpha=0.0"], seed=11)
    for x, y in zip(bon.results, a0.results):
        assert [(c.candidate_id, c.token_ids) for c in x.candidates] == [
            (c.candidate_id, c.token_ids) for c in y.candidates
        ]
        assert x.best.token_ids == y.best.token_ids


def test_survivors_are_the_best_of_n_samples(tiny_gen):
    """Rows sample independently, so every finished Speculative Rejection candidate is exactly the Best-of-N
    sample with the same id and seed, and rejected ones are its prefixes."""
    gen = tiny_gen()
    bon = run_tiny(
        gen, PROMPTS, n=8, policy="none", overrides=["budget=unlimited", "sampling.max_new_tokens=40"], seed=2
    )
    sr = run_tiny(
        gen, PROMPTS, n=8, policy="fixed", overrides=["budget.kv_tokens=800", "sampling.max_new_tokens=40"], seed=2
    )
    assert any(r.rounds for r in sr.results)
    rejected, broken = compare_survivors(bon, sr)
    assert rejected > 0 and broken == 0


@pytest.mark.parametrize("engine", ["fast", "hf"])
@pytest.mark.parametrize(
    "budget,n,alpha,min_rounds",
    [(500, 8, 0.3, 3), (600, 8, 0.5, 1), (480, 8, 0.0, 4), (1500, 16, 0.7, 1), (700, 4, 0.0, 0)],
)
def test_budget_bounds_peak_and_sets_decision_points(tiny_gen, budget, n, alpha, min_rounds, engine):
    gen = tiny_gen(engine)
    max_new = 48
    out = run_tiny(
        gen,
        PROMPTS[:2],
        n=n,
        overrides=[
            f"budget.kv_tokens={budget}",
            f"sampling.max_new_tokens={max_new}",
            f"policy.alpha={alpha}",
            "budget.min_tokens_per_round=4",
            "sampling.ignore_eos=true",
        ],
    )  # rounds follow the formula alone
    assert 0 < out.compute.peak_kv_tokens <= budget
    lens = [len(gen.encode(p)) for p in PROMPTS[:2]]
    b = gen.kv.block  # fast: blocks of 8 or 16, each prompt in whole blocks stored once; hf: token by token, copied
    shared = 0 if engine == "hf" else sum(-(-p // b) * b for p in lens)
    own, base = budget - shared, max(lens) if engine == "hf" else 0  # the rows' share, where a row starts
    rows, t = 2 * n, 0
    expected = []
    while True:  # the documented count (rodeco/common/budget.py): at clock t a row holds t - 1 tokens of its own
        t = min(max_new, own // rows // b * b - base + 1)  # the most clock ticks whose blocks fit
        if t >= max_new:
            break
        m = min(4, max_new - t)
        must_go = max(0, rows - own // (-(-(base + t + m) // b) * b))
        kept_total = sum(r.rounds[len(expected)].rows_kept for r in out.results)
        assert rows - kept_total >= must_go
        expected.append(t)
        rows = kept_total
    got = [r.tokens_generated for r in out.results[0].rounds]
    assert got == expected and len(got) >= (min_rounds if b == 1 else min(min_rounds, 1))  # blocks: coarser rounds
    for r in out.results:
        for rd in r.rounds:
            assert (
                rd.rows_before - rd.rows_kept >= max(rd.min_reject, int(np.floor(alpha * rd.rows_before)))
                or rd.rows_kept == 1
            )


def test_same_seed_same_output_and_seed_matters(tiny_gen):
    gen = tiny_gen()
    ov = ["budget.kv_tokens=1200", "sampling.max_new_tokens=30"]
    a = run_tiny(gen, PROMPTS, n=6, overrides=ov, seed=7)
    b = run_tiny(gen, PROMPTS, n=6, overrides=ov, seed=7)
    c = run_tiny(gen, PROMPTS, n=6, overrides=ov, seed=8)
    key = lambda out: [[c.token_ids for c in r.candidates] for r in out.results]  # noqa: E731
    assert key(a) == key(b)
    assert key(a) != key(c)


def test_best_is_highest_final_reward(tiny_gen):
    out = run_tiny(tiny_gen(), PROMPTS, n=8, overrides=["budget.kv_tokens=1500", "sampling.max_new_tokens=30"])
    for r in out.results:
        finished = [c for c in r.candidates if c.finished]
        assert r.best.score == max(c.score for c in finished)
        assert len(r.candidates) == r.n_start


def test_logprob_reward_matches_a_fresh_forward(tiny_gen, tiny_model):
    gen = tiny_gen()
    out = run_tiny(gen, PROMPTS[:1], n=3, policy="none", overrides=["budget=unlimited", "sampling.max_new_tokens=12"])
    best = out.results[0].best
    ids = gen.encode(PROMPTS[0])
    seq = torch.tensor([ids + best.token_ids + ([gen.eos_ids[0]] if best.stop_reason == "eos" else [])])
    with torch.no_grad():
        lp = torch.log_softmax(tiny_model(seq).logits[0, len(ids) - 1 : -1], -1)
    tok_lp = lp.gather(-1, seq[0, len(ids) :, None])[:, 0]
    if best.stop_reason == "eos":
        tok_lp = tok_lp[:-1]  # the reward averages over the response tokens, EOS excluded
    assert best.score == pytest.approx(tok_lp.mean().item(), abs=1e-4)


def test_best_of_n_that_does_not_fit_the_budget_says_how_to_fix(tiny_gen):
    from rodeco.common.validation import PluginError

    with pytest.raises(PluginError, match="budget allows .* raise budget.kv_tokens"):
        run_tiny(
            tiny_gen(),
            PROMPTS[:2],
            n=8,
            policy="none",
            overrides=["budget.kv_tokens=600", "sampling.max_new_tokens=48"],
        )


@pytest.mark.parametrize("family", ["qwen2", "mistral"])
def test_fast_engine_matches_generate_on_other_llama_family_models(tiny_tokenizer, family):
    """The fast engine claims Qwen2 (biased QKV) and Mistral (no sliding window): hold it to generate()."""
    import transformers

    from rodeco.core.generator import TorchGenerator

    cls = {"qwen2": ("Qwen2Config", "Qwen2ForCausalLM"), "mistral": ("MistralConfig", "MistralForCausalLM")}[family]
    torch.manual_seed(0)
    cfg = getattr(transformers, cls[0])(
        vocab_size=len(tiny_tokenizer),
        **TINY_SHAPE,
        eos_token_id=1,
        pad_token_id=0,
        tie_word_embeddings=False,
        sliding_window=None,
    )
    model = getattr(transformers, cls[1])(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
        if family == "qwen2":
            assert model.model.layers[0].self_attn.q_proj.bias is not None
            for layer in model.model.layers:  # non-zero biases, so that they matter
                layer.self_attn.q_proj.bias.normal_(0, 0.5)
                layer.self_attn.k_proj.bias.normal_(0, 0.5)
    gen = TorchGenerator(model, tiny_tokenizer, engine="fast")
    out = run_tiny(gen, PROMPTS[:2], n=1, policy="none", overrides=[*GREEDY, "sampling.max_new_tokens=16"])
    for prompt, r in zip(PROMPTS[:2], out.results):
        assert r.best.token_ids == hf_greedy(model, gen, prompt, 16)
