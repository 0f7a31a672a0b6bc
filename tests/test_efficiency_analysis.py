"""The efficiency analysis on hand-built prompt records (no model): the curve's ends flagged as bounds, speedups
paired with fixed alpha 0.5 on the same resamples, the CIs of relative compute and of the gap closed, and the
all-prompt figures of the rows nothing chose."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from helpers import TM, records, run_record

from rodeco.experiments import analysis, bootstrap, render

REF = "fixed_alpha_0.5"
OLD_HEAD = [
    "speedup_fixed_alpha_0.5",
    "relative_compute_fixed_alpha_0.5",
    "speedup_fixed_alpha_0.5_ci_low",
    "speedup_fixed_alpha_0.5_ci_high",
    "relative_compute_best_policy",
    "speedup_best_policy_ci_low",
    "speedup_best_policy_ci_high",
    "calibrated_choice",
    "speedup_best_policy",
    "best_policy",
    "speedup_calibrated",
    "speedup_fixed_alpha_0.5_oracle",
    "gap_closed",
]  # the keys before this change


def quantile(x: float):
    return lambda p, final: (np.quantile(final, x), 3e9)


def summarize(methods: dict[str, Any], seed: int = 0, bootstrap_n: int = 200, **kw) -> dict[str, Any]:
    return analysis.summarize(
        records(methods, **kw), {"n": 2, "bootstrap": bootstrap_n, "scales": [1]}, TM, 20, list(methods), seed=seed
    )


def varying(shift: float):
    """Prompts that differ a lot (wide absolute CIs), ``shift`` higher in each prompt's distribution."""
    return lambda p, final: (np.quantile(final, min(1.0, 0.75 + shift + 0.2 * np.sin(p))), 3e9)


ENDS = {
    REF: quantile(0.7),
    "above": lambda p, final: (final.max() + 1.0, 5e9),
    "below": lambda p, final: (final.min(), 1e9),
    "calibrated_delta_0.1": lambda p, final: (final.min(), 2e9),
    f"{REF}_oracle": quantile(0.98),
}


def resamples(summary: dict[str, Any], n_prompts: int, seed: int, B: int) -> tuple[list, list]:
    """The report half's resamples, then all prompts', as ``summarize`` draws them."""
    rep = np.array(summary["halves"]["report"])
    rng = np.random.default_rng(seed)
    first = [rng.choice(rep, size=len(rep), replace=True) for _ in range(B)]
    every = np.arange(n_prompts)
    return first, [rng.choice(every, size=n_prompts, replace=True) for _ in range(B)]


def test_stats_flag_which_end_of_the_curve_clamped_the_speedup():
    t = summarize(ENDS)["methods"]
    above, below, on = (t[f"{k}@1"]["report"] for k in ("above", "below", REF))
    assert (above["bound"], above["beyond_curve"]) == ("lower", True)  # charged Best-of-16's cost: at least this
    assert (below["bound"], below["beyond_curve"]) == ("upper", False)  # charged Best-of-1's cost: at most this
    assert (on["bound"], on["beyond_curve"]) == (None, False)
    c = summarize(ENDS)["curve"]["report"]
    assert below["speedup_flops"] == pytest.approx(c["flops"][0] / below["flops"])
    assert above["speedup_flops"] == pytest.approx(c["flops"][-1] / above["flops"])


def test_headline_has_a_bound_for_every_speedup_and_keeps_the_old_keys_in_order():
    s = summarize(ENDS)
    head = analysis.headline(s)
    assert s["best_policy"] == "above" and s["best_calibrated"] == "calibrated_delta_0.1"
    assert [k for k in head if k in OLD_HEAD] == OLD_HEAD and list(head)[-5:] == OLD_HEAD[-5:]
    speedups = [k for k in head if k.startswith("speedup_") and not k.endswith(("_ci_low", "_ci_high", "_bound"))]
    assert all(f"{k}_bound" in head for k in speedups)
    assert head["speedup_best_policy_bound"] == "lower" and head["speedup_calibrated_bound"] == "upper"
    assert head[f"speedup_{REF}_bound"] is None and head[f"speedup_{REF}_oracle_bound"] is None
    # above / fixed 0.5: a numerator at least its figure over an exact one is at least the ratio
    assert head[f"speedup_best_policy_vs_{REF}_bound"] == "lower"


def test_markdown_marks_lower_and_upper_bounds():
    rows = {line.split(" | ")[0]: line for line in render.markdown(summarize(ENDS)).splitlines()}
    above, below, ref = rows["| SR above (budget x1)"], rows["| SR below (budget x1)"], rows[f"| SR {REF} (budget x1)"]
    assert above.count("≥") >= 4 and "≤" not in above
    assert below.count("≤") >= 4 and "≥" not in below
    assert "≥" not in ref and "≤" not in ref


def test_ratio_bounds():
    assert bootstrap.ratio_bound(None, None) is None
    assert bootstrap.ratio_bound("lower", None) == bootstrap.ratio_bound(None, "upper") == "lower"
    assert bootstrap.ratio_bound("upper", None) == bootstrap.ratio_bound(None, "lower") == "upper"
    assert bootstrap.ratio_bound("lower", "upper") == "lower"
    assert bootstrap.ratio_bound("lower", "lower") == bootstrap.ratio_bound("upper", "upper") == bootstrap.UNKNOWN


def test_pairing_with_fixed_alpha_half_is_tighter_than_the_absolute_cis():
    """The same prompts' difficulty moves both methods: their absolute CIs overlap, the paired ratio's excludes 1."""
    seed, B = 5, 300
    s = summarize({REF: varying(0.0), "fixed_alpha_0.3": varying(0.03)}, seed=seed, bootstrap_n=B)
    a, r = (s["methods"][f"{k}@1"]["report"] for k in ("fixed_alpha_0.3", REF))
    assert a["speedup_flops_ci"][0] < r["speedup_flops_ci"][1]  # the absolute CIs overlap
    pair = a[f"vs_{REF}"]
    assert pair["ratio"] == pytest.approx(a["speedup_flops"] / r["speedup_flops"])
    assert 1.0 < pair["ci"][0] < pair["ratio"] < pair["ci"][1]
    assert r[f"vs_{REF}"] == {"ratio": 1.0, "ci": [1.0, 1.0], "bound": None}
    # by hand: the ratio on each of the report half's resamples
    m = analysis.Measurements(records({REF: varying(0.0), "fixed_alpha_0.3": varying(0.03)}), 2, TM, 20)
    boots, _ = resamples(s, 40, seed, B)
    ratio = [
        analysis.stats(m, S, m.method("fixed_alpha_0.3", 1), 1, analysis.curve_of(m, S))["speedup_flops"]
        / analysis.stats(m, S, m.method(REF, 1), 1, analysis.curve_of(m, S))["speedup_flops"]
        for S in boots
    ]
    assert pair["ci"] == pytest.approx([np.percentile(ratio, 2.5), np.percentile(ratio, 97.5)])
    assert "fixed_alpha_0.5, paired" in render.markdown(s).replace("'s", "")


def test_relative_compute_and_gap_closed_cis_by_hand():
    seed, B = 2, 150
    methods = {REF: varying(0.0), "fixed_alpha_0.3": varying(0.05), f"{REF}_oracle": varying(0.15)}
    s = summarize(methods, seed=seed, bootstrap_n=B)
    m = analysis.Measurements(records(methods), 2, TM, 20)
    boots, _ = resamples(s, 40, seed, B)
    per = {k: [analysis.stats(m, S, m.method(k, 1), 1, analysis.curve_of(m, S)) for S in boots] for k in methods}
    rc = [x["relative_compute_memory_bound_model"] for x in per["fixed_alpha_0.3"]]
    r = s["methods"]["fixed_alpha_0.3@1"]["report"]
    assert r["relative_compute_memory_bound_model_ci"] == pytest.approx(np.percentile(rc, [2.5, 97.5]))
    sp = {k: np.array([x["speedup_flops"] for x in v]) for k, v in per.items()}
    gap = np.log(sp["fixed_alpha_0.3"] / sp[REF]) / np.log(sp[f"{REF}_oracle"] / sp[REF])
    ok = sp[f"{REF}_oracle"] > sp[REF]
    head = analysis.headline(s)
    assert s["best_policy"] == "fixed_alpha_0.3"
    assert [head["gap_closed_ci_low"], head["gap_closed_ci_high"]] == pytest.approx(np.percentile(gap[ok], [2.5, 97.5]))
    assert s["gap_closed_bootstrap"]["resamples"] == ok.sum()
    assert head["gap_closed_ci_low"] < head["gap_closed"] < head["gap_closed_ci_high"]


def test_gap_closed_is_nan_where_the_ceiling_is_not_above_the_base():
    g = bootstrap.gap_closed(np.array([2.0, 3.0, 2.0]), np.array([1.0, 1.0, 2.0]), np.array([4.0, 9.0, 1.5]))
    assert g[0] == pytest.approx(0.5) and g[1] == pytest.approx(0.5) and math.isnan(g[2])
    assert bootstrap.gap_closed_ci(np.array([2.0]), np.array([2.0]), np.array([1.0])) == {
        "ci": [pytest.approx(float("nan"), nan_ok=True)] * 2,
        "resamples": 0,
    }
    assert bootstrap.ci([1.0, float("nan"), 3.0]) == pytest.approx(np.percentile([1.0, 3.0], [2.5, 97.5]))


def test_rows_nothing_chose_are_also_reported_over_all_prompts():
    seed, B = 4, 120
    methods = {REF: varying(0.0), "fixed_alpha_0.3": varying(0.05), f"{REF}_oracle": varying(0.15)}
    s = summarize(methods, seed=seed, bootstrap_n=B)
    t = s["methods"]
    assert "all" in t[f"{REF}@1"] and "all" in t[f"{REF}_oracle@1"] and "all" not in t["fixed_alpha_0.3@1"]
    m = analysis.Measurements(records(methods), 2, TM, 20)
    every = np.arange(40)
    want = analysis.stats(m, every, m.method(REF, 1), 1, analysis.curve_of(m, every))
    got = t[f"{REF}@1"]["all"]
    assert got["speedup_flops"] == pytest.approx(want["speedup_flops"]) and s["curve"]["all"] == analysis.curve_of(
        m, every
    )
    _, boots = resamples(s, 40, seed, B)  # drawn after the report half's, which stay as they were
    sp = [analysis.stats(m, S, m.method(REF, 1), 1, analysis.curve_of(m, S))["speedup_flops"] for S in boots]
    assert got["speedup_flops_ci"] == pytest.approx(np.percentile(sp, [2.5, 97.5]))
    lo, hi = got["speedup_flops_ci"]
    rlo, rhi = t[f"{REF}@1"]["report"]["speedup_flops_ci"]
    assert hi - lo < rhi - rlo  # twice the prompts
    head = analysis.headline(s)
    assert (head[f"speedup_{REF}_all"], head[f"speedup_{REF}_all_ci_low"], head[f"speedup_{REF}_all_ci_high"]) == (
        got["speedup_flops"],
        lo,
        hi,
    )
    line = next(x for x in render.markdown(s).splitlines() if x.startswith(f"| SR {REF} (budget x1)"))
    assert line.rstrip(" |").endswith(f"{got['speedup_flops']:.2f} [{lo:.2f}, {hi:.2f}]")


def with_replicate(recs: list[dict[str, Any]], f) -> list[dict[str, Any]]:
    """The records with a second replicate (another set of candidates) of every method: ``f(p, final)``."""
    for p in recs:
        final = np.asarray(p["final"])
        p["replicates"] = [
            {
                "offset": 8,
                "methods": {k: {"1": run_record(*map(float, f(p["prompt_index"], final)))} for k in p["methods"]},
            }
        ]
    return recs


def test_replicates_average_in_the_figure_and_widen_the_ci_with_the_candidates_variance():
    """Each method replayed from two sets of candidates: the figure is the mean over them, and each resample draws
    one per prompt, so a replicate far from the other widens the CI (the candidates' sampling variance)."""
    methods = {REF: quantile(0.5)}
    a = {"n": 2, "bootstrap": 300, "scales": [1]}
    one = analysis.summarize(records(methods), a, TM, 20, list(methods))
    recs = with_replicate(records(methods), lambda p, final: (np.quantile(final, 0.5 + 0.45 * (-1) ** p), 3e9))
    two = analysis.summarize(recs, a, TM, 20, list(methods))
    assert (one["replicates"], two["replicates"]) == (1, 2)
    rep = np.array(two["halves"]["report"])
    finals = {p["prompt_index"]: np.asarray(p["final"]) for p in recs}
    m = analysis.Measurements(recs, 2, TM, 20)
    mean_best = [(np.quantile(finals[i], 0.5) + np.quantile(finals[i], 0.5 + 0.45 * (-1) ** i)) / 2 for i in rep]
    assert two["methods"][f"{REF}@1"]["report"]["improvement"] == pytest.approx(
        analysis.improvement_score(mean_best, m.hi[rep], m.lo[rep])
    )
    w1, w2 = (np.diff(s["methods"][f"{REF}@1"]["report"]["improvement_ci"])[0] for s in (one, two))
    assert w2 > 1.3 * w1


def test_one_replicate_draws_the_resamples_it_drew_before():
    """Without replicates the resamples (and so every CI) are those of the analysis before replicates existed."""
    s = summarize(ENDS, bootstrap_n=50)
    first, _ = resamples(s, 40, 0, 50)
    m = analysis.Measurements(records(ENDS), 2, TM, 20)
    run = m.method(REF, 1)
    boot = [analysis.stats(m, S, run, 1, analysis.curve_of(m, S))["improvement"] for S in first]
    assert s["methods"][f"{REF}@1"]["report"]["improvement_ci"] == pytest.approx(
        [np.percentile(boot, q) for q in (2.5, 97.5)]
    )


def test_a_methods_oracle_row_is_its_policy_and_schedule_deciding_by_the_oracle():
    """The chosen row's ceiling: the same policy and schedule with perfect partial scores, whatever partial reward
    the chosen row decided by."""
    from rodeco.experiments.analysis import oracle_row

    t = {
        f"{k}@1": {}
        for k in (
            "fixed_alpha_0.3",
            "fixed_alpha_0.3_oracle",
            "fixed_alpha_0.3_text_value",
            "fixed_alpha_0.5_start_16_oracle",
            "fixed_alpha_0.5_oracle",
            "calibrated_delta_0.05",
        )
    }
    assert oracle_row("fixed_alpha_0.3_text_value", t) == "fixed_alpha_0.3_oracle"
    assert oracle_row("fixed_alpha_0.3", t) == "fixed_alpha_0.3_oracle"
    assert oracle_row("fixed_alpha_0.5_start_16", t) == "fixed_alpha_0.5_start_16_oracle"
    assert oracle_row("fixed_alpha_0.5", t) == "fixed_alpha_0.5_oracle"
    assert oracle_row("calibrated_delta_0.05", t) is None
