"""bfloat16, the GPU default, on CPU: both torch engines on the embedded SmolLM2 in bf16, and the budget's bytes per
KV token in each dtype.

What is exact in bf16 and what is not (SmolLM2-135M on CPU; here 2 prompts x 12 tokens, and once 4 prompts x 64
tokens with ``scripts/gpu_check.py``'s engine step):
- one prompt per batch, one row, the ``hf`` engine: the same tokens as ``generate()``, bit for bit (the same
  kernels on the same shapes; 4 of 4 prompts over 64 tokens);
- batched rows (left padding, other batch sizes) and the ``fast`` engine (its own fused kernels) part from
  ``generate()`` at the first near-tie: the two tokens' logits in ``generate()`` are within a few bf16 ulps (0 or 1
  ulps seen); before it, every token is equal. Over 64 tokens the first tie came after 5 to 39 tokens (after 5 on
  "Write a haiku about autumn." in every setting but the ``hf`` engine alone); 6 of 16 rows had none;
- pruning is exact: a pruned session's rows continue bit for bit as the same rows of a session never pruned, and as
  close to the fp32 model as a fresh bf16 forward;
- so Speculative Rejection's survivors are Best-of-N's samples with the same ids, and the rejected ones prefixes;
- a prompt joining a running batch (admission) is bounded the same way: equal to ``generate()`` up to a bf16 tie.
"""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import compare_survivors, hf_greedy_logits, open_batch, run_tiny

from rodeco.common.budget import budget_from_device, full_length_tokens
from rodeco.common.sampling import SamplingParams
from rodeco.common.state import OpenPrompt, SessionSpec
from rodeco.core.config import make_budget
from rodeco.core.session import TorchSession

PROMPTS = ["Write a haiku about autumn.", "Name three primary colors."]
NEW = 12
GREEDY = ["sampling.temperature=0", "budget=unlimited", f"sampling.max_new_tokens={NEW}"]
EOS = -1  # stands for any EOS token in a compared sequence
BF16_ULP = torch.finfo(torch.bfloat16).eps  # spacing of bf16 numbers in [1, 2): 2**-7
TIE_ULPS = 4  # two logits this many bf16 ulps apart are a tie that bf16 round-off may break either way


@pytest.fixture(scope="module")
def references(smollm2_bf16) -> dict[str, tuple[list[int], torch.Tensor]]:
    """Per prompt: ``generate()``'s greedy tokens in bf16 (EOS as ``EOS``) and the logits each was chosen from."""
    gen = smollm2_bf16("hf")
    refs = {}
    for p in PROMPTS:
        ids, eos, logits = hf_greedy_logits(gen, p, NEW)
        refs[p] = (ids + [EOS] * eos, logits)
    return refs


def ended(c) -> list[int]:
    return c.token_ids + [EOS] * (c.stop_reason == "eos")


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first index where two greedy sequences differ (both stop at EOS or at ``NEW`` tokens, so sequences
    equal over their common length are equal)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def logit(row: torch.Tensor, token: int, eos_ids: list[int]) -> float:
    return float(row[eos_ids].max() if token == EOS else row[token])


def bf16_ulp(x: float) -> float:
    return BF16_ULP * 2.0 ** torch.tensor(abs(x)).log2().floor().item()


@pytest.mark.integration
def test_hf_engine_one_prompt_per_batch_is_generate_bit_for_bit(smollm2_bf16, references):
    out = run_tiny(smollm2_bf16("hf"), PROMPTS, n=1, policy="none", overrides=[*GREEDY, "data.batch_prompts=1"])
    for p, r in zip(PROMPTS, out.results):  # the first prompt's batched rows part from generate() after 5 tokens
        assert ended(r.best) == references[p][0]


@pytest.mark.integration
@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_greedy_parts_from_generate_only_at_a_bf16_tie(smollm2_bf16, references, engine):
    """Both prompts in one batch (left-padded): every row equals ``generate()`` up to its first divergence, and
    there ``generate()``'s logits of the two tokens are within ``TIE_ULPS`` bf16 ulps (round-off, not a bug, decides
    which wins; after it the sequences are different texts and are not compared)."""
    gen = smollm2_bf16(engine)
    out = run_tiny(gen, PROMPTS, n=1, policy="none", overrides=GREEDY)
    whole = 0
    for p, r in zip(PROMPTS, out.results):
        ref, logits = references[p]
        assert len(ref) > 10
        for c in r.candidates:
            got = ended(c)
            d = first_divergence(got, ref)
            if d is None:
                assert got == ref
                whole += 1
                continue
            row = logits[d]
            margin = logit(row, ref[d], gen.eos_ids) - logit(row, got[d], gen.eos_ids)
            assert 0 <= margin <= TIE_ULPS * bf16_ulp(float(row.max())), (p, d, margin)
    assert whole  # a row with no tie on its way is generate()'s to the end


@pytest.mark.integration
@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_a_prompt_joining_a_running_batch_parts_from_generate_only_at_a_bf16_tie(smollm2_bf16, references, engine):
    """Admission in bf16: the second prompt joins after 4 steps of the first (its cache padded to the other's
    length, the rows at different steps): every row of both equals ``generate()`` up to its first divergence, and
    there ``generate()``'s logits of the two tokens are within ``TIE_ULPS`` bf16 ulps, as in a batch that started
    together."""
    gen = smollm2_bf16(engine)
    greedy = SamplingParams(temperature=0.0)
    sess = gen.open_session(SessionSpec())
    sess.admit([gen.encode(PROMPTS[0])], [OpenPrompt(n=2, max_new_tokens=NEW, sampling=greedy, seed=0, stream_key=0)])
    rows = sess.decode(until=4)
    (key,) = sess.admit(
        [gen.encode(PROMPTS[1])], [OpenPrompt(n=2, max_new_tokens=NEW, sampling=greedy, seed=0, stream_key=1)]
    )
    for _ in range(100):  # bounded: each pass decodes or retires
        if not sess.rows:
            break
        rows += sess.decode(until=10**6) + sess.retire_finished()
    assert sorted(r.prompt for r in rows) == [0, 0, key, key]
    parts = []  # each row's first divergence from generate() (its length where there is none)
    for r in rows:
        ref, logits = references[PROMPTS[0 if r.prompt == 0 else 1]]
        got = r.token_ids + [EOS] * (r.reason == "eos")
        d = first_divergence(got, ref)
        parts.append(len(got) if d is None else d)
        if d is None:
            assert got == ref
            continue
        row = logits[d]
        margin = logit(row, ref[d], gen.eos_ids) - logit(row, got[d], gen.eos_ids)
        assert 0 <= margin <= TIE_ULPS * bf16_ulp(float(row.max())), (r.prompt, d, margin)
    assert min(parts) >= 5  # no row parts before the known tie after 5 tokens (seen: 5 or never)


def _pruned_and_unpruned(gen, prompt_ids: list[list[int]]) -> tuple[TorchSession, TorchSession]:
    def session() -> TorchSession:
        return open_batch(gen, prompt_ids, 3, SamplingParams(1.0, 50, 1.0), 8, ignore_eos=True)  # no row ends early

    pruned, whole = session(), session()
    pruned.decode(until=2)
    pruned.select(torch.tensor([4, 0, 2]))  # a subset, across prompts, reordered
    pruned.decode(until=4)
    pruned.select(torch.tensor([2, 0]))
    pruned.decode(until=6)
    whole.decode(until=6)
    return pruned, whole


@pytest.mark.integration
@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_pruned_cache_continues_exactly_in_bf16(smollm2_bf16, smollm2, engine):
    gen = smollm2_bf16(engine)
    prompt_ids = [gen.encode(p) for p in PROMPTS]
    pruned, whole = _pruned_and_unpruned(gen, prompt_ids)
    assert pruned.engine.rows == 2
    for row in range(2):
        (same,) = [
            i
            for i in range(whole.rows)
            if (whole.prompt_of[i], whole.cand[i]) == (pruned.prompt_of[row], pruned.cand[row])
        ]
        assert torch.equal(pruned.out[row, : pruned.t], whole.out[same, : whole.t])
        assert torch.equal(pruned.logits[row], whole.logits[same])  # bit for bit
    ratios = []  # each row's error against the fp32 model's logits, over a fresh bf16 forward's
    for row in range(whole.rows):
        seq = torch.tensor([prompt_ids[whole.prompt_of[row]] + whole.out[row, : whole.t - 1].tolist()])
        with torch.no_grad():
            fresh = gen.model(seq).logits[0, -1].float()  # one bf16 forward over the whole sequence
            exact = smollm2.model(seq).logits[0, -1]  # the same weights in fp32
        ratios.append(float((whole.logits[row].float() - exact).abs().max() / (fresh - exact).abs().max()))
    # bf16 round-off of a fresh forward's size: the fast eager step rounds its q.k scores to bf16 (the matmul's
    # output) where SDPA keeps them in fp32, so a single row reaches 2.7x a fresh forward's error on an AVX512-BF16
    # CPU without AMX (1.1x on average over 36 rows and steps); a row that reads another row's generated keys and
    # values from step 3 on was 20x a fresh forward's error (tried on the same CPU)
    assert sum(ratios) / len(ratios) <= 2 and max(ratios) <= 4, ratios


@pytest.mark.integration
@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_survivors_are_the_best_of_n_samples_in_bf16(smollm2_bf16, engine):
    """Speculative Rejection with 8 rows per prompt under the memory of 8 rows at a third of their length (decision
    points every 4 tokens), against Best-of-8."""
    gen = smollm2_bf16(engine)
    new = 12 if gen.kv.block == 1 else 3 * gen.kv.block  # paged: a third is one block
    L0 = max(len(gen.encode(p)) for p in PROMPTS)
    kv = len(PROMPTS) * full_length_tokens(8, L0, new // 3, gen.kv)
    bon = run_tiny(
        gen, PROMPTS, n=8, policy="none", overrides=["budget=unlimited", f"sampling.max_new_tokens={new}"], seed=2
    )
    sr = run_tiny(
        gen,
        PROMPTS,
        n=8,
        overrides=[
            f"budget.kv_tokens={kv}",
            f"sampling.max_new_tokens={new}",
            "policy.alpha=0.5",
            "budget.min_tokens_per_round=4",
        ],
        seed=2,
    )
    assert all(r.rounds for r in sr.results)
    assert sr.compute.peak_kv_tokens <= kv < bon.compute.peak_kv_tokens
    rejected, broken = compare_survivors(bon, sr)
    assert rejected >= 4 and broken == 0


def _cache_bytes(engine) -> int:
    """Bytes of every key and value tensor an engine holds (the prompt caches and the rows' own)."""
    if hasattr(engine, "blocks"):  # the Llama engine: the blocks some row names, each counted once
        b = engine.blocks
        named = {x for r in range(b.rows) for x in b.tables[r, : b.counts()[r]].tolist()}
        return len(named) * sum(p[0].nbytes for p in (*engine.kpool, *engine.vpool))
    return sum(layer.keys.nbytes + layer.values.nbytes for layer in engine.cache.layers)  # hf: a DynamicCache


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_kv_bytes_per_token_are_those_of_the_dtype_in_use(tiny_model, tiny_tokenizer, dtype, engine):
    from rodeco.core.generator import TorchGenerator

    gen = TorchGenerator(copy.deepcopy(tiny_model).to(dtype), tiny_tokenizer, engine=engine)
    cfg = tiny_model.config
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads)
    assert gen.kv_bytes_per_token == per_token * dtype.itemsize  # keys and values of every layer
    prompt_ids = [gen.encode("write a haiku"), gen.encode("give three tips")]
    sess = open_batch(gen, prompt_ids, 3, SamplingParams(1.0, 50, 1.0), 8, ignore_eos=True)
    sess.decode(until=6)
    # what the budget counts is what the cache holds, in the dtype in use
    assert _cache_bytes(sess.engine) == sess.engine.allocated_tokens * gen.kv_bytes_per_token
    assert sess.stats.peak_kv_bytes == sess.stats.peak_kv_tokens * gen.kv_bytes_per_token


@pytest.mark.parametrize("dtype,tokens", [("float32", 2**20), ("bfloat16", 2**21), ("float16", 2**21)])
def test_the_budget_from_free_cuda_memory_counts_the_dtypes_bytes(
    tiny_model, tiny_tokenizer, monkeypatch, dtype, tokens
):
    """With ``budget=cuda`` (``budget.mode=device``) on CUDA (faked here), the same free memory holds twice as many
    bf16 or fp16
    tokens as fp32 ones."""
    import rodeco
    from rodeco.core.generator import TorchGenerator

    gen = TorchGenerator(copy.deepcopy(tiny_model).to(getattr(torch, dtype)), tiny_tokenizer)
    monkeypatch.setattr(gen, "device", torch.device("cuda:0"))
    monkeypatch.setattr(gen, "layer_devices", lambda: {"cuda:0": 2})
    fp32_bytes = 2 * 2 * 2 * 16 * 4  # keys and values x 2 layers x 2 KV heads x head_dim 16 x 4 bytes
    free = 2 * 2**30 + 2**20 * fp32_bytes  # the reserve and 2**20 fp32 tokens
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 2 * free))
    cfg = rodeco.load_config(["budget=cuda", "budget.memory_fraction=1.0", "budget.reserve_gib=2"])
    kv = make_budget(cfg, gen).kv_tokens
    assert kv == budget_from_device(free, gen.kv_bytes_per_token, 1.0, 2 * 2**30) == tokens


@pytest.mark.parametrize("value", ["bf17", "float64", "int8"])
def test_an_unknown_dtype_names_the_key_and_the_valid_values(value):
    import rodeco
    from rodeco.common.validation import ConfigError
    from rodeco.core.loading import load_generator

    cfg = rodeco.load_config([f"generator.dtype={value}", "generator.device=cpu"])
    with pytest.raises(ConfigError) as e:
        load_generator(cfg.generator)  # fails before any weights are read
    assert e.value.key == "generator.dtype" and e.value.value == value
    assert all(name in e.value.fix for name in ("auto", "float32", "bfloat16", "float16"))


@pytest.mark.parametrize(
    "flags,native",
    [
        ({"avx512f", "avx512_bf16"}, True),
        ({"amx_bf16", "amx_tile"}, True),
        ({"avx2", "avx512f", "avx512_vnni"}, False),
        (set(), False),
    ],
)
def test_auto_stays_fp32_on_cpu_and_says_when_bf16_would_be_faster(tiny_model_dir, monkeypatch, caplog, flags, native):
    """``generator.dtype=auto`` on CPU is fp32 whatever the CPU (a bf16 pool moved the efficiency figures beyond
    their CIs: docs/results.md); on a CPU with bf16 instructions the log names the setting that may be
    faster and how to measure it."""
    import logging

    from rodeco.common import hardware
    from rodeco.core.loading import load_model_and_tokenizer

    monkeypatch.setattr(hardware, "_cpuinfo", lambda: ("a CPU", frozenset(flags)))
    assert hardware.native_bf16() is native
    assert hardware.cpu_facts()["flags"]["avx512_bf16"] is ("avx512_bf16" in flags)
    with caplog.at_level(logging.INFO, logger="rodeco.core.loading"):
        model, _ = load_model_and_tokenizer(str(tiny_model_dir), dtype="auto", device="cpu")
    assert model.dtype == torch.float32
    assert ("generator.dtype=bfloat16" in caplog.text) is native
    assert ("engine_bench" in caplog.text) is native  # the flags do not decide it: a measurement does


def test_readme_documents_every_dtype():
    from conftest import REPO

    from rodeco.core.loading import DTYPES

    (row,) = [line for line in (REPO / "README.md").read_text().splitlines() if line.startswith("| `generator.dtype`")]
    assert all(f"`{name}`" in row for name in ["auto", *DTYPES])
