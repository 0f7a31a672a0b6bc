"""Each row's working memory (``rodeco.common.working``): the formula against the tensors a decode step allocates,
counted by a dispatch mode on CPU, and the budget that charges it (``Budget.row_overhead``)."""

from __future__ import annotations

import weakref

import pytest
import torch
from conftest import tiny_llama_config
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from rodeco.common.budget import Budget, KVSpec
from rodeco.common.sampling import scaled
from rodeco.common.state import OpenPrompt, SamplingParams, SessionSpec
from rodeco.common.validation import ConfigError
from rodeco.common.working import working_memory

LOW, HIGH = 0.8, 1.25  # the formula's total over the measured peak must lie in this range
HELD = {
    "session": ("out", "lp", "n_tok", "finished", "pending", "logits", "hidden"),
    "engine": ("pos", "last_hidden"),
}  # what a session holds between steps, besides its cache


def _storage(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage()._cdata
    except NotImplementedError:  # oneDNN's packed weights have no storage
        return None


class LiveBytes(TorchDispatchMode):
    """Bytes of the tensors alive while it is active: the ``held`` tensors it starts with and every tensor an op
    allocates (an output on a storage none of its inputs has: views and in-place results are not new), each
    counted until its storage is freed. ``peak`` is the most seen after any op."""

    def __init__(self, held: list[torch.Tensor]) -> None:
        super().__init__()
        self.live, self.seen = 0, set()
        for t in held:
            self._track(t)
        self.peak = self.live

    def _track(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key, n = storage._cdata, storage.nbytes()
        if key not in self.seen:
            self.seen.add(key)
            self.live += n
            weakref.finalize(storage, self._free, key, n)

    def _free(self, key: int, n: int) -> None:
        self.live -= n
        self.seen.discard(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = {_storage(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        out = func(*args, **kwargs)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and _storage(t) not in inputs:
                self._track(t)
        self.peak = max(self.peak, self.live)
        return out


def _model(vocab: int, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    cfg = tiny_llama_config(vocab, hidden_size=32, intermediate_size=64, max_position_embeddings=512)
    return LlamaForCausalLM(cfg).eval().to(dtype)


@pytest.fixture(scope="module")
def gens(tiny_tokenizer):
    """Fast-engine generators: vocabulary 4096 over hidden 32 (logits dominate, as SmolLM2's 49,152 over 576 do),
    and vocabulary 256 (so that attention over a long prompt dominates)."""
    from rodeco.core.generator import TorchGenerator

    return {v: TorchGenerator(_model(v), tiny_tokenizer, engine="fast", chat_template=False) for v in (4096, 256)}


def measure(
    gen,
    rows: int,
    sampling: SamplingParams,
    logprobs: bool,
    hidden: bool,
    prompt: int = 10,
    steps: int = 6,
    max_new: int = 32,
) -> tuple[int, object]:
    """(bytes alive at the peak of ``steps`` decode steps of ``rows`` rows of one prompt, beyond the KV cache; the
    formula's ``WorkingMemory`` for them). The cache is allocated once up front, so a step allocates none."""
    spec = SessionSpec(
        ignore_eos=True, needs_logprobs=logprobs, needs_hidden=hidden, kv_tokens=rows * (prompt + max_new) * 2
    )
    sess = gen.open_session(spec)  # a fixed pool: the cache is allocated once, at the session's start
    sess.admit([[2 + i % 200 for i in range(prompt)]], [OpenPrompt(rows, max_new, sampling, 0, 0)])
    sess.decode(until=2)  # the first token comes from prefill's logits; measure steady steps
    objs = {"session": sess, "engine": sess.engine}
    live = LiveBytes(
        [x for k, names in HELD.items() for n in names if isinstance(x := getattr(objs[k], n, None), torch.Tensor)]
    )
    with live:
        sess.decode(until=2 + steps)
    wm = working_memory(
        gen.shape,
        context=prompt + 2 + steps,
        gathered_prompt=prompt + 2 + steps if gen.info.gathers_prompt else 0,  # the torch path gathers the context
        max_new_tokens=max_new,
        sampling=sampling,
        needs_logprobs=logprobs,
        needs_hidden=hidden,
    )
    return live.peak, wm


TOP_K, NUCLEUS = SamplingParams(1.0, 50, 1.0), SamplingParams(0.7, 0, 0.9)


@pytest.mark.parametrize("logprobs", [False, True])
@pytest.mark.parametrize("sampling", [TOP_K, NUCLEUS], ids=["top_k", "top_p"])
def test_the_formula_is_the_peak_a_decode_step_allocates_and_scales_with_rows(gens, logprobs, sampling):
    gen = gens[4096]
    (few, wm), (many, _) = (measure(gen, r, sampling, logprobs, hidden=True) for r in (8, 32))
    print(
        f"\nfp32 V=4096 {sampling} logprobs={logprobs}: measured {few / 8:.0f} B/row at 8 rows, "
        f"{many / 32:.0f} at 32; formula {wm.total} ({wm.to_dict()})"
    )
    assert wm.phase == "logits"
    for rows, peak in ((8, few), (32, many)):
        assert LOW <= wm.total * rows / peak <= HIGH, (rows, peak / rows, wm.to_dict())
    assert LOW <= wm.total * 24 / (many - few) <= HIGH  # per row: what 24 more rows add
    assert 0.95 <= many / few / 4 <= 1.05  # linear in rows


def test_the_formula_counts_attention_where_it_dominates(gens):
    wm_rows = [measure(gens[256], r, TOP_K, logprobs=False, hidden=False, prompt=200) for r in (8, 32)]
    for rows, (peak, wm) in zip((8, 32), wm_rows):
        print(
            f"\nfp32 V=256, 200-token prompt, {rows} rows: measured {peak / rows:.0f} B/row, formula {wm.total} "
            f"({wm.to_dict()})"
        )
        assert wm.phase == "attention" and LOW <= wm.total * rows / peak <= HIGH


def test_dropping_a_term_fails_the_tolerance(gens):
    """The check can fail: the formula without its log-probs (or its logits) falls out of range."""
    peak, wm = measure(gens[4096], 8, TOP_K, logprobs=True, hidden=False)
    assert LOW <= wm.total * 8 / peak <= HIGH
    for term in ("logprobs", "logits"):
        assert (wm.total - wm.terms[term]) * 8 / peak < LOW


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_scaling_in_place_is_bit_identical_and_leaves_the_logits_alone(dtype, temperature):
    logits = torch.randn(5, 300).to(dtype)
    before = logits.clone()
    assert torch.equal(scaled(logits, temperature), logits.float() / temperature)
    assert torch.equal(logits, before)


def test_working_memory_by_hand():
    from rodeco.common.shape import ModelShape

    shape = ModelShape(
        n_layers=30,
        n_heads=9,
        n_kv_heads=3,
        head_dim=64,
        n_matmul_params=1,
        dtype_bytes=2,
        vocab_size=49152,
        hidden_size=576,
    )  # SmolLM2-135M in bf16
    wm = working_memory(
        shape, context=1000, max_new_tokens=512, sampling=SamplingParams(), needs_logprobs=False, needs_hidden=False
    )
    V = 49152
    assert wm.terms["logits"] == 2 * V and wm.terms["sampling"] == 4 * V + 12 * 50 and wm.phase == "logits"
    assert wm.total == 8 * 512 + 64 + 2 * V + 4 * V + 600
    assert wm.tokens(shape.kv_bytes_per_token) == -(-wm.total // 23040) == 14  # 13.01 rounded up
    with pytest.raises(ConfigError) as e:
        working_memory(
            ModelShape(1, 1, 1, 1, 1, 2),
            context=10,
            max_new_tokens=5,
            sampling=SamplingParams(),
            needs_logprobs=False,
            needs_hidden=False,
        )
    assert "vocab_size" in e.value.problem and "row_overhead=0" in e.value.fix


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 200), min_size=1, max_size=4),
    st.integers(1, 64),
    st.sampled_from([1, 16, 32]),
    st.integers(500, 20000),
    st.integers(0, 300),
    st.integers(1, 16),
)
def test_with_working_memory_the_rows_kept_never_overfill_the_budget(prompt_lens, rows, b, kv, w, m):
    """Rows each holding ``w`` tokens of working memory besides their cache: the rows the next round keeps, and the
    rows ``n=auto`` starts, hold at most the budget; with ``w = 0`` every figure is the one without it. (Where a
    round ends is asked of the blocks: ``tests/test_kv_blocks.py``.)"""
    budget = Budget(kv, m, row_overhead=w)
    B, base = budget.for_batch(prompt_lens, KVSpec(shares_prefix=True, block=b))
    assert B.row_overhead == w
    L_max = base + 10**6
    L = base + kv // max(rows * len(prompt_lens), 1)  # a decision point's own length
    keep = B.max_rows(L, L_max)
    assert keep * (B.held(L + m) + w) <= B.kv_tokens
    n = B.auto_n(len(prompt_lens), base, L_max)
    if n > 1:
        assert n * len(prompt_lens) * (B.held(base + m) + w) <= B.kv_tokens
    plain, _ = Budget(kv, m).for_batch(prompt_lens, KVSpec(shares_prefix=True, block=b))
    assert keep <= plain.max_rows(L, L_max) and n <= plain.auto_n(len(prompt_lens), base, L_max)
    if w == 0:  # exactly the arithmetic without it
        assert keep == plain.max_rows(L, L_max) and n == plain.auto_n(len(prompt_lens), base, L_max)


def test_row_overhead_in_the_start_checks():
    b = Budget(1000, 8, row_overhead=12)
    assert b.max_rows(50, 200) == 1000 // (58 + 12)
    assert b.auto_n(2, 10, 200) == 1000 // ((18 + 12) * 2)
    with pytest.raises(ConfigError) as e:
        Budget(100, row_overhead=10).check_feasible([20, 20], 25, KVSpec(True, 1))  # 20 + 20 + 2 x (25 + 10) > 100
    assert "10 of working memory" in e.value.problem and "110 tokens" in e.value.problem
    with pytest.raises(ConfigError) as e:
        Budget(100, row_overhead=-1)
    assert e.value.key == "budget.row_overhead" and "WorkingMemory.tokens" in e.value.fix


def test_a_run_charges_it_where_the_budget_is_device_memory_and_reports_it_in_every_mode(
    tiny_gen, tmp_path, monkeypatch
):
    """``budget=cuda``: the rows' budget charges each row its working memory in tokens; ``budget=cpu``: nothing is
    charged; both runs say in ``summary.json`` what a row holds and what the run's rows held at most."""
    import json

    import rodeco
    from rodeco.core.data import prompts_of
    from rodeco.plugins import BuildContext, default_plugins
    from rodeco.roles import RoleBuilder, choose_roles
    from rodeco.runner import DecodeRun, run_decode

    plugins, gen = default_plugins(), tiny_gen()
    texts = ["write a haiku about autumn", "name three colours"]
    over = [
        "reward=logprob",
        "sampling.max_new_tokens=6",
        "output.progress=false",
        "n=4",
        "data.prompts=[" + ",".join(texts) + "]",
    ]
    expect = working_memory(
        gen.shape,
        context=max(len(gen.encode(t)) for t in texts) + 6,
        max_new_tokens=6,
        sampling=SamplingParams(1.0, 50, 1.0),
        needs_logprobs=True,
        needs_hidden=False,
    )
    cfg = rodeco.load_config(over)
    run_decode(cfg, plugins, tmp_path / "cpu", gen=gen)
    wm = json.loads((tmp_path / "cpu" / "summary.json").read_text())["working_memory"]
    assert wm["total"] == expect.total and wm["charged_tokens_per_row"] == 0 and wm["budget_mode"] == "tokens"
    assert wm["peak_rows"] == 8 and wm["peak_bytes_modelled"] == 8 * expect.total  # 2 prompts x 4 rows at the start
    cuda = rodeco.load_config([*over, "budget=cuda", "budget.reserve_gib=0"])  # a CUDA device with 1 GiB free
    monkeypatch.setattr(gen, "device", torch.device("cuda:0"))
    monkeypatch.setattr(gen, "layer_devices", lambda: {"cuda:0": gen.shape.n_layers})
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2**30, 2**31))
    roles = RoleBuilder(plugins, gen.name, BuildContext(plugins=plugins)).roles(choose_roles(cuda, plugins))
    run = DecodeRun(cuda, plugins, gen, roles, prompts_of(cuda.data), None)
    w = expect.tokens(gen.kv_bytes_per_token)
    assert w > 0 and run.overhead == w and run.settings.budget.row_overhead == w
    assert run.settings.budget.kv_tokens == int(2**30 * 0.9 // gen.kv_bytes_per_token)
