"""Every config group option composes and builds; the CLI runs end to end on the embedded model."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import REPO, SHARED_DATA
from omegaconf import OmegaConf

import rodeco
from rodeco.common.budget import budget_from_device
from rodeco.common.state import PromptView, RoundView, ScoreRequest
from rodeco.common.validation import ConfigError, PluginError
from rodeco.compose import conf_dir
from rodeco.core.config import make_budget, split_node, validate
from rodeco.core.contracts import Scorer, select_checked
from rodeco.plugins import BuildContext, default_plugins
from rodeco.tasks import prompts_of


def options(group: str) -> list[str]:
    """The options of a config group, from rodeco's conf/ and every plugin's config dir (as Hydra sees them)."""
    dirs = [conf_dir(), *map(Path, default_plugins().config_dirs())]
    found = sorted({p.stem for d in dirs for p in (d / group).glob("*.yaml")})
    assert found, f"no options of group {group!r} in {dirs}"
    return found


def test_the_option_lists_are_what_ships():
    assert {"cpu", "cuda", "unlimited"} <= set(options("budget"))
    assert {"fixed", "none", "adaptive", "correlation"} <= set(options("policy"))
    assert {"minilm_rm", "logprob", "preference_rm", "composite", "custom", "confidence", "gold", "arith_gold"} <= set(
        options("reward")
    )
    assert {"reasoning_gym"} <= set(options("data"))
    assert {"efficiency", "perplexity", "correlation", "engine_bench", "rm_train", "rm_eval", "rm_bench"} <= set(
        options("experiment")
    )


def test_default_config_composes_and_validates():
    cfg = rodeco.load_config()
    validate(cfg)
    assert cfg.policy.name == "fixed" and cfg.reward.name == "minilm_rm" and cfg.task == "decode"
    assert cfg.data.path is None and len(cfg.data.prompts) == 3


def built_options(group: str, tiny_gen):
    """(option, registered name, the option file's parameters, the object built from it, its BuildContext) of
    every option of ``group`` that builds offline."""
    plugins = default_plugins()
    registry = plugins.rewards if group == "reward" else plugins.policies
    for opt in options(group):
        cfg = rodeco.load_config([f"{group}={opt}"])
        name, params = split_node(cfg[group], group)
        if getattr(registry.get(name).factory, "needs_network", False):
            continue
        if name in REFERENCE_JUDGES and not SHARED_DATA.is_dir():  # the reference answers live there
            continue
        gen = None if name in GENERATOR_BOUND else tiny_gen()
        ctx = BuildContext(generator=gen, device="cpu", plugins=plugins)
        obj = plugins.build_reward(cfg[group], ctx) if group == "reward" else plugins.build_policy(cfg[group], ctx)
        yield opt, name, params, obj, ctx


def check_params_reached(opt: str, params: dict, obj) -> None:
    """Every parameter the option file sets (to a plain value) and the object keeps under its own name has the
    file's value: none was dropped for a default on the way (``null`` means "let the factory choose")."""
    kept = {
        k: v
        for k, v in params.items()
        if isinstance(v, (bool, int, float, str)) and isinstance(getattr(obj, k, None), (bool, int, float, str))
    }  # not a name the object resolved (a head)
    assert {k: getattr(obj, k) for k in kept} == kept, opt


GENERATOR_BOUND = {"verifier"}  # trained on one generator's samples, it refuses another's: built without the tiny one
REFERENCE_JUDGES = {"chrf", "ref_sim"}  # they score AlpacaEval prompts only, against the reference answer
# the prompt, responses and record a reward option can score (the default: a haiku, no record), by option name
TINY_PROMPTS = {
    "chrf": "How did US states get their names?",
    "ref_sim": "How did US states get their names?",
    "arith_gold": "What is 23 + 7? Answer with the number.",
    "gold": "What is 23 + 7? Answer with the number.",
}
TINY_TEXTS = {
    "arith_gold": ["It is 30.", "23 + 7 = 31", "The answer: 30"],
    "gold": ["It is 30.", "23 + 7 = 31", "The answer: 30"],
}
TINY_RECORDS = {"gold": {"gold_answer": "30"}}


def tiny_requests(reward, option: str = "") -> list[ScoreRequest]:
    """Three responses of different lengths to one prompt, carrying what the reward says it needs (log-probs; the
    top-k log-probs at each position; hidden states, which only partial responses carry; the prompt's record)."""
    partial = bool(getattr(reward, "needs_hidden_states", False))
    dim = len(reward.head.mean) - 2 if partial else 0  # the head reads [hidden state, 2 position features]
    k = int(getattr(reward, "needs_top_logprobs", 0))
    rng = np.random.default_rng(0)
    texts = TINY_TEXTS.get(
        option, ["Leaves fall.", "Red leaves drift down the cold river at dusk.", "Autumn wind, " * 8 + "and rain."]
    )

    def top(n: int) -> tuple[tuple[float, ...], ...] | None:  # [n][k], each position's descending
        return tuple(tuple(sorted(-rng.exponential(size=k), reverse=True)) for _ in range(n)) if k else None

    return [
        ScoreRequest(
            TINY_PROMPTS.get(option, "Write a haiku about autumn."),
            text,
            tuple(range(1, 3 + 4 * i)),
            partial=partial,
            candidate_id=i,
            logprobs=tuple(-0.2 * (j % 5 + i) for j in range(2 + 4 * i)),
            hidden_state=rng.normal(size=dim) if partial else None,
            top_logprobs=top(2 + 4 * i),
            meta=TINY_RECORDS.get(option, {}),
        )
        for i, text in enumerate(texts)
    ]


def _confidence(p: dict, reqs: list[ScoreRequest], ctx: BuildContext) -> list[float] | None:
    """-mean of the top-k log-probs over the whole response: what every form gives a response no longer than its
    window and tail (None: a longer one, not worked out here)."""
    if any(len(r.top_logprobs) > min(p["window"], p["tail"]) for r in reqs):
        return None
    return [-float(np.mean([x[: p["top_k"]] for x in r.top_logprobs])) for r in reqs]


def _composite(p: dict, reqs: list[ScoreRequest], ctx: BuildContext) -> list[float]:
    """The weighted sum of the components' scores, each component built on its own (no standardization)."""
    parts = {
        k: Scorer(ctx.plugins.build_reward(OmegaConf.create(dict(node)), ctx), k)(reqs)
        for k, node in p["components"].items()
    }
    return sum(p["weights"][k] * parts[k] for k in parts).tolist()


# What a reward of each registered kind must score on ``tiny_requests``, from its option file's parameters ``p``.
EXPECTED_SCORES = {
    "custom": lambda p, reqs, ctx: [float(len(r.response)) for r in reqs] if p["function"] == "length" else None,
    "gold": lambda p, reqs, ctx: [1.0, 0.0, 1.0],
    "confidence": _confidence,
    "logprob": lambda p, reqs, ctx: [{"mean": np.mean, "sum": np.sum}[p["form"]](r.logprobs) for r in reqs],
    "composite": _composite,
    "example_length": lambda p, reqs, ctx: [
        -abs(len(r.response.split()) - p["target_words"]) / p["target_words"] for r in reqs
    ],
}


def test_every_reward_option_builds_and_scores(tiny_gen):
    built = []
    for opt, name, params, reward, ctx in built_options("reward", tiny_gen):
        check_params_reached(opt, params, reward)
        reqs = tiny_requests(reward, opt)
        role = "partial_reward" if reqs[0].partial else "reward"
        scores = Scorer(reward, name, role)(reqs)  # one finite float per request, or a PluginError
        assert Scorer(reward, name, role)(reqs).tolist() == scores.tolist(), opt  # the same input, the same scores
        assert len(set(scores.tolist())) > 1, (opt, scores)  # it reads the responses: they do not all score alike
        if name in EXPECTED_SCORES:
            expected = EXPECTED_SCORES[name](params, reqs, ctx)
            assert expected is not None and scores.tolist() == pytest.approx(expected, abs=1e-9), (opt, scores)
        built.append(opt)
    assert {"composite", "custom", "logprob", "minilm_rm", "minilm_prefix", "text_value", "value_head"} <= set(built)
    assert {"arith_gold", "confidence", "gold", "verifier"} <= set(built)


def tiny_view(min_reject: int) -> RoundView:
    """One prompt's 8 rows at the first decision point, with distinct scores (and top-k log-probs whose confidences
    rank the rows alike)."""
    scores = np.array([0.3, 0.9, 0.1, 0.5, 0.7, 0.2, 0.8, 0.4])
    pv = PromptView(
        prompt_index=0,
        candidate_ids=list(range(8)),
        scores=scores,
        history=np.zeros((8, 0)),
        finished_scores=[],
        tokens_generated=16,
        min_reject=min_reject,
        parents=[None] * 8,
        origins=list(range(8)),
        max_rows=8 - min_reject,
        rng=np.random.default_rng(0),
        top_logprobs=[np.full((16, 5), -s) for s in scores],  # token confidences ranked as the scores (deepconf)
    )
    return RoundView(round=0, prompts=[pv], max_rows_next=8 - min_reject, max_new_tokens=128, n_start=8)


SAMPLES = {"particle_filter"}  # draws its rows (PromptView.rng) rather than keeping the top ones

# How many of tiny_view(0)'s 8 rows a policy of each registered kind keeps, from its option file's parameters
# (correlation has no earlier decision point to correlate with, so it rejects at its fallback rate, alpha).
EXPECTED_KEPT = {
    "none": lambda p: 8,
    "fixed": lambda p: 8 - math.floor(p["alpha"] * 8),
    "correlation": lambda p: 8 - math.floor(p["alpha"] * 8),
    "deepconf": lambda p: 8,  # its first decision point is its warm-up: every row goes on
    "example_keep": lambda p: p["keep"],
}


def test_every_policy_option_builds_and_selects(tiny_gen):
    built = []
    for opt, name, params, policy, _ in built_options("policy", tiny_gen):
        check_params_reached(opt, params, policy)
        for min_reject in (0, 3):
            view = tiny_view(min_reject)
            if name == "none" and min_reject:  # Best-of-N never rejects: a budget that forces it is an error
                with pytest.raises(PluginError, match="the budget allows 5"):
                    select_checked(policy, name, view)
                continue
            (counts,) = select_checked(policy, name, view)  # valid rows, at least one, within the budget
            kept = counts.kept
            best_first = np.argsort(-view.prompts[0].scores).tolist()
            if name in SAMPLES:  # resamples: any rows, in all no more than the budget fits
                assert 1 <= counts.total <= view.max_rows_next, (opt, counts)
            else:
                assert kept == sorted(best_first[: len(kept)]), (opt, kept)  # the highest-scoring rows
            if name in EXPECTED_KEPT:
                assert len(kept) == min(8 - min_reject, EXPECTED_KEPT[name](params)), (opt, min_reject, kept)
        built.append(opt)
    assert {"adaptive", "calibrated", "correlation", "fixed", "none"} <= set(built)


# What a run under each budget option does on CPU: "cpu" (budget.mode=tokens) holds at most 2048 cached tokens, so
# 32 rows of 80 new tokens (2,560 and the prompt at full length) get decision points; "unlimited" holds every row
# to the end: Best-of-32, no decision point. "cuda" (device memory) and "engine" (vLLM's pool) have nothing to read
# on a CPU torch engine and say so.
BOUNDED = {"cpu": 2048, "unlimited": None}
REFUSED_ON_CPU = {"cuda": "no device memory", "engine": "has no KV pool of its own"}


def test_every_budget_option_gets_decision_points_or_not(tiny_gen, monkeypatch):
    from helpers import run_tiny

    assert set(options("budget")) == set(BOUNDED) | set(REFUSED_ON_CPU)  # a new option: say what a run under it does
    for opt, kv in BOUNDED.items():
        out = run_tiny(
            tiny_gen(),
            ["write a haiku about autumn leaves"],
            n=32,
            overrides=[f"budget={opt}", "sampling.max_new_tokens=80", "sampling.ignore_eos=true"],
        )
        (res,) = out.results
        assert {len(c.token_ids) for c in res.candidates if c.finished} == {80}, (
            opt
        )  # every finished row at full length
        rejected = [c for c in res.candidates if c.stop_reason == "rejected"]
        if kv is None:
            assert not res.rounds and not rejected and len(res.candidates) == 32, opt  # Best-of-32
        else:
            assert res.rounds and rejected and res.compute.peak_kv_tokens <= kv, (opt, res.compute.peak_kv_tokens)
            assert all(r.rows_kept < r.rows_before for r in res.rounds), opt  # each decision point rejects
    for opt, why in REFUSED_ON_CPU.items():
        with pytest.raises(ConfigError, match=why) as e:
            run_tiny(tiny_gen(), ["write a haiku"], n=2, overrides=[f"budget={opt}", "sampling.max_new_tokens=4"])
        assert e.value.key == "budget.mode" and "budget=cpu" in e.value.fix
    # On CUDA: the fixed budget stays fixed, unlimited stays unlimited, cuda sizes it from free device memory
    cuda = SimpleNamespace(
        device=torch.device("cuda"),
        kv_bytes_per_token=1024,
        layer_devices=lambda: {"cuda": 30},
        info=rodeco.EngineInfo(name="fast"),
    )
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10 * 2**30, 80 * 2**30))
    from_device = budget_from_device(10 * 2**30, 1024, 0.9, 2 * 2**30)  # (10 - 2) GiB * 0.9 / 1 KiB
    assert from_device == int(8 * 2**30 * 0.9 // 1024)
    for opt, kv in {**BOUNDED, "cuda": from_device}.items():
        cfg = rodeco.load_config([f"budget={opt}"])
        validate(cfg)
        assert make_budget(cfg, cuda).kv_tokens == kv, opt
    vllm = SimpleNamespace(**{**vars(cuda), "info": rodeco.EngineInfo(name="vllm", kv_pool_tokens=5000)})
    assert make_budget(rodeco.load_config(["budget=engine"]), vllm).kv_tokens == 5000  # the engine's own pool


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["budget.kv_tokens=null"], "budget.kv_tokens"),
        (["budget=unlimited", "budget.kv_tokens=4096"], "budget.kv_tokens"),
        (["budget.mode=pool"], "budget.mode"),
    ],
)
def test_a_budget_that_names_no_mode_or_two_is_refused(overrides, key):
    with pytest.raises(ConfigError) as e:
        validate(rodeco.load_config(overrides))
    assert e.value.key == key and "budget=" in e.value.fix


def test_every_generator_option_composes():
    for opt in options("generator"):
        cfg = rodeco.load_config([f"generator={opt}", "generator.model=some/model"])
        assert cfg.generator.model == "some/model" and cfg.generator.engine in ("auto", "fast", "hf")


def test_every_data_option_loads():
    for opt in options("data"):
        cfg = rodeco.load_config([f"data={opt}"])
        if cfg.data.path and not (REPO / cfg.data.path).exists() and not (SHARED_DATA / cfg.data.path).exists():
            pytest.skip(f"{cfg.data.path} is absent (../shared/data, the default data root, is not beside the repo)")
        cwd = os.getcwd()
        os.chdir(REPO)
        try:
            prompts = prompts_of(cfg.data)
        finally:
            os.chdir(cwd)
        assert prompts and all(p.text.strip() for p in prompts)


def test_every_experiment_composes_with_its_schema():
    plugins = default_plugins()
    for opt in options("experiment"):
        cfg = rodeco.load_config([f"experiment={opt}"])
        assert cfg.task == opt
        entry = plugins.experiments.get(opt)
        assert OmegaConf.get_type(cfg.experiment_args) is entry.args, opt  # typed: a typo fails at compose time
        assert not OmegaConf.missing_keys(cfg.experiment_args), opt  # every argument has its value in the YAML


@pytest.mark.integration
def test_cli_end_to_end_on_embedded_model(tmp_path: Path):
    rodeco_bin = Path(sys.executable).with_name("rodeco")
    cmd = [
        str(rodeco_bin),
        "data.prompts=[Write a haiku about autumn.,What is 2+2?]",
        "n=4",
        "sampling.max_new_tokens=32",
        "budget.kv_tokens=300",
        "reward=logprob",
        "output.all_candidates=true",
        f"hydra.run.dir={tmp_path}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "best of 4" in proc.stdout and "compute saved" in proc.stdout
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    recs = [json.loads(x) for x in lines]
    assert [r["prompt_index"] for r in recs] == [0, 1]
    for r in recs:
        assert r["best"]["text"] and r["rounds"] and r["compute"]["gen_decode_tokens"] > 0
        assert r["compute"]["peak_kv_tokens"] <= 300
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["compute"]["gen_flops"] > 0


@pytest.mark.integration
def test_cli_bad_input_exits_2_with_the_key(tmp_path: Path):
    rodeco_bin = Path(sys.executable).with_name("rodeco")
    proc = subprocess.run(
        [
            str(rodeco_bin),
            "policy.alpha=1.5",
            "data.prompts=[hi]",
            "generator.model=/nonexistent",
            f"hydra.run.dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert "generator.model" in proc.stderr or "policy.alpha" in proc.stderr
