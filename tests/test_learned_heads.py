"""How value_train fits the learned partial scorers (``rodeco_rewards.experiments.head_fit``), on tiny synthetic data:
text_value starts as ``same``, the fit is blind to what a prompt shares, Bradley-Terry recovers a direction, the
weights follow the length bucket, and the verdict prompts never reach the choice."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_rewards_preference_rm import WORDS
from test_rm_default import tiny_encoder_dir  # noqa: F401 - the fixture: the tiny BERT encoder both tests score with

from rodeco.common.state import ScoreRequest
from rodeco_rewards.experiments.head_fit import Examples, fit_anchored, fit_bt, fit_mse, fit_value_head, prepare
from rodeco_rewards.learned_heads import ASSETS, Head, TextValue, bucket_names, bucket_of, text_value_anchor

ALPHAS, EDGES = [1e-3, 1e-1, 10.0], [8, 16, 32, 64]


def synthetic(
    n_prompts: int,
    lengths: list[int],
    k: int,
    weights: dict[int, np.ndarray],
    seed: int,
    first: int = 0,
    noise: float = 0.3,
) -> Examples:
    """``k`` candidates per (prompt, length); the target is ``x @ weights[L]`` plus noise, standardized within the
    prompt; every prompt adds its own offset to every feature (which the fit must ignore)."""
    rng = np.random.default_rng(seed)
    f = len(next(iter(weights.values())))
    xs, ys, ps, ls = [], [], [], []
    for p in range(first, first + n_prompts):
        offset = 3.0 * rng.standard_normal(f)
        for L in lengths:
            x = rng.standard_normal((k, f))
            y = x @ weights[L] + noise * rng.standard_normal(k)
            xs.append(x + offset)
            ys.append((y - y.mean()) / y.std())
            ps.append(np.full(k, p))
            ls.append(np.full(k, L))
    return Examples(np.concatenate(xs), np.concatenate(ys), np.concatenate(ps), np.concatenate(ls))


def empty(f: int) -> Examples:
    return Examples(np.zeros((0, f)), np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


# --- text_value starts as `same` ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_minilm(tmp_path_factory, tiny_encoder_dir):  # noqa: F811 - the imported fixture
    """minilm_rm on a tiny random BERT encoder, its linear head with a non-trivial standardization."""
    from rodeco.plugins import BuildContext
    from rodeco_rewards.minilm.features import feature_dim
    from rodeco_rewards.minilm.head import BTHead, HeadShape, save_head
    from rodeco_rewards.minilm.reward import build_minilm_rm

    path = tmp_path_factory.mktemp("head")
    torch.manual_seed(0)
    head = BTHead(HeadShape(in_dim=feature_dim(16)))
    torch.nn.init.normal_(head.net.weight)
    head.mu.copy_(torch.randn(feature_dim(16)) * 0.1)
    head.sigma.copy_(torch.rand(feature_dim(16)) + 0.5)
    save_head(head, path / "head", {"max_length": 32})
    return build_minilm_rm(
        {"head": str(path / "head.json"), "encoder": str(tiny_encoder_dir), "device": "cpu"}, BuildContext()
    )


def partial_requests(n: int, seed: int = 0) -> list[ScoreRequest]:
    """Partial requests whose lengths fall in every bucket of EDGES."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = [3, 8, 12, 30, 50, 100][i % 6]
        out.append(
            ScoreRequest(
                " ".join(rng.choices(WORDS, k=4)),
                " ".join(rng.choices(WORDS, k=length // 2 + 1)),
                tuple(range(length)),
                partial=True,
            )
        )
    return out


def test_text_value_fitted_on_no_data_scores_exactly_as_same(tiny_minilm):
    """No fit or choose examples: every bucket is the reward's own head, and text_value's scores are the reward's
    partial scores of the same requests (to float32 tolerance)."""
    anchor = text_value_anchor(tiny_minilm.head, max_new=128)
    f = len(anchor.mean)
    head, recs = fit_anchored(empty(f), empty(f), anchor, EDGES, ALPHAS, ["mse", "bt"])
    head.meta = {"max_new_tokens": 128}
    assert head.buckets == 5 and [r["loss"] for r in recs] == ["anchor"] * 5
    assert [r["lengths"] for r in recs] == ["<=8", "9-16", "17-32", "33-64", "65+"]
    reqs = partial_requests(12)
    same = tiny_minilm.score(reqs)
    assert TextValue(head, tiny_minilm.encoder).score(reqs) == pytest.approx(same, abs=1e-5)
    assert len(set(np.round(same, 4))) > 6
    # the one-request-at-a-time contract: a request scores the same alone as in a batch
    tv = TextValue(head, tiny_minilm.encoder)
    assert [tv.score([r])[0] for r in reqs] == pytest.approx(tv.score(reqs), abs=1e-6)


@pytest.mark.parametrize("fit", [fit_mse, fit_bt])
def test_a_huge_penalty_keeps_the_anchor_order(fit):
    """With the penalty far above the data, ``delta`` vanishes and the scale of an anchor that agrees with the data
    stays positive: the anchor's order."""
    rng = np.random.default_rng(0)
    w_true = rng.standard_normal(6)
    w0 = w_true + rng.standard_normal(6)
    ex = synthetic(20, [8], 8, {8: w_true}, seed=1)
    anchor = Head.linear(np.zeros(6), np.ones(6), w0, 0.0, {})
    a, delta = fit(prepare(ex, anchor), 1e9)
    assert a > 0 and np.abs(delta).max() < 1e-6 * np.abs(a * w0).max()


def test_the_committed_reward_head_anchors_text_value_inputs():
    """The anchor built from the committed minilm_rm head has text_value's inputs (the reward's 789 features and the
    position) and names the reward's identity."""
    from rodeco_rewards.minilm.head import load_head
    from rodeco_rewards.minilm.reward import ASSET_STEM

    rm, meta = load_head(ASSET_STEM)
    anchor = text_value_anchor(rm, 128)
    assert len(anchor.mean) == meta["shape"]["in_dim"] + 2 == len(Head.load(ASSETS / "text_value").mean)
    assert anchor.meta["anchor"].startswith("minilm_rm:") and (anchor.w2[0][-2:] == 0).all()


# --- centring, Bradley-Terry, buckets --------------------------------------------------------------------------------


@pytest.mark.parametrize("loss", ["mse", "bt"])
def test_a_per_prompt_shift_of_the_features_does_not_change_the_fit(loss):
    """Features are centred within each (prompt, length) when fitting: adding a constant vector to every row of a
    prompt (fit and choose alike) leaves the weights as they were."""
    rng = np.random.default_rng(0)
    w = {8: rng.standard_normal(5), 16: rng.standard_normal(5)}
    fit, choose = synthetic(12, [8, 16], 8, w, seed=1), synthetic(6, [8, 16], 8, w, seed=2, first=100)

    def shifted(ex: Examples, seed: int) -> Examples:
        shift = np.random.default_rng(seed).standard_normal((ex.prompt.max() + 1, ex.x.shape[1])) * 5
        return Examples(ex.x + shift[ex.prompt], ex.y, ex.prompt, ex.length)

    anchor = Head.linear(np.zeros(5), np.ones(5), rng.standard_normal(5), 0.3, {})
    h1, r1 = fit_anchored(fit, choose, anchor, [8], ALPHAS, [loss])
    h2, r2 = fit_anchored(shifted(fit, 3), shifted(choose, 4), anchor, [8], ALPHAS, [loss])
    assert [r["alpha"] for r in r1] == [r["alpha"] for r in r2]
    np.testing.assert_allclose(h2.w2, h1.w2, rtol=1e-6, atol=1e-8)
    v1, _ = fit_value_head(fit, choose, [8], ALPHAS, [loss])
    v2, _ = fit_value_head(shifted(fit, 3), shifted(choose, 4), [8], ALPHAS, [loss])
    np.testing.assert_allclose(v2.std, v1.std, rtol=1e-9)
    np.testing.assert_allclose(v2.w2, v1.w2, rtol=1e-6, atol=1e-8)


def test_bradley_terry_recovers_a_known_direction():
    """The order within each group follows ``x @ w_true`` plus noise: the pairwise fit finds ``w_true``'s
    direction, from no anchor and from a wrong one."""
    rng = np.random.default_rng(0)
    w_true = rng.standard_normal(8)
    ex = synthetic(150, [8], 12, {8: w_true}, seed=1, noise=0.5)
    _, delta = fit_bt(prepare(ex, Head.linear(np.zeros(8), np.ones(8), np.zeros(8), 0.0, {})), 1e-4)
    assert cosine(delta, w_true) > 0.97
    wrong = rng.standard_normal(8)
    a, delta = fit_bt(prepare(ex, Head.linear(np.zeros(8), np.ones(8), wrong, 0.0, {})), 1e-4)
    assert cosine(a * wrong + delta, w_true) > 0.97


def test_bucketed_weights_follow_the_length():
    """The target follows feature 0 at length 8 and feature 1 at length 16: each bucket's weights say so, and
    scoring picks the bucket by the request's length."""
    e0, e1 = np.eye(4)[0], np.eye(4)[1]
    w = {8: e0, 16: e1}
    fit, choose = synthetic(30, [8, 16], 8, w, seed=1), synthetic(10, [8, 16], 8, w, seed=2, first=100)
    head, chosen = fit_value_head(fit, choose, [8], ALPHAS, ["mse", "bt"])
    w8, w16 = head.w2[0] * head.std, head.w2[1] * head.std  # in the features' own units
    assert cosine(w8, e0) > 0.95 and cosine(w16, e1) > 0.95
    assert [r["lengths"] for r in chosen["buckets"]] == ["<=8", "9+"]
    x = np.array([[1.0, 0, 0, 0], [0, 1.0, 0, 0]])
    s8, s16 = head(x, [8, 8]), head(x, [16, 16])
    assert s8[0] > s8[1] and s16[1] > s16[0]
    with pytest.raises(ValueError, match="needs the lengths"):
        head(x)


def test_length_buckets():
    assert bucket_of([1, 4, 8, 9, 16, 17, 64, 65, 1000], EDGES).tolist() == [0, 0, 0, 1, 1, 2, 3, 4, 4]
    assert bucket_names(EDGES) == ["<=8", "9-16", "17-32", "33-64", "65+"] and bucket_names([]) == ["all"]


# --- splits and the choice ------------------------------------------------------------------------------------------


def test_splits_are_disjoint_cover_the_prompts_and_are_seeded():
    from rodeco_rewards.experiments.learned_heads_train import split

    idx = list(range(3, 103))
    fit, choose, verdict = split(idx, 0.2, 0.25, seed=0)
    assert (len(fit), len(choose), len(verdict)) == (55, 20, 25)
    assert not (set(fit) & set(choose) or set(fit) & set(verdict) or set(choose) & set(verdict))
    assert sorted(fit + choose + verdict) == idx
    assert split(idx, 0.2, 0.25, seed=0) == (fit, choose, verdict)
    assert split(idx, 0.2, 0.25, seed=1) != (fit, choose, verdict)


def test_the_verdict_prompts_do_not_reach_the_choice():
    """train_head reads only the fit and choose prompts: replacing every verdict prompt's features and targets by
    others changes neither the weights nor what was chosen."""
    from rodeco_rewards.experiments.learned_heads_train import Targets, train_head

    rng = np.random.default_rng(0)
    w = {8: rng.standard_normal(6), 16: rng.standard_normal(6)}
    ex = synthetic(24, [8, 16], 8, w, seed=1)

    def dataset(ex: Examples) -> tuple[dict, Targets]:
        data, final = {}, {}
        for p in np.unique(ex.prompt):
            m = ex.prompt == p
            n = int(m.sum())
            data[int(p)] = {"x": ex.x[m], "candidate": np.arange(n), "length": ex.length[m]}
            final[int(p)] = ex.y[m]
        return data, Targets(final, {})

    ts = SimpleNamespace(fit=list(range(12)), choose=list(range(12, 18)), verdict=list(range(18, 24)), max_new=128)
    a = {"length_buckets": [8], "ridge_alphas": ALPHAS, "losses": ["mse", "bt"], "hidden_units": 0, "epochs": 1}
    head, chosen = train_head("value_head", *dataset(ex), ts, a, 0, False)
    other = synthetic(24, [8, 16], 8, {8: -w[8], 16: rng.standard_normal(6)}, seed=9)
    keep = np.isin(ex.prompt, ts.verdict)
    mixed = Examples(np.where(keep[:, None], other.x, ex.x), np.where(keep, other.y, ex.y), ex.prompt, ex.length)
    head2, chosen2 = train_head("value_head", *dataset(mixed), ts, a, 0, False)
    assert head2.identity == head.identity and json.dumps(chosen2) == json.dumps(chosen)
    # the choose prompts do reach it
    mixed = Examples(np.where(np.isin(ex.prompt, ts.choose)[:, None], other.x, ex.x), ex.y, ex.prompt, ex.length)
    assert json.dumps(train_head("value_head", *dataset(mixed), ts, a, 0, False)[1]) != json.dumps(chosen)


# --- head files ----------------------------------------------------------------------------------------------------


def test_a_head_file_from_before_buckets_loads_as_one_bucket(tmp_path):
    """An old file (one weight vector, a scalar intercept, no edges) loads with one bucket, scores as it did and
    keeps its identity; a bucketed head round-trips."""
    rng = np.random.default_rng(0)
    mean, std, w = rng.standard_normal(5), rng.random(5) + 0.5, rng.standard_normal(5)
    np.savez(tmp_path / "old.npz", mean=mean, std=std, w1=np.zeros((0, 0)), b1=np.zeros(0), w2=w, b2=np.asarray(0.25))
    (tmp_path / "old.json").write_text(json.dumps({"max_new_tokens": 16}))
    old = Head.load(tmp_path / "old")
    x = rng.standard_normal((3, 5))
    assert old.buckets == 1 and old(x, [4, 40, 400]) == pytest.approx((x - mean) / std @ w + 0.25)
    import hashlib

    h = hashlib.sha256()
    for arr in (mean, std, np.zeros((0, 0)), np.zeros(0), w, np.asarray([0.25])):
        h.update(np.ascontiguousarray(arr, dtype=np.float64).tobytes())
    assert old.identity == h.hexdigest()[:16]
    new = Head.linear(mean, std, np.stack([w, -w]), [0.0, 1.0], {"max_new_tokens": 16}, [8])
    new.save(tmp_path / "new")
    back = Head.load(tmp_path / "new")
    assert back.identity == new.identity and back(x, [4, 40, 4]) == pytest.approx(new(x, [4, 40, 4]))
    for kind in ("value_head", "text_value"):  # the committed heads, trained with buckets
        head = Head.load(ASSETS / kind)
        assert head.buckets == len(head.meta["length_buckets"]) == 5 and "verdict" in head.meta


def test_an_mlp_bucket_without_examples_takes_the_nearest_fitted_one():
    """value_head with a hidden layer: one MLP per bucket; buckets with no example copy the nearest fitted one."""
    from rodeco_rewards.experiments.head_fit import fit_mlp_buckets

    rng = np.random.default_rng(0)
    w = {8: rng.standard_normal(6), 16: rng.standard_normal(6)}
    fit, choose = synthetic(20, [8, 16], 8, w, seed=1), synthetic(6, [8, 16], 8, w, seed=2, first=100)
    head, chosen = fit_mlp_buckets(fit, choose, [8, 16, 32], ["mse", "bt"], 8, 3, 0, False)
    assert head.w1.shape == (4, 6, 8) and [b.get("copied_from") for b in chosen["buckets"]] == [
        None,
        None,
        "9-16",
        "9-16",
    ]
    assert all(b["loss"] in ("mse", "bt") and b["epochs"] >= 1 for b in chosen["buckets"][:2])
    x = rng.standard_normal((2, 6))
    assert head(x, [16, 16]) == pytest.approx(head(x, [40, 100]))
