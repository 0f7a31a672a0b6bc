"""The prefix-trained head (``rodeco experiment=prefix_train``, ``partial_reward=minilm_prefix``): the lookahead term
teaches the head what predicts a prefix's final reward without costing the pairs' accuracy; the whole path on a tiny
pool writes a head the embedded reward loads; a committed head is named by its name."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import record_train_pool

from rodeco.plugins import default_plugins
from rodeco_rewards.experiments.head_fit import group_ids
from rodeco_rewards.experiments.prefix_train import Prefixes, choose_r, fit_prefix_head, pair_accuracy


def synthetic_prefixes(n_prompts: int, k: int, seed: int) -> Prefixes:
    """Prefixes at two lengths whose final reward only feature 2 predicts (the pairs never see it vary), plus a
    per-prompt offset on every feature, which a within-prompt ranking must ignore."""
    rng = np.random.default_rng(seed)
    Z, f, p, L = [], [], [], []
    for i in range(n_prompts):
        for length in (4, 8):
            z = rng.standard_normal((k, 6)) + 2.0 * rng.standard_normal(6)
            Z.append(z)
            f.append(1.5 * z[:, 2] + 0.3 * rng.standard_normal(k) + 5.0 * i)
            p.append(np.full(k, i))
            L.append(np.full(k, length))
    prompt, length = np.concatenate(p), np.concatenate(L)
    rows = np.arange(len(prompt)).reshape(n_prompts, 2, k)  # candidate c of prompt i at 4 and at 8
    td = np.stack([rows[:, 0].reshape(-1), rows[:, 1].reshape(-1)], axis=1)
    return Prefixes(np.concatenate(Z), np.concatenate(f), group_ids(prompt, length), td)


def synthetic_pairs(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Chosen beats rejected along features 0 and 1; feature 2 is the same in both texts of a pair."""
    rng = np.random.default_rng(seed)
    zc, zr = rng.standard_normal((n, 6)), rng.standard_normal((n, 6))
    zr[:, 2] = zc[:, 2]
    swap = (zc[:, 0] + zc[:, 1]) < (zr[:, 0] + zr[:, 1])
    zc[swap], zr[swap] = zr[swap].copy(), zc[swap].copy()
    return zc, zr


def test_the_lookahead_term_learns_what_predicts_the_final_reward_at_a_price_the_choice_caps():
    """Feature 2 predicts the prefixes' final reward; features 0 and 1 decide the pairs but only add noise to the
    prefixes' order, so the lookahead term trades pair accuracy for prefix ranking as its weight grows. The choice
    keeps the best ranking among the fits that stay within max_accuracy_drop of Bradley-Terry alone."""
    from rodeco_rewards.experiments.prefix_train import PairSet, choose

    w0 = np.array([1.0, 1.0, 0.0, 0.0, 0.0, 0.0])  # the anchor: right on the pairs, blind to feature 2
    pen = np.full(6, 1e-3)
    pairs, held = synthetic_pairs(400, 0), synthetic_pairs(200, 1)
    fit, test = synthetic_prefixes(30, 8, 2), synthetic_prefixes(20, 8, 3)
    bt_only = fit_prefix_head(w0, pen, pairs, fit, 0.0, 0.0, 100)
    small, large = (fit_prefix_head(w0, pen, pairs, fit, mc, 0.0, 100) for mc in (0.003, 1.0))
    assert abs(choose_r(bt_only, test)) < 0.3  # Bradley-Terry alone has no reason to weigh feature 2
    assert choose_r(bt_only, test) + 0.2 < choose_r(small, test) < choose_r(large, test)
    assert choose_r(large, test) > 0.9  # a heavy lookahead term ranks held-out prefixes almost perfectly...
    assert pair_accuracy(large, held) < pair_accuracy(bt_only, held) - 0.05  # ...and costs the pairs
    assert pair_accuracy(small, held) >= pair_accuracy(bt_only, held) - 0.01
    a = {
        "max_iter": 100,
        "mc_weights": [0.003, 1.0],
        "td_weights": [0.0],
        "anchor_weights": [0.0],
        "max_accuracy_drop": 0.01,
    }
    w, rec = choose(w0, pen, PairSet(pairs, held, {}), fit, test, a, progress=False)
    assert [r["admissible"] for r in rec["grid"]] == [True, True, False]  # the anchor, mc 0.003, mc 1.0
    assert (rec["chosen"]["mc"], rec["chosen"]["td"]) == (0.003, 0.0) and np.allclose(w, small)
    near = fit_prefix_head(w0, pen, pairs, fit, 1.0, 0.0, 100, anchor=1e6)  # held at the committed head
    assert np.abs(near - w0).max() < 0.02 < 0.5 < np.abs(large - w0).max()
    smooth = fit_prefix_head(w0, pen, pairs, fit, 1.0, 100.0, 100)
    D = fit.Z[fit.td[:, 0]] - fit.Z[fit.td[:, 1]]
    assert np.mean((D @ smooth) ** 2) < np.mean((D @ large) ** 2)  # smoothness pulls adjacent scores together


def test_a_committed_head_is_named_by_its_name(tmp_path, monkeypatch):
    from rodeco_rewards.minilm.reward import ASSET_STEM, head_stem

    monkeypatch.chdir(tmp_path)
    assert head_stem("minilm_bt_head") == ASSET_STEM
    assert head_stem("minilm_bt_head.json") == ASSET_STEM
    (tmp_path / "minilm_bt_head.json").write_text("{}")  # a file of that name here wins: a path is a path
    assert head_stem("minilm_bt_head") == tmp_path.joinpath("minilm_bt_head").relative_to(tmp_path)
    assert head_stem("elsewhere/x.safetensors").as_posix() == "elsewhere/x"


def test_prefix_train_on_a_tiny_pool(tmp_path, tiny_gen, capsys):
    """The whole path: three disjoint splits of the pool's prompts, every (mc, td) fitted and the anchor a
    candidate, a verdict against `same`, a head file the embedded reward loads and scores with."""
    import rodeco
    from rodeco.common.state import ScoreRequest
    from rodeco.plugins import BuildContext
    from rodeco_rewards.experiments import prefix_train
    from rodeco_rewards.minilm.head import load_head

    ov = [
        "sampling.max_new_tokens=12",
        "experiment=prefix_train",
        f"pool={tmp_path / 'pool'}",
        "experiment_args.lengths=[2,4,8]",
        "experiment_args.verdict_lengths=[2,4]",
        "experiment_args.exclude_data=[]",
        "experiment_args.choose_fraction=0.34",
        "experiment_args.verdict_fraction=0.34",
        "experiment_args.mc_weights=[1.0]",
        "experiment_args.td_weights=[0.0,1.0]",
        "experiment_args.anchor_weights=[0.0,10.0]",
        "experiment_args.pair_limit=40",
        "experiment_args.max_iter=20",
        "experiment_args.bootstrap=50",
        "output.progress=false",
    ]
    cfg = record_train_pool(ov, tmp_path / "pool", 8, tiny_gen())
    out = prefix_train.run(cfg, default_plugins(), tmp_path / "run")
    assert [(r["candidate"], r["mc"], r["td"], r["anchor"]) for r in out.extra["grid"]] == [
        ("anchor", None, None, None),
        ("fit", 1.0, 0.0, 0.0),
        ("fit", 1.0, 1.0, 0.0),
        ("fit", 1.0, 0.0, 10.0),
        ("fit", 1.0, 1.0, 10.0),
    ]
    assert out.extra["pairs"]["pairs"] == 40 and out.extra["pairs"]["held_out_pairs"] > 0
    printed = capsys.readouterr().out
    assert "prefix_train_minilm_prefix_minus_same:" in printed and "prefix_train_chosen:" in printed
    head, meta = load_head(tmp_path / "run" / "minilm_prefix_head")
    assert sorted(meta["fit_prompts"] + meta["choose_prompts"] + meta["verdict_prompts"]) == list(range(6))
    assert meta["max_length"] == 256 and meta["trained_with"] == "rodeco experiment=prefix_train"
    reward = default_plugins().build_reward(
        {"name": "minilm_rm", "head": str(tmp_path / "run" / "minilm_prefix_head")}, BuildContext(device="cpu")
    )
    got = reward.score(
        [ScoreRequest(prompt="give three tips", response="Sleep, water", response_ids=(1, 2), partial=True)]
    )
    assert np.isfinite(got[0])
    with pytest.raises(rodeco.ConfigError, match="reward"):  # it refits minilm_rm's head, on minilm_rm's scores
        prefix_train.check_args(rodeco.load_config([*ov, "reward=logprob"]))


def test_the_option_is_minilm_rm_with_the_prefix_head():
    """``partial_reward=minilm_prefix`` (and an efficiency row deciding by it) selects the registered minilm_rm with
    the committed prefix head, not a reward called minilm_prefix."""
    from rodeco.compose import option_node

    plugins = default_plugins()
    assert option_node("reward", "minilm_prefix", plugins) == {"name": "minilm_rm", "head": "minilm_prefix_head"}
    assert option_node("reward", "logprob", plugins)["name"] == "logprob"
    assert option_node("reward", "length", plugins)["name"] == "length"
    import rodeco
    from rodeco.plugins import BuildContext
    from rodeco_rewards.minilm.head import head_identity, load_head
    from rodeco_rewards.minilm.reward import ASSET_STEM

    cfg = rodeco.load_config(["partial_reward=minilm_prefix"])
    built = plugins.build_reward(cfg.partial_reward, BuildContext(device="cpu", plugins=plugins))
    assert built.identity == head_identity(load_head(ASSET_STEM.with_name("minilm_prefix_head"))[0])
    assert built.identity != head_identity(load_head(ASSET_STEM)[0])  # not the default head
