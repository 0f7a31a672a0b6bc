"""The learned partial scorers' training (``rodeco experiment=value_train``): a head recovers a known function of the
hidden state, the whole path on a tiny pool trains, judges and resumes, and examples group by (prompt, length)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import record_train_pool

from rodeco.common.state import ScoreRequest as ScoreRequestT
from rodeco.plugins import default_plugins


@pytest.mark.parametrize("hidden_units", [0, 32])
def test_a_head_recovers_a_known_function_of_the_hidden_state(hidden_units):
    """Within each group the final reward is a fixed function of the hidden state (plus noise; every group has its
    own offset): the trained head orders held-out groups with a mean within-group correlation above 0.9."""
    from rodeco_rewards.experiments.head_fit import Examples, fit_mlp_buckets, fit_value_head, group_pearsons

    rng = np.random.default_rng(0)
    w = rng.standard_normal(24)

    def examples(n_groups: int, first: int) -> Examples:
        X = rng.standard_normal((n_groups * 30, 24)) + np.repeat(rng.standard_normal((n_groups, 24)), 30, axis=0)
        y = X @ w + (np.tanh(X[:, 0] * X[:, 1]) if hidden_units else 0) + 0.2 * rng.standard_normal(len(X))
        p = np.repeat(np.arange(first, first + n_groups), 30)
        return Examples(X, y, p, np.full(len(X), 8))

    fit, choose, held = examples(80, 0), examples(20, 1000), examples(20, 2000)
    if hidden_units == 0:
        head, _ = fit_value_head(fit, choose, [8], [0.001, 0.1], ["mse"])
    else:
        head, _ = fit_mlp_buckets(fit, choose, [8], ["mse"], hidden_units, 40, 0, False)
    assert group_pearsons(head(held.x, held.length), held.y, held.groups).mean() > 0.9


def test_value_train_on_a_tiny_pool_trains_judges_and_resumes(tmp_path, tiny_gen, capsys, monkeypatch):
    """The whole value_train path on a pool recorded with hidden states: a head file per kind with its verdict
    against `same`, three disjoint splits and a weight vector per length bucket; a rerun reads the cached features
    instead of computing them; the head then scores partial requests."""
    from rodeco_rewards.experiments import learned_heads_train
    from rodeco_rewards.learned_heads import Head, ValueHead

    ov = [
        "reward=logprob",
        "sampling.max_new_tokens=16",
        "experiment=value_train",
        f"pool={tmp_path / 'pool'}",
        "experiment_args.lengths=[2,4,8]",
        "experiment_args.kinds=[value_head,text_value]",
        "experiment_args.exclude_data=[]",
        "experiment_args.choose_fraction=0.34",
        "experiment_args.verdict_fraction=0.34",
        "experiment_args.verdict_lengths=[2,4]",
        "experiment_args.length_buckets=[2,4]",
        "experiment_args.bootstrap=50",
        "output.progress=false",
    ]
    cfg = record_train_pool(ov, tmp_path / "pool", 8, tiny_gen())
    assert np.load(tmp_path / "pool" / "hidden" / "0.npy").shape[:2] == (8, 16)
    out = learned_heads_train.run(cfg, default_plugins(), tmp_path / "run")
    verdict = out.extra["kinds"]["value_head"]
    assert set(verdict) >= {"mean_diff", "diff_ci", "beats_same", "by_length", "chosen"}
    printed = capsys.readouterr().out
    assert "value_train_value_head_minus_same:" in printed and "value_train_value_head_len2:" in printed
    head = Head.load(tmp_path / "run" / "value_head")
    assert head.meta["verdict"]["beats_same"] == verdict["beats_same"] and head.buckets == 3
    assert [len(head.meta[f"{s}_prompts"]) for s in ("fit", "choose", "verdict")] == [2, 2, 2]
    assert sorted(head.meta["fit_prompts"] + head.meta["choose_prompts"] + head.meta["verdict_prompts"]) == list(
        range(6)
    )
    assert [b["lengths"] for b in head.meta["chosen"]["buckets"]] == ["<=2", "3-4", "5+"]
    tv = Head.load(tmp_path / "run" / "text_value")  # anchored on the committed minilm_rm head
    assert tv.buckets == 3 and tv.meta["chosen"]["anchor"].startswith("minilm_rm:")
    assert tv.meta["verdict_prompts"] == head.meta["verdict_prompts"]
    monkeypatch.setattr(learned_heads_train.Featurizer, "compute", lambda *a: pytest.fail("features computed again"))
    again = learned_heads_train.run(cfg, default_plugins(), tmp_path / "run")  # resumes from the cached features
    for kind in ("value_head", "text_value"):  # seeded: the same heads
        assert again.extra["kinds"][kind]["mean_diff"] == out.extra["kinds"][kind]["mean_diff"]
    d = dict(np.load(tmp_path / "run" / "features_value_head" / "0.npz"))
    hs = np.load(tmp_path / "pool" / "hidden" / "0.npy")
    assert d["x"].shape[1] == hs.shape[-1] + 2 and (d["length"] > 0).all()  # the hidden state, two position features
    row = int(np.flatnonzero(d["length"] == 4)[0])  # an example at length 4: candidate c, hidden state after 4 tokens
    c = int(d["candidate"][row])
    req = ScoreRequestT(
        prompt="p",
        response="r",
        response_ids=(1, 2, 3, 4),
        partial=True,
        hidden_state=np.asarray(hs[c, 3], dtype=np.float32),
    )
    got = ValueHead(head).score([req])[0]
    # by hand from the head's weights: [hidden state, log(1 + L), L / T] standardized, then the line of the bucket
    # of length 4 (3-4: the second)
    assert head.w1.size == 0 and head.meta["max_new_tokens"] == 16
    x = np.concatenate([np.asarray(hs[c, 3], dtype=np.float64), [np.log1p(4), 4 / 16]])
    assert got == pytest.approx(float((x - head.mean) / head.std @ head.w2[1] + head.b2[1]), rel=1e-9, abs=1e-9)
    # and the head on the features value_train trained it with, for the same example (stored as float32)
    assert got == pytest.approx(float(head(d["x"][row].astype(np.float64), 4)), rel=1e-4, abs=1e-4)


def test_examples_are_grouped_by_prompt_and_length_past_1000_tokens():
    """One group per (prompt, length) pair, numbered in the pairs' order: prompt 0 at length 1000 and prompt 1 at
    length 0 stay apart (the former key ``prompt * 1000 + length`` merged them)."""
    from rodeco_rewards.experiments.head_fit import group_ids, group_pearsons

    g = group_ids(np.array([0, 0, 0, 1, 1, 1]), np.array([1000, 1000, 1000, 0, 0, 0]))
    assert g.tolist() == [0, 0, 0, 1, 1, 1]
    assert group_ids(np.array([2, 1, 1, 1]), np.array([5, 1001, 7, 7])).tolist() == [2, 1, 0, 0]
    # within each group the prediction ranks perfectly; merged, the groups' offsets would make r negative
    pred, y = np.array([1.0, 2.0, 3.0, 11.0, 12.0, 13.0]), np.array([1.0, 2.0, 3.0, -10.0, -9.0, -8.0])
    assert group_pearsons(pred, y, g).tolist() == [1.0, 1.0]
