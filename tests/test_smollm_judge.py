"""``smollm_judge``: a length-controlled Bradley-Terry head on SmolLM2's pooled hidden states, used as a judge.

The committed head loads and scores through the registry; its scoring path has no length input (a response's text
beyond the window cannot move its score, and the fitted length term is never read); the training code recovers a
known direction while a pure-length effect goes to the nuisance term; evaluation prompts never train it."""

from __future__ import annotations

import inspect
import random
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import SHARED_DATA

from rodeco import BuildContext, ScoreRequest, get_plugin_manager
from rodeco_rewards.experiments import judge_train as jt
from rodeco_rewards.smollm_judge import ASSET_STEM, POOLINGS, HiddenStateFeatures, JudgeHead, SmolLMJudge

LONG = (
    "Autumn is the season between summer and winter. Leaves turn red and gold, and the days grow shorter. "
    "Many trees drop their leaves to save water through the cold months. "
)


def committed() -> JudgeHead:
    return JudgeHead.load(ASSET_STEM)


def test_the_committed_head_is_what_its_json_says_and_was_validated():
    head = committed()
    m = head.meta
    assert m["model"] == "smollm2" and set(m["poolings"]) <= set(POOLINGS)
    assert len(head.w) == len(m["poolings"]) * 576 and np.isfinite(head.w).all() and (head.std > 0).all()
    assert m["length_control"] in jt.LENGTH_CONTROLS and m["max_response_tokens"] == 256
    assert m["identity"] == head.identity  # the weights are the ones that were written with this record
    acc = m["metrics"]["accuracy_shorter_chosen"]
    assert acc["n"] > 100 and acc["ci95"][0] <= acc["accuracy"] <= acc["ci95"][1]
    assert set(m["metrics"]["corruptions_scored_lower"]) == set(jt.CORRUPTIONS)


def test_the_committed_judge_scores_through_the_registry(smollm2):
    reward = get_plugin_manager().build_reward({"name": "smollm_judge"}, BuildContext(generator=smollm2))
    assert isinstance(reward, SmolLMJudge)
    reqs = [
        ScoreRequest("Write a haiku about autumn.", r, (), partial=False)
        for r in (
            "Red leaves drift and fall,\ncool wind hums through empty trees,\nthe year exhales slow.",
            "",
            "autumn autumn autumn",
        )
    ]
    batch = reward.score(reqs)
    assert len(batch) == 3 and all(isinstance(s, float) and np.isfinite(s) for s in batch)
    assert reward.cost.calls == 1 and reward.cost.tokens > 0
    assert reward.cost.flops >= 2.0 * reward.features.n_matmul_params * reward.cost.tokens
    alone = [reward.score([r])[0] for r in reqs]  # a request's score does not depend on its batch neighbours
    assert alone == pytest.approx(batch, abs=1e-4)


@pytest.fixture()
def tiny_judge(tiny_model, tiny_tokenizer):
    """A judge on the tiny Llama with a random head: the scoring path without SmolLM2."""
    feats = HiddenStateFeatures(
        tiny_model, tiny_tokenizer, max_prompt_tokens=32, max_response_tokens=24, batch_tokens=256
    )
    rng = np.random.default_rng(0)
    head = JudgeHead(
        np.zeros(2 * feats.dim),
        np.ones(2 * feats.dim),
        rng.normal(size=2 * feats.dim),
        {
            "poolings": ["mean", "last"],
            "model": "tiny",
            "dtype": "float32",
            "max_prompt_tokens": 32,
            "max_response_tokens": 24,
            "length_nuisance_beta": 0.5,
        },
    )
    return SmolLMJudge(feats, head)


def test_the_scoring_path_has_no_length_input(tiny_judge):
    # the head reads features only: no length argument anywhere on the path
    assert list(inspect.signature(JudgeHead.__call__).parameters) == ["self", "x"]
    assert list(inspect.signature(tiny_judge.features.features).parameters) == ["prompts", "responses", "poolings"]
    prompt = "write a haiku about autumn leaves"
    base = "the quick brown fox jumps over the lazy dog " * 4  # longer than the 24-token window
    assert len(tiny_judge.features.response_ids(base)) == 24
    reqs = [
        ScoreRequest(prompt, base, (), partial=False),
        ScoreRequest(prompt, base + "numbers 0 1 2 3 4 5 6 7 8 9 " * 30, (), partial=False),
    ]
    s = tiny_judge.score(reqs)
    assert s[0] == s[1]  # 300 more words past the window: the same score
    before = tiny_judge.score(reqs[:1])
    tiny_judge.head.meta["length_nuisance_beta"] = 1e6  # the fitted length term is a record, never read
    assert tiny_judge.score(reqs[:1]) == before
    short = tiny_judge.score([ScoreRequest(prompt, "the quick brown fox", (), partial=False)])
    assert short != before  # what it reads does move it


def test_the_tiny_judge_scores_independently_of_the_batch_and_reads_empty_responses(tiny_judge):
    texts = ["the quick brown fox", "", "give three tips for staying healthy " * 3, "numbers 0 1 2"]
    reqs = [ScoreRequest("explain why the sky is blue", t, (), partial=False) for t in texts]
    batch = tiny_judge.score(reqs)
    assert np.isfinite(batch).all()
    assert [tiny_judge.score([r])[0] for r in reqs] == pytest.approx(batch, abs=1e-5)
    assert tiny_judge.cost.calls == 5 and tiny_judge.cost.tokens > 0


def test_a_head_with_other_poolings_is_an_error_naming_the_key(tmp_path):
    stem = tmp_path / "h"
    JudgeHead(
        np.zeros(3),
        np.ones(3),
        np.ones(3),
        {"poolings": ["max"], "model": "m", "dtype": "float32", "max_prompt_tokens": 1, "max_response_tokens": 1},
    ).save(stem)
    with pytest.raises(Exception, match=r"judge.smollm_judge.head=.*poolings"):
        JudgeHead.load(stem)
    with pytest.raises(Exception, match=r"judge.smollm_judge.head=.*experiment=judge_train"):
        JudgeHead.load(tmp_path / "missing")


def synthetic(n: int = 4000, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairs whose preference is 2 x feature 0 plus 3 x the log length ratio ``u``; feature 1 is a length proxy
    (it follows ``u``) and carries no preference of its own."""
    rng = np.random.default_rng(seed)
    d = rng.normal(size=(n, 5))
    u = d[:, 1] + 0.5 * rng.normal(size=n)
    p = 1.0 / (1.0 + np.exp(-(2.0 * d[:, 0] + 3.0 * u)))
    flip = rng.random(n) > p  # the "chosen" side is the second one: the pair's difference changes sign
    sign = np.where(flip, -1.0, 1.0)
    return d * sign[:, None], u * sign, sign


def test_the_fit_recovers_the_direction_and_the_nuisance_absorbs_length():
    d, u, _ = synthetic()
    fit = jt.fit_bt(d, u, 1e-3, nuisance=True, balanced=False)
    assert fit.beta == pytest.approx(3.0, rel=0.2)
    cos = fit.w @ np.eye(5)[0] / np.linalg.norm(fit.w)
    assert cos > 0.97 and fit.w[0] == pytest.approx(2.0, rel=0.2) and abs(fit.w[1]) < 0.3
    naive = jt.fit_bt(d, u, 1e-3, nuisance=False, balanced=False)
    assert naive.beta == 0.0 and naive.w[1] > 1.0  # without the nuisance term the proxy of length takes it


def test_balanced_pair_weights_give_each_side_half():
    u = np.array([0.5, 0.2, 0.1, -0.3, 0.0])
    w = jt.pair_weights(u, balanced=True)
    assert w.sum() == pytest.approx(1.0) and w[u > 0].sum() == pytest.approx(w[u < 0].sum())
    assert jt.pair_weights(u, balanced=False) == pytest.approx(np.full(5, 0.2))


def test_cross_validation_picks_by_the_shorter_chosen_pairs():
    d, u, _ = synthetic(1200)
    dim = 5
    x = np.zeros((2 * len(u), len(POOLINGS), dim))
    x[0::2, 0], x[1::2, 0] = d / 2, -d / 2  # chosen and rejected texts: their difference is d
    prob = jt.Problem(
        x=x,
        chosen=np.arange(0, 2 * len(u), 2),
        rejected=np.arange(1, 2 * len(u), 2),
        u=u,
        shorter=u < 0,
        groups=[str(i // 4) for i in range(len(u))],
    )
    table = jt.cross_validate(prob, [["mean"]], ["none", "nuisance"], [1e-3], k=3, seed=0)
    by = {r["length_control"]: r for r in table}
    assert by["nuisance"]["cv_accuracy_shorter_chosen"] > by["none"]["cv_accuracy_shorter_chosen"] + 0.05
    assert jt.best_of(table)["length_control"] == "nuisance"


def test_bootstrap_resamples_instructions():
    margin = np.array([1.0, 1.0, -1.0, 1.0, 0.0])
    r = jt.bootstrap_accuracy(margin, ["a", "a", "b", "c", "c"], 500, seed=0)
    assert r["accuracy"] == pytest.approx(0.7) and r["instructions"] == 3
    assert r["ci95"][0] <= r["accuracy"] <= r["ci95"][1]


def test_corruptions_damage_the_text_as_named():
    text = "First point here.\n\nSecond point follows. It has two sentences.\n\nThird point ends it all."
    rng = random.Random(0)
    t = jt.corrupt(text, "truncated", rng)
    assert text.startswith(t) and len(t.split()) == len(text.split()) // 2
    assert jt.corrupt(text, "repeated", rng).count("First point here.") == 3
    for kind in ("shuffled_sentences", "shuffled_words"):
        s = jt.corrupt(text, kind, rng)
        assert s != text and sorted(s.split()) == sorted(text.split()) and s.count("\n\n") == 2


@pytest.mark.skipif(not (SHARED_DATA / "prefs").is_dir(), reason="needs ../shared/data (the preference pairs)")
def test_evaluation_prompts_are_excluded_from_the_training_pairs():
    from rodeco_rewards.prefs import load_pairs

    plugins = get_plugin_manager()
    held = jt.held_prompts(["alpacafarm100", "demo"], plugins, SHARED_DATA)
    af = jt.option("data", "alpacafarm100", plugins)["indices"]
    assert held.indices == frozenset(str(i) for i in af) and len(held.indices) == 100
    pairs = load_pairs("alpaca_train", SHARED_DATA)
    kept, removed = jt.exclude(pairs, held)
    assert removed["pairs_removed"] > 0 and not {p.group for p in kept} & held.indices
    demo = SimpleNamespace(prompt="  Write a haiku about AUTUMN. ", group="nope")  # matched by text too
    assert jt.exclude([demo], held)[0] == []
    # the committed head's training instructions: none is an evaluation prompt, and the exclusion is recorded
    meta = committed().meta
    assert not set(meta["train_instructions"]) & held.indices
    assert set(meta["data"]["train"]["held_out"]["data_options"]) >= {"alpacafarm100", "specrej100", "demo"}
    assert meta["data"]["train"]["held_out"]["pairs_removed"] > 0


def test_a_long_response_is_cut_to_the_window_at_a_sentence_end():
    words = lambda t: len(t.split())  # noqa: E731  (a token count: one per word)
    text = "One two three. Four five six seven.\nEight nine. Ten eleven twelve."
    assert jt.in_window(text, words, 100) == text
    assert jt.in_window(text, words, 8) == "One two three. Four five six seven."
    assert jt.in_window(text, words, 9) == "One two three. Four five six seven.\nEight nine."
    assert jt.in_window(text, words, 2) == ""


def test_synthetic_pairs_teach_their_direction_without_a_length_term():
    d, u, _ = synthetic()
    rng = np.random.default_rng(1)
    aug = rng.normal(size=(400, 5)) * 0.3
    aug[:, 2] += 1.0  # originals sit along feature 2 from their corrupted copies; the preference pairs ignore it
    plain = jt.fit_bt(d, u, 1e-3, nuisance=True, balanced=False, aug=aug, aug_weight=0.0)
    taught = jt.fit_bt(d, u, 1e-3, nuisance=True, balanced=False, aug=aug, aug_weight=0.3)
    assert abs(plain.w[2]) < 0.2 and taught.w[2] > 0.5
    assert taught.beta == pytest.approx(3.0, rel=0.25)  # the length term still models the pairs' length effect


def test_selection_prefers_settings_that_pass_the_corruption_check():
    table = [
        {
            "poolings": ["mean"],
            "length_control": "nuisance",
            "l2": 1.0,
            "augment_weight": 0.0,
            "cv_accuracy": 0.62,
            "cv_accuracy_shorter_chosen": 0.62,
            "cv_corruptions_lower": {"truncated": 0.2},
        },
        {
            "poolings": ["mean"],
            "length_control": "nuisance",
            "l2": 1.0,
            "augment_weight": 0.3,
            "cv_accuracy": 0.60,
            "cv_accuracy_shorter_chosen": 0.58,
            "cv_corruptions_lower": {"truncated": 0.9},
        },
    ]
    assert jt.best_of(table, min_corruption_rate=0.8)["augment_weight"] == 0.3
    assert jt.best_of(table, min_corruption_rate=0.0)["augment_weight"] == 0.0
    assert jt.best_of(table, augment_weights=[0.0], min_corruption_rate=0.8)["augment_weight"] == 0.0
