"""The ``verifier`` reward and ``rodeco experiment=verifier_train``: its AUC and its logistic fit on data whose answer
is known, and end to end on pools a tiny random Llama records for a task source of this test (its checker says a
response is right when its first line holds an "a"): held-out problems are dropped, the head is fitted and measured
per task and prefix, and the saved head scores a live run's partial and finished responses as ``reward`` and
``partial_reward``, the finished ones by the state of their last step."""

from __future__ import annotations

import json
from itertools import product

import numpy as np
import pytest
from omegaconf import open_dict

import rodeco
from rodeco import BuildContext, ConfigError, ScoreRequest, WinnerRule, get_plugin_manager, hookimpl
from rodeco.core.data import Prompt
from rodeco.experiments.record import record
from rodeco.plugins import default_plugins
from rodeco_rewards.experiments.verifier_metrics import auc, ece
from rodeco_rewards.experiments.verifier_train import fit_logistic
from rodeco_rewards.verifier import STATS, Verifier, features, trace_stats

ALL = ["output.all_candidates=true"]
WORDS = ["leaves", "river", "stone", "cloud", "lamp", "tiger", "snow", "bread"]


def test_auc_is_the_share_of_ordered_pairs():
    rng = np.random.default_rng(0)
    s = rng.integers(0, 5, 60).astype(float)  # many ties
    y = (rng.random(60) < 0.4).astype(float)
    pairs = [(a, b) for a, b in product(s[y == 1], s[y == 0])]
    brute = np.mean([1.0 if a > b else 0.5 if a == b else 0.0 for a, b in pairs])
    assert auc(s, y) == pytest.approx(brute)
    assert np.isnan(auc(s, np.ones(60)))


def test_a_logistic_fit_finds_the_direction_that_separates_and_is_calibrated():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4000, 5))
    p = 1 / (1 + np.exp(-(2.0 * x[:, 1] - 1.0)))
    y = (rng.random(4000) < p).astype(float)
    w, b = fit_logistic(x, y, 1e-4)
    assert np.argmax(np.abs(w)) == 1 and w[1] == pytest.approx(2.0, rel=0.15) and b == pytest.approx(-1.0, abs=0.15)
    assert ece(1 / (1 + np.exp(-(x @ w + b))), y) < 0.03


def test_within_problem_auc_counts_pairs_of_the_same_problem_and_point_only():
    from rodeco_rewards.experiments.verifier_metrics import END, Examples, within_auc
    from rodeco_rewards.experiments.verifier_train import pair_differences

    y = np.array([1, 0, 0, 1, 0, 1, 0.0])
    ex = Examples(
        x=np.arange(7, dtype=np.float32)[:, None],
        y=y,
        task=np.array(["t"] * 7),
        problem=np.array(["a", "a", "a", "b", "b", "c", "c"]),
        length=np.array([8, 8, 8, 8, 8, 8, 8]),
        at=np.array(["8", "8", "8", "8", "8", END, END]),
    )
    s = np.array([2.0, 1.0, 3.0, 0.0, 5.0, 1.0, 1.0])
    got = within_auc(s, ex, [8])["t"]
    assert got["8"] == pytest.approx(1 / 3)  # a: 2 > 1 but 2 < 3; b: 0 < 5 (b's rows are never compared with a's)
    assert got[END] == pytest.approx(0.5)  # a tie
    d = pair_differences(ex.x.astype(np.float64), ex)
    assert sorted(d[:, 0].tolist()) == [-2.0, -1.0, -1.0, -1.0]  # right minus wrong (0 - 1, 0 - 2, 3 - 4, 5 - 6)


def test_a_pairwise_head_ranks_within_problems():
    """Each problem has its own offset on feature 0 (what makes it easy), and within a problem feature 1 tells right
    from wrong: the pairwise head leans on feature 1, ranks within problems, and its mean probability is the rate."""
    from rodeco_rewards.experiments.verifier_metrics import Examples, within_auc
    from rodeco_rewards.experiments.verifier_train import fit_head

    rng = np.random.default_rng(3)
    P, C = 200, 8
    easy = rng.normal(size=P)
    x0 = np.repeat(easy, C) + 0.1 * rng.normal(size=P * C)
    x1 = rng.normal(size=P * C)
    logit = 3 * np.repeat(easy, C) + 1.5 * x1 - 1
    y = (rng.random(P * C) < 1 / (1 + np.exp(-logit))).astype(float)
    ex = Examples(
        x=np.stack([x0, x1], 1).astype(np.float32),
        y=y,
        task=np.array(["t"] * (P * C)),
        problem=np.repeat(np.arange(P).astype(str), C),
        length=np.full(P * C, 10),
        at=np.array(["end"] * (P * C)),
    )
    head = fit_head(ex, "stats", 1e-3, [], 0, 2, {}, "pairwise")
    w = head.w2[0]
    assert w[1] > abs(w[0])  # the within-problem direction
    s = head(ex.x, ex.length)
    assert within_auc(s, ex, [])["t"]["end"] > 0.7
    assert abs((1 / (1 + np.exp(-s))).mean() - y.mean()) < 0.03  # calibrated on the labels


def test_trace_statistics_are_what_they_say():
    lp = [-0.5, -1.5, -1.0]
    top = [[-0.1, -2.0], [-1.0, -1.0], [-0.5, -1.5]]
    st = dict(zip(STATS, trace_stats(lp, top, True, 30)))
    assert st["mean_logprob"] == pytest.approx(-1.0) and st["min_logprob"] == -1.5
    assert st["mean_confidence"] == pytest.approx(np.mean([0.1, 2.0, 1.0, 1.0, 0.5, 1.5]) * 1.0, rel=0.5)
    assert st["log_length"] == pytest.approx(np.log(4)) and st["length_share"] == pytest.approx(0.1)
    assert st["finished"] == 1.0
    req = ScoreRequest("p", "r", (1, 2, 3), partial=True, logprobs=tuple(lp), top_logprobs=tuple(map(tuple, top)))
    assert features([req], "stats", 30).shape == (1, len(STATS))
    with pytest.raises(ConfigError, match="hidden states"):
        features([req], "hidden+stats", 30)


class Vowels:
    """A task source of this test: problems are short word lists, a response is right when its first line holds an
    "a" (the tiny random model gives some of each)."""

    def generate(self, task, size, seed, config):
        rng = np.random.default_rng([seed, len(task)])
        out = []
        for i in range(size):
            words = " ".join(rng.choice(WORDS, 3))
            rec = {"gold_answer": "a", "source": "vowels", "task": task, "config": {}, "seed": seed, "index": i}
            out.append((f"{task}: say something about {words}", rec))
        return out

    def check(self, answer, record):
        return float(answer is not None and "a" in answer)

    def extractor(self, task):
        return "first_line"


class Register:
    @hookimpl
    def rodeco_register_sources(self, register):
        register("vowels", Vowels, "test problems")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model, tiny_tokenizer):
    """Two tasks' pools recorded by the tiny model (12 problems of 8 candidates each, with hidden states and top-5
    log-probs), the verifier trained on them, and the plugins that know the test's task source."""
    from rodeco.core.generator import TorchGenerator

    gen = TorchGenerator(tiny_model, tiny_tokenizer, engine="fast", name="tiny")
    plugins = get_plugin_manager(extra=[Register()])
    root = tmp_path_factory.mktemp("verifier")
    src = Vowels()
    cfg = rodeco.load_config(["reward=logprob", "sampling.max_new_tokens=24", "generator.model=tiny"])
    pools = []
    for task in ("alpha", "beta"):
        probs = [Prompt(i, q, rec) for i, (q, rec) in enumerate(src.generate(task, 12, 5, {}))]
        path = root / task
        record(cfg, plugins, path, probs, 8, gen=gen, top_logprobs=5)
        pools.append(str(path))
    held = [{"seed": 5, "size": 2}]  # the first two problems of each pool are held out
    cfg = rodeco.load_config(
        [
            "experiment=verifier_train",
            "experiment_args.prefixes=[4,8,16]",
            "experiment_args.l2=[0.01,1.0]",
            "experiment_args.bootstrap=20",
        ]
    )
    with open_dict(cfg):
        cfg.experiment_args.pools, cfg.experiment_args.holdout = pools, held
    out = rodeco.run(cfg, plugins, out_dir=root / "run")
    return out, root / "run", gen, plugins


def test_the_trainer_drops_held_out_problems_and_reports_per_task_and_prefix(trained):
    out, run_dir, _, _ = trained
    f = out.extra
    meta = json.loads((run_dir / "verifier.json").read_text())
    assert meta["dropped_held_out"] == 4 and [p["kept"] for p in meta["pools"]] == [10, 10]
    assert f["chosen"]["features"] in ("hidden+stats", "stats", "hidden")
    assert f["chosen"]["objective"] in ("pointwise", "pairwise")
    assert set(f["report_auc"]) == set(f["report_within_auc"]) == {"alpha", "beta", "pooled"}
    assert set(f["report_auc"]["pooled"]) == set(f["report_within_auc"]["pooled"]) == {"4", "8", "16", "end"}
    assert set(f["ablation"]) == {
        f"{o}/{k}" for o in ("pointwise", "pairwise") for k in ("hidden+stats", "stats", "hidden")
    }
    assert set(f["leave_one_task_out"]) == {"alpha", "beta"}
    curve = f["learning_curve"]  # the chosen head on a quarter, half and all of the fit problems
    counts = [int(k.split()[0]) for k in curve]
    assert counts == sorted(counts) and len(set(counts)) == 3 and counts[-1] == f["problems"]["fit"]
    assert all(set(row) == {"4", "8", "16", "end"} for row in curve.values())
    assert 0 < f["right_rate"] < 1
    cell = f["report_auc"]["pooled"]["end"]
    assert 0 <= cell["auc"] <= 1 and cell["ci"][0] <= cell["auc"] <= cell["ci"][1]
    assert len(f["tried"]) == 12 and f["examples"]["report"] > 0
    pick = f["best_of_pool"]["pooled"]  # the head's pick among a problem's candidates: between a random pick and any
    assert 0 <= pick["verifier"][0] <= pick["any"][0] and pick["random"][0] <= pick["any"][0]
    # the chosen setting is the best within problems on the choose problems
    best = max(f["tried"], key=lambda t: t["choose_within_auc"])
    assert (best["objective"], best["features"], best["l2"]) == tuple(f["chosen"].values())


def test_the_trained_head_guides_a_live_run_as_reward_and_partial_reward(trained):
    _, run_dir, gen, plugins = trained
    head = str(run_dir / "verifier")
    reward = plugins.build_reward({"name": "verifier", "head": head}, BuildContext(generator=gen, plugins=plugins))
    assert isinstance(reward, Verifier) and reward.needs_logprobs

    def decode(policy: str, *overrides: str):  # one prompt, six rows, the trained head as the reward
        common = [f"reward.head={head}", "budget=unlimited", "sampling.max_new_tokens=24", "output.all_candidates=true"]
        out = rodeco.decode(
            ["alpha: say something about snow"],
            generator=gen,
            n=6,
            reward="verifier",
            policy=policy,
            overrides=[*common, *overrides],
        )
        return out.results[0]

    r = decode("particle_filter", "policy.decision_tokens=8")
    assert len(r.rounds) == 2 and all(np.isfinite(list(rd.scores.values())).all() for rd in r.rounds)
    finals = [c for c in r.candidates if c.finished]
    assert finals and all(np.isfinite(c.score) for c in finals) and r.best.score == max(c.score for c in finals)
    # as a vote's weight: the same run with the verifier-weighted vote picks the answer of most weight
    vote = decode("none", "winner.rule=weighted", "winner.extractor=first_line")
    fin = [c for c in vote.candidates if c.finished]
    weight: dict[str, float] = {}
    for c in fin:
        a = WinnerRule.normalize(c.text.strip().splitlines()[0]) if c.text.strip() else ""
        if a:
            weight[a] = weight.get(a, 0.0) + float(np.exp(c.score - max(x.score for x in fin)))
    assert weight, "no finished candidate voted"
    assert WinnerRule.normalize(vote.best.text.strip().splitlines()[0]) == max(weight, key=weight.get)


def test_a_missing_verifier_says_how_to_train_one(tmp_path):
    with pytest.raises(ConfigError, match="verifier_train"):
        default_plugins().build_reward({"name": "verifier", "head": str(tmp_path / "none")}, BuildContext())


def test_the_committed_verifier_refuses_another_generators_rows(tiny_model, tiny_tokenizer):
    from rodeco.core.generator import TorchGenerator

    gen = TorchGenerator(tiny_model, tiny_tokenizer, engine="fast", name="tiny")
    with pytest.raises(ConfigError, match="trained on smollm2's samples"):
        default_plugins().build_reward({"name": "verifier"}, BuildContext(generator=gen))
    head = default_plugins().build_reward({"name": "verifier"}, BuildContext())
    assert isinstance(head, Verifier) and head.head.meta["objective"] in ("pointwise", "pairwise")
