"""The ``calibrated`` policy's rule: each row's chance to be the eventual best (finished candidates included), on the
scale fixed at the prompt's first decision point, the least likely rows rejected while the chance that the best is
among them stays at most delta; the start simulation deciding with the same rule."""

from __future__ import annotations

import hashlib
import json
import logging
import math

import numpy as np
import pytest

from rodeco import Calibration, PromptView, RoundView, best_probability, rejectable, standardize
from rodeco_policies.calibrated import CalibratedPolicy, simulate
from rodeco_policies.calibrated_scale import References


def calibration(rho: float, sd: float, link: tuple[float, float] | None = (0.0, 1.0), lengths=(4, 64)) -> Calibration:
    """Constant in length; ``link``: the finals' (offset, spread) against the partial scores (None: not measured)."""
    offset, spread = ([link[0]] * len(lengths), [link[1]] * len(lengths)) if link else ([], [])
    return Calibration(
        generator="g",
        partial_reward="r",
        reward="r",
        lengths=list(lengths),
        slope=[rho] * len(lengths),
        resid_sd=[sd] * len(lengths),
        final_offset=offset,
        final_spread=spread,
    )


def policy(cal: Calibration, delta: float = 0.05) -> CalibratedPolicy:
    return CalibratedPolicy(cal, delta, simulations=50)


def decide(pol: CalibratedPolicy, rounds, prompt: int = 0, min_reject: int = 0) -> list[list[int]]:
    """Feed one prompt's decision points in order, ``rounds`` = [(tokens, {candidate id: score}, finished finals)];
    each round's rows carry their earlier scores as history. The kept candidate ids at each."""
    seen: dict[int, list[float]] = {}
    out = []
    for r, (tokens, scores, finished) in enumerate(rounds):
        ids = list(scores)
        hist = np.array([seen[c] for c in ids] if r else [], dtype=np.float64).reshape(len(ids), r)
        pv = PromptView(
            prompt_index=prompt,
            candidate_ids=ids,
            scores=np.array([scores[c] for c in ids]),
            history=hist,
            finished_scores=list(finished),
            tokens_generated=tokens,
            min_reject=min_reject,
        )
        keep = pol.select(RoundView(round=r, prompts=[pv], max_rows_next=pv.k - min_reject, max_new_tokens=128))[0]
        out.append([ids[i] for i in keep])
        for c in ids:
            seen.setdefault(c, []).append(scores[c])
    return out


def first(scores, tokens: int = 16, finished=()) -> tuple:
    return tokens, dict(enumerate(np.asarray(scores, dtype=float).tolist())), list(finished)


# --- the probability of being the eventual best ---------------------------------------------------------------------


def test_best_probability_is_the_chance_to_end_above_every_other_and_the_finished_best():
    mu, sd = np.array([0.0, 0.5, 1.0, 2.0]), 0.5
    f = mu + sd * np.random.default_rng(0).standard_normal((400_000, 4))
    for best in (-math.inf, 1.5):
        winner = np.where(f.max(axis=1) > best, f.argmax(axis=1), 4)  # 4: the finished candidate stays best
        mc = np.bincount(winner, minlength=5)[:4] / len(f)
        np.testing.assert_allclose(best_probability(mu, sd, best), mc, atol=3e-3)
    assert best_probability(mu, sd).sum() == pytest.approx(1.0, abs=1e-6)
    assert best_probability(np.zeros(32), 1.0) == pytest.approx(np.full(32, 1 / 32), abs=1e-4)
    batch = np.random.default_rng(1).standard_normal((5, 7))
    np.testing.assert_allclose(
        best_probability(batch, 0.3, np.arange(5) - 2.0),
        [best_probability(m, 0.3, b) for m, b in zip(batch, np.arange(5) - 2.0)],
    )
    assert best_probability(np.array([1.0, 1.0, 0.0]), 0.0).tolist() == [0.5, 0.5, 0.0]  # sd 0: the tied top share
    assert best_probability(np.array([1.0, 1.0, 0.0]), 0.0, best=1.5).tolist() == [0.0, 0.0, 0.0]
    assert rejectable(np.array([0.01, 0.02, 0.03, 0.94]), 0.05) == 2  # 0.01 + 0.02 <= 0.05 < + 0.03


# --- the rule ----------------------------------------------------------------------------------------------------

SCORES = np.linspace(0.0, 1.0, 8)


def test_a_finished_candidate_with_a_high_final_makes_it_reject_more():
    """(Finals on the partial scores' scale here: the link (0, 1).)"""
    pol = policy(calibration(0.8, 0.6))  # each first decision point starts the prompt's reference afresh
    alone = decide(pol, [first(SCORES)])[0]
    high = decide(pol, [first(SCORES, finished=[1.2])])[0]
    low = decide(pol, [first(SCORES, finished=[-5.0])])[0]
    assert len(high) < len(alone) < len(SCORES) and set(high) <= set(alone)
    assert low == alone  # a finished candidate nobody active is below changes nothing
    # later too: the finished final is read on the scale of this decision point
    later = decide(policy(calibration(0.8, 0.6)), [first(SCORES), (32, {c: SCORES[c] for c in alone}, [])])[1]
    later_high = decide(policy(calibration(0.8, 0.6)), [first(SCORES), (32, {c: SCORES[c] for c in alone}, [1.2])])[1]
    assert len(later_high) < len(later)


def test_the_calibrations_link_puts_finals_on_the_scale():
    """Finals that sit 2 partial-score spreads above the partial scores (a response gains reward as it grows): the
    same finished final reads 2 spreads lower than a partial score would, and rejects fewer rows; finals twice as
    spread read twice as close to the mean."""
    same = decide(policy(calibration(0.8, 0.6)), [first(SCORES, finished=[1.2])])[0]
    above = decide(policy(calibration(0.8, 0.6, link=(2.0, 1.0))), [first(SCORES, finished=[1.2])])[0]
    wider = decide(policy(calibration(0.8, 0.6, link=(0.0, 2.0))), [first(SCORES, finished=[1.2])])[0]
    assert len(same) < len(wider) < len(above)


def test_without_a_link_finished_finals_are_left_out(caplog):
    """A calibration measured before final_offset/final_spread existed cannot place a final: left out, said once."""
    pol = policy(calibration(0.8, 0.6, link=None))
    with caplog.at_level(logging.INFO):
        assert decide(pol, [first(SCORES, finished=[1.2])]) == decide(pol, [first(SCORES)])
    assert "finished candidates are left out" in caplog.text


@pytest.mark.parametrize("min_reject", [0, 2, 5])
def test_with_rho_zero_it_keeps_everything_the_budget_allows(min_reject):
    kept = decide(
        policy(calibration(0.0, 1.0)), [first([0.3, 2.0, -1.0, 0.9, 1.1, 0.2, -0.4, 1.7])], min_reject=min_reject
    )[0]
    assert len(kept) == 8 - min_reject


def test_with_rho_zero_and_many_rows_it_rejects_only_what_delta_allows_blind():
    """Every row has the same chance 1/k to be the best: floor(delta * k) of them can go together."""
    scores = np.random.default_rng(0).standard_normal(50)
    assert len(decide(policy(calibration(0.0, 1.0), delta=0.05), [first(scores)])[0]) == 50 - 2


def test_with_rho_one_and_no_noise_it_keeps_only_rows_that_can_beat_the_best():
    scores = [0.0, 1.0, 2.0, 3.0, 4.0]  # mean 2, spread sqrt(2)
    perfect = calibration(1.0, 0.0)
    assert decide(policy(perfect), [first(scores)])[0] == [4]
    assert decide(policy(perfect), [first(scores + [4.0])])[0] == [4, 5]  # tied at the top: both can be the best
    assert decide(policy(perfect), [first(scores, finished=[4.5])])[0] == [4]  # nobody can: one must stay
    # a later decision point: survivors 2..4 now at 2.5, 3.5, 5.0 against a finished 4.0 (only 4 can beat it)
    later = (32, {2: 2.5, 3: 3.5, 4: 5.0}, [4.0])
    assert decide(policy(perfect), [first(scores), later])[1] == [4]


def test_it_never_keeps_more_than_the_budget_allows_and_always_one():
    scores = np.random.default_rng(3).standard_normal(12)
    assert len(decide(policy(calibration(0.0, 1.0)), [first(scores)], min_reject=11)[0]) == 1
    assert len(decide(policy(calibration(1.0, 0.0)), [first(scores, finished=[99.0])])[0]) == 1


# --- the scale: fixed at the first decision point, never re-standardized ---------------------------------------------


def rising() -> Calibration:
    """Little predictive at 16 tokens (the first decision point: most rows stay), much at 32."""
    return Calibration(
        generator="g", partial_reward="r", reward="r", lengths=[16, 32], slope=[0.3, 0.9], resid_sd=[0.95, 0.44]
    )


def rounds_of(low: float, wide: float = 1.0, finished=()) -> list:
    """Eight rows at 16 tokens; four survivors at 32 tokens, the last of them at ``low``."""
    r1 = first(wide * np.array([-1.6, -1.1, -0.7, -0.2, 0.2, 0.6, 1.2, 1.8]))
    return [r1, (32, {7: 1.9, 6: 1.5, 5: 1.3, 4: low}, list(finished))]


def test_decisions_do_not_move_with_the_survivors_spread():
    """Moving a hopeless survivor far down changes the survivors' own spread (a re-standardization would read every
    other row differently) but neither the spread the policy reads them on nor their decisions."""
    cal = rising()
    near, far = decide(policy(cal), rounds_of(-1.0))[1], decide(policy(cal), rounds_of(-30.0))[1]
    assert 4 not in near and near == far
    gap = [np.ptp(standardize(np.array([1.9, 1.5, 1.3, low]))[:3]) for low in (-1.0, -30.0)]
    assert gap[0] > 10 * gap[1]  # re-standardized, the three top rows' gaps would shrink tenfold


def test_the_spread_is_the_first_decision_points():
    """The same survivors' scores after a wide or a narrow first decision point: read on that spread, so decided
    differently (a re-standardization of the survivors would decide both alike)."""
    cal = rising()
    wide, narrow = decide(policy(cal), rounds_of(-1.0, wide=3.0))[1], decide(policy(cal), rounds_of(-1.0, 0.5))[1]
    assert len(wide) > len(narrow)


def test_decisions_are_invariant_to_the_rewards_units_and_to_a_shift_of_the_survivors():
    cal = rising()
    base = decide(policy(cal), rounds_of(-1.0, finished=[1.7]))
    mapped = [
        (t, {c: 3.0 * s - 7.0 for c, s in sc.items()}, [3.0 * f - 7.0 for f in fin])
        for t, sc, fin in rounds_of(-1.0, finished=[1.7])
    ]
    assert decide(policy(cal), mapped) == base  # any a * score + b, a > 0: the same decisions
    r1, (t, survivors, _) = rounds_of(-1.0)
    shifted = (t, {c: s + 5.0 for c, s in survivors.items()}, [])
    assert decide(policy(cal), [r1, shifted]) == decide(policy(cal), rounds_of(-1.0))


def test_the_location_corrects_the_survivors_selection():
    """Under the calibration's chain (partial at 8 -> at 16 -> final, correlation rho(8)/rho(16) = 0.5 between the
    two), the population's mean at 16 tokens is recovered from the top quarter alone, whose own mean is far above."""
    rng = np.random.default_rng(0)
    cal = Calibration(
        generator="g", partial_reward="r", reward="r", lengths=[8, 16], slope=[0.3, 0.6], resid_sd=[0.9, 0.8]
    )
    refs = References(cal.rho)
    n, m1, m2, s = 4000, -5.0, -3.0, 0.4  # the scores drift up 5 spreads between the two lengths
    x = m1 + s * rng.standard_normal(n)
    y = m2 + 0.5 * (x - m1) + s * math.sqrt(0.75) * rng.standard_normal(n)
    pv1 = PromptView(0, list(range(n)), x, np.zeros((n, 0)), [], 8, 0)
    assert refs.scale(pv1).location == pytest.approx(m1, abs=0.02)
    top = np.argsort(-x)[: n // 4]
    pv2 = PromptView(0, top.tolist(), y[top], x[top, None], [], 16, 0)
    scale = refs.scale(pv2)
    assert scale.location == pytest.approx(m2, abs=0.05 * s) and scale.spread == pytest.approx(s, rel=0.05)
    assert y[top].mean() - m2 > 0.5 * s  # what taking the survivors' mean would have made of it


def test_a_view_whose_first_decision_point_was_not_seen_is_read_on_its_own_rows(caplog):
    pol = policy(calibration(0.9, 0.45))
    pv = PromptView(3, [0, 1, 2], np.array([0.1, 0.5, 0.9]), np.array([[0.0], [0.4], [1.0]]), [], 32, 0)
    with caplog.at_level(logging.WARNING):
        kept = pol.select(RoundView(1, [pv], 3, 128))[0]
    assert "first this policy did not see" in caplog.text
    assert kept == decide(policy(calibration(0.9, 0.45)), [first([0.1, 0.5, 0.9], tokens=32)])[0]


# --- the start simulation decides with the same rule ---------------------------------------------------------------


@pytest.mark.parametrize("length", [4, 16, 64])
def test_the_start_simulation_uses_the_rule_select_uses(length):
    """At a first decision point select reads scores with mean 0 and spread 1 as they are: the simulation's scale.
    There select keeps what ``keep_count`` says, row by row or for a batch of simulated prompts."""
    cal = calibration(0.0, 1.0)
    cal.lengths, cal.slope, cal.resid_sd = [4, 64], [0.1, 0.9], [0.99, 0.44]
    rng = np.random.default_rng(length)
    zs = np.stack([standardize(rng.standard_normal(24)) for _ in range(6)])
    pol = policy(cal)
    counts = [len(decide(pol, [first(z, tokens=length)], prompt=i)[0]) for i, z in enumerate(zs)]
    assert counts == [pol.keep_count(z, length) for z in zs] == pol.keep_count(zs, length).tolist()


def test_simulate_decides_with_keep_count(monkeypatch):
    pol = policy(calibration(0.9, 0.44))
    calls = []
    rule = CalibratedPolicy.keep_count

    def spy(self, z, length, best=-math.inf):
        calls.append(np.shape(z))
        return rule(self, z, length, best)

    monkeypatch.setattr(CalibratedPolicy, "keep_count", spy)
    e, tokens = simulate(pol, 32, 4 * 128, 0, 128, 8, np.random.default_rng(0))
    assert calls and all(len(c) == 2 and c[0] >= 1 for c in calls)  # [simulated prompts, rows]
    assert e > 0 and 4 * 128 <= tokens < 32 * 128


# --- what a resumed sweep checks ---------------------------------------------------------------------------------


def test_identity_names_the_rule_and_the_finals_link():
    cal = calibration(0.5, 0.8)
    rule1 = hashlib.sha256(json.dumps([cal.lengths, cal.slope, cal.resid_sd]).encode()).hexdigest()[:16]
    ident = policy(cal).identity
    assert ident != rule1  # a sweep measured with the former rule does not resume under this one
    assert ident == policy(calibration(0.5, 0.8)).identity != policy(calibration(0.5, 0.8, link=None)).identity


def test_calibrate_measures_where_finals_sit_against_partial_scores():
    from rodeco.experiments.calibrate import calibration_stats

    rng = np.random.default_rng(0)
    rows = []
    for _ in range(6):
        partial = standardize(rng.standard_normal(12)) * rng.uniform(0.5, 2.0) - 4.0  # any units
        final = partial.mean() + 3.0 * partial.std() + 2.0 * (partial - partial.mean())  # 3 spreads up, 2x as wide
        rows.append({"lengths": {"8": {"partial": partial.tolist(), "final": final.tolist()}}})
    stats = calibration_stats(rows, [8], [1], bootstrap=10, seed=0)
    assert stats["final_offset"] == [pytest.approx(3.0)] and stats["final_spread"] == [pytest.approx(2.0)]
    cal = Calibration(generator="g", partial_reward="r", reward="r", lengths=[8], **stats)
    assert cal.final_link(8) == pytest.approx((3.0, 2.0)) and calibration(0.5, 0.8, link=None).final_link(8) is None


def test_the_public_builder_passes_identities_so_the_calibration_is_checked(caplog):
    """``Plugins.build_policy`` is a thin wrapper over the one builder (``Plugins.build``, what ``RoleBuilder`` uses):
    given identities, ``calibrated`` checks its file against them; without, it says that it could not."""
    from rodeco.common.validation import ConfigError
    from rodeco.core.calibration import identities
    from rodeco.plugins import BuildContext, default_plugins

    plugins = default_plugins()
    from conftest import REPO

    node = {
        "name": "calibrated",
        "calibration": str(REPO / "plugins/rodeco_policies/calibrations/smollm2--minilm_rm.json"),
    }
    good = identities("smollm2", ("minilm_rm", "84e7ae6d8e8da25d"), None)
    assert plugins.build_policy(node, BuildContext(), identities=good) is not None
    with pytest.raises(ConfigError, match="measured with another generator"):
        plugins.build_policy(node, BuildContext(), identities={**good, "generator": "meta-llama/Llama-3.2-1B"})
    with caplog.at_level("WARNING"):
        plugins.build_policy(node, BuildContext())
    assert "is not checked" in caplog.text
