"""``generator.compile``: the Llama engine's decode step compiled with torch.compile (``rodeco.engines.compiled``).

On a tiny random Llama, with a temporary inductor cache: the compiled step gives the eager step's tokens in fp32 and
its logits to round-off (bf16: to the bound ``tests/test_bf16.py`` uses), with the torch attention and with
rodeco's paged kernel (``tests/test_kernels.py`` tests the kernel itself); Speculative Rejection's survivors are
still Best-of-N's samples with compile on, in both dtypes; a run with rejections, finished rows and several rounds
compiles a bounded handful of graphs and a second run none; the setting is checked and kept out of a pool's
identity.
"""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import compare_survivors, run_tiny
from omegaconf import OmegaConf

from rodeco.common.validation import ConfigError
from rodeco.core.config import candidate_settings
from rodeco.core.generator import TorchGenerator
from rodeco.engines.compiled import compile_setting
from rodeco.engines.fast import LlamaEngine
from rodeco.engines.hf import HFEngine

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("inductor_cache")]  # torch.compile

PROMPTS = ["Write a haiku about autumn.", "Name three primary colors.", "Say hi."]
MOST_GRAPHS = 6  # dynamo's 0/1 specializations: one row, one prompt, the first own token (see rodeco.engines.compiled)


@pytest.fixture(scope="module")
def gens(tiny_model, tiny_tokenizer):
    """Per dtype: (eager, compiled) generators of the tiny model, built once (each compiled step compiles its own
    graphs, which costs seconds)."""
    made: dict[torch.dtype, tuple[TorchGenerator, TorchGenerator]] = {}

    def get(dtype=torch.float32) -> tuple[TorchGenerator, TorchGenerator]:
        if dtype not in made:
            m = copy.deepcopy(tiny_model).to(dtype)
            made[dtype] = (
                TorchGenerator(m, tiny_tokenizer, engine="fast", name="tiny", compile="false"),
                TorchGenerator(m, tiny_tokenizer, engine="fast", name="tiny", compile="true"),
            )
        return made[dtype]

    return get


def test_the_setting_is_checked_and_auto_compiles_on_cuda_only():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert compile_setting("auto", cuda, LlamaEngine) and not compile_setting("auto", cpu, LlamaEngine)
    assert compile_setting("true", cpu, LlamaEngine) and compile_setting(True, cpu, LlamaEngine)
    assert not compile_setting("false", cuda, LlamaEngine) and not compile_setting("auto", cuda, HFEngine)
    with pytest.raises(ConfigError, match="generator.compile.*only the fast engine"):
        compile_setting("true", cpu, HFEngine)
    with pytest.raises(ConfigError, match="generator.compile.*maybe.*auto, true or false"):
        compile_setting("maybe", cpu, LlamaEngine)


def test_a_bad_compile_value_is_named_before_any_model_loads():
    import rodeco
    from rodeco.core.config import validate

    with pytest.raises(ConfigError, match="generator.compile.*maybe.*auto, true or false"):
        validate(rodeco.load_config(["generator.compile=maybe"]))


def test_compile_is_not_part_of_a_pools_identity():
    a = OmegaConf.create({"model": "m", "engine": "auto", "compile": "auto", "dtype": "auto"})
    b = OmegaConf.create({"model": "m", "engine": "auto", "compile": "true", "dtype": "auto"})
    assert candidate_settings(a) == candidate_settings(b) and "compile" not in candidate_settings(a)


def test_compiled_step_gives_the_eager_tokens_in_fp32_and_close_logits(gens):
    eager, comp = gens()
    kw = dict(n=4, policy="none", overrides=["sampling.max_new_tokens=24", "budget=unlimited"])
    a, b = run_tiny(eager, PROMPTS, **kw), run_tiny(comp, PROMPTS, **kw)
    texts = lambda r: [[c.token_ids for c in x.candidates] for x in r.results]  # noqa: E731
    assert texts(a) == texts(b)
    assert comp.compiled is not None and 1 <= comp.compiled.compiles <= MOST_GRAPHS
    assert comp.compiled.module.handles is not None  # on CPU the graph calls the prepacked oneDNN matmuls
    # the logits of one step: round-off apart, not equal by accident of an unused path
    ids = [eager.encode(p) for p in PROMPTS]
    logits = []
    for g in (eager, comp):
        eng = g.new_engine()
        L = max(map(len, ids))
        inp = torch.tensor([[0] * (L - len(x)) + x for x in ids])
        mask = torch.tensor([[0] * (L - len(x)) + [1] * len(x) for x in ids])
        eng.admit(inp, mask)
        eng.select(torch.arange(3).repeat_interleave(2))
        eng.step(torch.full((6,), 7))
        logits.append(eng.step(torch.arange(6) + 10).float())
    diff = (logits[0] - logits[1]).abs().max().item()
    assert 0 <= diff < 1e-3 * logits[0].abs().max().item()


def _same_tokens_as_eager(gens, new_tokens: int, **step) -> TorchGenerator:
    """A generator whose compiled step is built with ``step`` (``CompiledStep.of``'s options), after checking that it
    decodes the eager step's tokens in fp32."""
    from rodeco.engines.compiled import CompiledStep

    eager, comp = gens()
    other = TorchGenerator(comp.model, comp.tokenizer, engine="fast", name="tiny", compile="true")
    other._prepared = LlamaEngine.prepare(comp.model)
    other._compiled = CompiledStep.of(comp.model, other._prepared, **step)
    kw = dict(n=3, policy="none", overrides=[f"sampling.max_new_tokens={new_tokens}", "budget=unlimited"])
    a, b = run_tiny(eager, PROMPTS, **kw), run_tiny(other, PROMPTS, **kw)
    assert [[c.token_ids for c in x.candidates] for x in a.results] == [
        [c.token_ids for c in x.candidates] for x in b.results
    ]
    return other


def test_the_plain_weights_path_gives_the_same_tokens(gens):
    """The graph with the plain weights folded by freezing (what CUDA runs, where there are no prepacked weights)
    decodes the eager step's tokens too."""
    plain = _same_tokens_as_eager(gens, 16, packed=False)
    assert plain.compiled.module.handles is None and plain.compiled.compiles >= 1


def test_the_graph_calls_the_prepacked_linears_through_the_python_op(gens):
    """On CPU the graph names each prepacked linear by a handle and calls it through ``rodeco::packed_linear``."""
    _, comp = gens()
    comp.new_engine()
    assert comp.compiled.module.handles is not None


def test_the_torch_attention_in_the_graph_gives_the_eager_tokens_in_fp32(gens):
    """The torch path the kernel replaces (``native.paged_reference``: CUDA's, and CPU's where the kernel cannot be
    built) decodes the eager step's tokens in the graph too."""
    ind = _same_tokens_as_eager(gens, 40, kernel=False)
    assert not ind.compiled.kernel


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_survivors_are_best_of_n_samples_with_compile_on(gens, dtype):
    from rodeco.engines.compiled import CompiledStep

    _, comp = gens(dtype)
    ov = ["sampling.max_new_tokens=40", "budget=cpu", "budget.kv_tokens=700"]
    bon = run_tiny(comp, PROMPTS, n=8, policy="none", overrides=["sampling.max_new_tokens=40", "budget=unlimited"])
    sr = run_tiny(comp, PROMPTS, n=8, policy="fixed", overrides=ov)
    rejected, broken = compare_survivors(bon, sr)
    assert rejected > 0 and broken == 0
    assert 1 <= comp.compiled.compiles <= MOST_GRAPHS  # compiled, not fallen back to eager
    from rodeco.engines import native

    # rodeco's attention kernel runs where it can be built (prompts freed by rejections keep their layout)
    assert comp.compiled.kernel == native.available("paged_attention")
    # and on an Intel CPU in fp32 its linears are MKL's packed GEMM, whose rows keep the samples too
    assert comp._prepared.mkl == (dtype == torch.float32 and CompiledStep.uses_mkl(comp.model))


def test_mkls_linears_serve_the_compiled_step_on_an_intel_cpu_in_fp32_only(gens, monkeypatch):
    """The compiled step's weights are packed for MKL's GEMM where ``uses_mkl`` says (an Intel CPU, fp32, the kernels
    built), the eager step's never (compile off decodes as before); where MKL's rows would depend on the batch the
    weights fall back to oneDNN's, with a warning."""
    from rodeco.common.hardware import cpu_vendor
    from rodeco.engines import llama, native
    from rodeco.engines.compiled import CompiledStep

    eager, comp = gens()
    comp.new_engine(), eager.new_engine()
    assert not eager._prepared.mkl and all(x.mkl is None for x in eager._prepared.linears())
    intel = cpu_vendor() == "GenuineIntel"
    assert CompiledStep.uses_mkl(comp.model) == (intel and native.available("mkl_linear"))
    assert comp._prepared.mkl == CompiledStep.uses_mkl(comp.model)
    assert all((x.mkl is not None) == comp._prepared.mkl for x in comp._prepared.linears())
    assert not CompiledStep.uses_mkl(copy.deepcopy(comp.model).to(torch.bfloat16))
    monkeypatch.setattr("rodeco.engines.compiled.cpu_vendor", lambda: "AuthenticAMD")
    assert not CompiledStep.uses_mkl(comp.model)
    if not native.available("mkl_linear"):
        return
    monkeypatch.setattr(llama, "row_invariant", lambda lin: lin.mkl is None)  # as if MKL's rows moved with the batch
    w = llama.FastWeights(comp.model, mkl=True)
    assert not w.mkl and all(x.mkl is None for x in w.linears())


def test_runs_with_rejections_and_finished_rows_compile_at_most_the_specializations(gens):
    """However many rows, prompts, rounds and tokens: at most ``MOST_GRAPHS`` graphs per compiled step, and once a
    run has compiled them a run of other prompts, rows and rounds compiles none."""
    _, comp = gens()
    ov = ["sampling.max_new_tokens=40", "budget=cpu", "budget.kv_tokens=900"]
    first = run_tiny(comp, PROMPTS, n=8, policy="fixed", overrides=ov)
    assert any(c.stop_reason == "eos" for r in first.results for c in r.candidates)  # rows finished on the way
    assert any(not c.finished for r in first.results for c in r.candidates)  # and rows were rejected
    tight = ["sampling.max_new_tokens=40", "budget=cpu", "budget.kv_tokens=700"]  # rejected down to few rows
    run_tiny(comp, PROMPTS, n=8, policy="fixed", overrides=tight)
    graphs = comp.compiled.compiles
    assert 1 <= graphs <= MOST_GRAPHS
    run_tiny(comp, PROMPTS[:2], n=5, policy="fixed", overrides=tight)  # other prompts, rows and rounds
    run_tiny(comp, PROMPTS[1:], n=3, policy="none", overrides=["sampling.max_new_tokens=12", "budget=unlimited"])
    assert comp.compiled.compiles == graphs


def test_the_budget_charges_the_compiled_steps_gathered_prompt(gens):
    """The compiled step gathers each row's prompt keys and values, one layer at a time: working memory counts it."""
    from rodeco.common.sampling import SamplingParams
    from rodeco.common.working import working_memory

    eager, comp = gens()
    s = eager.shape
    kw = dict(
        context=300, max_new_tokens=100, sampling=SamplingParams(1.0, 50, 1.0), needs_logprobs=False, needs_hidden=False
    )
    plain, gathered = working_memory(s, **kw), working_memory(s, **kw, gathered_prompt=20000)
    assert plain.terms["prompt_gather"] == 0
    g = gathered.terms
    assert g["prompt_gather"] == 2 * s.n_kv_heads * 20000 * s.head_dim * s.dtype_bytes
    assert gathered.phase == "attention"  # a long prompt's gather outweighs the logits
    assert gathered.total == g["response"] + g["hidden"] + g["attention"] + g["activations"] + g["prompt_gather"]
    assert comp.compile and not eager.compile  # what rodeco.runner.row_working_memory reads
    from rodeco.engines.compiled import CompiledStep

    assert comp.info.gathers_prompt == (not CompiledStep.uses_kernel(comp.model)) == eager.info.gathers_prompt
    with pytest.MonkeyPatch.context() as mp:  # inductor's attention (CUDA's; CPU's without the kernel) gathers
        mp.setattr("rodeco.engines.compiled._kernel_serves", lambda *a: False)
        from rodeco.core.generator import TorchGenerator

        assert TorchGenerator(comp.model, comp.tokenizer, engine="fast", compile=True).info.gathers_prompt


def test_the_kernel_gathers_no_prompt_so_the_budget_charges_none(gens):
    from rodeco.engines import native

    eager, comp = gens(torch.bfloat16)
    assert comp.info.gathers_prompt != native.available("paged_attention")
    assert eager.info.gathers_prompt == comp.info.gathers_prompt  # eager and compiled read the blocks alike


def test_the_compiled_step_writes_the_pools_in_place_through_admission_and_copies(gens):
    """Logits a step, compiled against eager, over a prefill, fan-out, rejection, an admission and copies mid-block:
    round-off apart; the same blocks; and what the compiled step wrote is in the engine's own pools."""
    eager, comp = gens()
    engines = [g.new_engine() for g in (eager, comp)]
    ids = [eager.encode(p) for p in PROMPTS]
    L = max(map(len, ids))
    inp = torch.tensor([[0] * (L - len(x)) + x for x in ids])
    mask = torch.tensor([[0] * (L - len(x)) + [1] * len(x) for x in ids])
    late = torch.tensor([eager.encode("Tell me a joke about cats.")])
    for e in engines:
        e.admit(inp, mask)
        e.select(torch.arange(3).repeat_interleave(3))
    for s in range(30):
        if s == 8:
            for e in engines:
                e.select(torch.tensor([0, 2, 4, 5, 8]))
        if s == 12:
            for e in engines:
                e.admit(late, torch.ones_like(late))
                e.select(torch.tensor([0, 1, 2, 3, 4, 5, 5]))
        if s == 20:
            for e in engines:
                e.select(torch.tensor([0, 0, 3, 6, 6]))
        t = (torch.arange(engines[0].rows) * 7 + s) % 200 + 2
        a, b = (e.step(t) for e in engines)
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4, msg=f"step {s}")
    used = torch.from_numpy(engines[0].blocks.tables[:, 0])  # every row's first block, written at prefill and on
    assert engines[1].blocks.tables.tolist() == engines[0].blocks.tables.tolist()
    last = engines[0].blocks.tables[range(engines[0].rows), (engines[0].blocks.lens - 1) // 16]  # this step's
    for li in range(len(engines[0].kpool)):  # what the compiled step wrote is in the engine's own pools
        for idx in (used, torch.from_numpy(last)):
            torch.testing.assert_close(engines[1].kpool[li][idx], engines[0].kpool[li][idx], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(engines[1].vpool[li][idx], engines[0].vpool[li][idx], rtol=1e-4, atol=1e-4)
