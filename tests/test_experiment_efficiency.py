"""``rodeco experiment=efficiency`` and ``experiment=perplexity`` end to end on a pool of the tiny random Llama:
figures recomputed by hand from the JSON, choices made on the selection half, CIs, headline, resume."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from omegaconf import open_dict

import rodeco
from rodeco.common.validation import ConfigError
from rodeco.experiments import analysis, efficiency
from rodeco.experiments.metrics import compute_to_match, expected_best_of, improvement_score
from rodeco.plugins import default_plugins
from rodeco.replays.pool import Pool

PROMPTS = [f"w{i} w{i + 1} w{i + 2}" for i in range(0, 30, 3)]  # 10 prompts: halves of 5
HEAD = [
    "speedup_fixed_alpha_0.5",
    "relative_compute_fixed_alpha_0.5",
    "speedup_fixed_alpha_0.5_ci_low",
    "speedup_fixed_alpha_0.5_ci_high",
    "relative_compute_best_policy",
    "speedup_best_policy_ci_low",
    "speedup_best_policy_ci_high",
]
LAST = ["speedup_best_policy", "best_policy", "speedup_fixed_alpha_0.5_oracle", "gap_closed"]  # printed last
# (with the embedded reward, whose calibration is committed, speedup_calibrated comes after best_policy)


JUDGE = ["judge=custom", "judge.custom.function=length"]  # the response's characters: checkable by hand


def tiny_cfg(pool: Path, experiment: str = "efficiency", judge=("judge=none",), **args):
    reward = [] if experiment == "perplexity" else ["reward=logprob"]
    cfg = rodeco.load_config(
        [
            f"experiment={experiment}",
            *reward,
            "budget.min_tokens_per_round=2",
            f"pool={pool}",
            "sampling.max_new_tokens=12",
            "data.prompts=[" + ",".join(PROMPTS) + "]",
            *judge,
        ]
    )
    with open_dict(cfg):
        cfg.output.progress = False
        a = cfg.experiment_args
        a.candidates, a.n, a.alphas, a.adaptive_deltas, a.policies = 16, 2, [0.3, 0.5], [0.05], ["correlation"]
        a.starts, a.scales, a.bon_groups, a.bootstrap, a.live_check = [4, 32], [1, 2], 2, 200, 0
        a.replicates = 2
        for k, v in args.items():
            a[k] = v
    return cfg


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """One efficiency run, with the live check on two report prompts."""
    import contextlib
    import io

    from test_hooks import tiny_generator

    d = tmp_path_factory.mktemp("eff")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        out = efficiency.run(
            tiny_cfg(d / "pool", judge=JUDGE, live_check=2), default_plugins(), d / "run", gen=tiny_generator()
        )
    return d, out, buf.getvalue()


def test_efficiency_end_to_end(ran):
    d, out, printed = ran
    res = json.loads((d / "run" / "efficiency.json").read_text())
    assert (d / "run" / "efficiency.png").stat().st_size > 1000
    assert "| Best-of-16 |" in (d / "run" / "efficiency.md").read_text()
    sel, rep = res["halves"]["selection"], res["halves"]["report"]
    assert len(sel) == len(rep) == 5 and sorted(sel + rep) == list(range(10))
    assert (sel, rep) == tuple(map(sorted, analysis.split_halves(list(range(10)))))
    for half in ("selection", "report"):
        c = res["curve"][half]
        assert c["N"] == [1, 2, 4, 8, 16] and c["improvement"][1] == pytest.approx(100.0)  # Best-of-n = 100
    lines = printed.strip().splitlines()
    keys = [x.split(":")[0] for x in lines[-len(res["headline"]) :]]
    assert keys == list(res["headline"]) and keys[-4:] == LAST and set(HEAD) <= set(keys)
    assert any(x.startswith("pool_seconds: ") for x in lines)
    assert any(x.startswith("replay_seconds_per_policy: ") for x in lines)
    # replay is fair: three policies and Best-of-N (n, 2n and the N matching fixed alpha 0.5) run live on two
    # report prompts pick the same winners at the same cost; the time model is checked on each
    lc = res["live_check"]
    bons = [k for k in lc["live_over_model_seconds_by_method"] if k.startswith("best_of_")]
    assert {"best_of_2", "best_of_4"} <= set(bons) and len(bons) in (2, 3)
    n = 2 * (3 + len(bons))
    assert f"live_vs_replay_same_winner: {n}/{n}" in lines and f"live_vs_replay_same_decode_tokens: {n}/{n}" in lines
    assert all(f"live_seconds_over_time_model_{k}: " in printed for k in ["fixed_alpha_0.5", *bons])
    assert f"best_of_{efficiency.matched_bon(res, 16)}" in bons
    assert res["methods"]["fixed_alpha_0.5_start_32@1"] == {"infeasible": True}  # 32 rows do not fit Best-of-2's memory


def test_the_judges_figures_by_hand_printed_before_the_headline(ran):
    """With a judge: each set's (replicate's) Best-of-N prefix winners and each method's winner are judged; the
    judge's Best-of-1 point and fixed alpha 0.5's score are the mean length of those candidates' texts."""
    d, out, printed = ran
    res = json.loads((d / "run" / "efficiency.json").read_text())
    j = res["judged"]
    rep = res["halves"]["report"]
    pool = Pool(d / "pool")
    recs = {p["prompt_index"]: p for p in res["per_prompt"]}
    length = lambda i, c: len(pool.prompt(i).request(c).response)  # noqa: E731
    an = j["analysis"]["custom"]
    assert an["curve"]["sizes"] == [1, 2, 4, 8] and an["prompts"] == 5 and an["sets"] == 2
    assert an["curve"]["judge"][0] == pytest.approx(np.mean([length(i, c) for i in rep for c in (0, 8)]))
    ids = [recs[i]["methods"]["fixed_alpha_0.5"]["1"]["best_id"] for i in rep] + [
        recs[i]["replicates"][0]["methods"]["fixed_alpha_0.5"]["1"]["best_id"] for i in rep
    ]
    assert an["methods"]["fixed_alpha_0.5"]["judge"]["value"] == pytest.approx(
        np.mean([length(i, c) for i, c in zip(rep * 2, ids)])
    )
    assert j["analysis"]["guide"]["methods"]["fixed_alpha_0.5"]["judge"]["value"] == pytest.approx(
        np.mean([recs[i]["final"][c] for i, c in zip(rep * 2, ids)])
    )
    lines = printed.strip().splitlines()
    first_head = len(lines) - len(res["headline"])
    at = [k for k, x in enumerate(lines) if x.startswith("judge_custom_fixed_alpha_0.5: ")]
    assert len(at) == 1 and at[0] < first_head and any(x.startswith("judge_cost_custom: ") for x in lines)
    assert any(x.startswith("guide_bon_curve: N=1: ") for x in lines)


def test_a_reference_judge_on_prompts_without_references_stops_by_name(ran, tmp_path):
    d = ran[0]
    from test_hooks import tiny_generator

    with pytest.raises(ConfigError, match=r"judge\.chrf.*judge=none"):
        efficiency.run(
            tiny_cfg(
                d / "pool",
                judge=["judge=chrf"],
                live_check=0,
                alphas=[0.5],
                adaptive_deltas=[],
                policies=[],
                starts=[],
                scales=[1],
            ),
            default_plugins(),
            tmp_path / "run",
            gen=tiny_generator(),
        )


def test_the_report_half_figures_by_hand(ran):
    d, out, printed = ran
    res = json.loads((d / "run" / "efficiency.json").read_text())
    recs = {p["prompt_index"]: p for p in res["per_prompt"]}
    rep = [recs[i] for i in res["halves"]["report"]]
    hi = [expected_best_of(p["final"], 2) for p in rep]
    lo = [-expected_best_of([-x for x in p["final"]], 2) for p in rep]
    curve_imp = [improvement_score([expected_best_of(p["final"], N) for p in rep], hi, lo) for N in (1, 2, 4, 8, 16)]
    curve_flops = [sum(p["bon"][str(N)]["flops"] for p in rep) for N in (1, 2, 4, 8, 16)]
    m = res["methods"]["fixed_alpha_0.5@1"]["report"]

    def mean(p, key):  # over the two replicates: candidates 0.. and 8.. of the 16
        assert p["replicates"][0]["offset"] == 8
        runs = [p["methods"], p["replicates"][0]["methods"]]
        return sum(r["fixed_alpha_0.5"]["1"][key] for r in runs) / 2

    best = [mean(p, "best") for p in rep]
    assert m["improvement"] == pytest.approx(improvement_score(best, hi, lo))
    flops = sum(mean(p, "flops") for p in rep)
    assert m["flops"] == pytest.approx(flops)
    match = compute_to_match(m["improvement"], curve_flops, curve_imp)
    assert m["speedup_flops"] == pytest.approx((match or curve_flops[-1]) / flops)
    lo_ci, hi_ci = m["speedup_flops_ci"]
    assert lo_ci <= hi_ci
    # the improvement score's CI: the 2.5 and 97.5 percentiles over resamples of the report prompts
    i_lo, i_hi = m["improvement_ci"]
    assert min(improvement_score(best, hi, lo), i_lo) <= i_hi and i_lo < i_hi
    head = res["headline"]
    assert head["speedup_fixed_alpha_0.5"] == m["speedup_flops"]
    assert [head["speedup_fixed_alpha_0.5_ci_low"], head["speedup_fixed_alpha_0.5_ci_high"]] == [lo_ci, hi_ci]
    # the best policy is chosen on the selection half, and reported on the report half
    at1 = {
        k[:-2]: v
        for k, v in res["methods"].items()
        if k.endswith("@1") and "infeasible" not in v and not k[:-2].endswith("_oracle")
    }  # a ceiling, not a method: never chosen
    chosen = max(at1, key=lambda k: at1[k]["selection"]["speedup_flops"])
    assert head["best_policy"] == chosen
    assert head["speedup_best_policy"] == at1[chosen]["report"]["speedup_flops"]
    # the second replicate's rows are pool candidates 8, 9, ... (wrapping round), the first's 0, 1, ...
    for p in res["per_prompt"]:
        for scale in ("1", "2"):
            r0, r1 = p["methods"]["fixed_alpha_0.5"][scale], p["replicates"][0]["methods"]["fixed_alpha_0.5"][scale]
            assert r0["best_id"] < r0["n_start"] and (r1["best_id"] - 8) % 16 < r1["n_start"] == r0["n_start"]
    # the oracle ceiling: fixed alpha 0.5 deciding by final rewards does at least as well on every prompt
    for p in rep:
        assert p["methods"]["fixed_alpha_0.5_oracle"]["1"]["best"] >= p["methods"]["fixed_alpha_0.5"]["1"]["best"]
    ceiling, base = head["speedup_fixed_alpha_0.5_oracle"], head["speedup_fixed_alpha_0.5"]
    if ceiling > base:
        assert head["gap_closed"] == pytest.approx(np.log(head["speedup_best_policy"] / base) / np.log(ceiling / base))


def test_best_of_n_is_charged_one_prefill_and_n_candidates(ran):
    d, out, _ = ran
    pool = Pool(d / "pool")
    res = out.extra
    p = res["per_prompt"][0]
    L0 = p["L0"]
    shape = pool.shape
    for N in ("1", "4"):
        bon = p["bon"][N]
        prefill = L0 * shape.flops_per_token(L0 // 2)
        # every FLOP beyond the single prefill is decode (and the logprob reward costs none)
        assert bon["flops"] == pytest.approx(prefill + (bon["gen_flops"] - prefill))
        assert bon["reward_flops"] == 0 and bon["decode_tokens"] > 0
    assert p["bon"]["4"]["decode_tokens"] > 2 * p["bon"]["1"]["decode_tokens"]


def test_efficiency_resumes_and_refuses_other_settings(ran, monkeypatch, capsys):
    from test_hooks import tiny_generator

    d, out, printed = ran
    monkeypatch.setattr(efficiency.Measurer, "measure", lambda *a, **k: pytest.fail("measured again"))
    again = efficiency.run(tiny_cfg(d / "pool", live_check=2), default_plugins(), d / "run", gen=tiny_generator())
    same = json.dumps(again.extra["headline"], sort_keys=True) == json.dumps(out.extra["headline"], sort_keys=True)
    assert same  # every prompt came from efficiency_prompts.jsonl (json: a figure that is nan in both is the same)
    assert again.extra["live_check"]["same_winner"] == again.extra["live_check"]["n"]
    with pytest.raises(ConfigError, match="other settings"):
        efficiency.run(tiny_cfg(d / "pool", alphas=[0.4, 0.5]), default_plugins(), d / "run", gen=None)


def test_without_fixed_alpha_half_the_experiment_says_why_it_needs_it(tmp_path):
    """alphas=[] (or any list without 0.5) used to crash in the timings and the headline, which compare with it."""
    for alphas in ([], [0.3, 0.7]):
        with pytest.raises(ConfigError) as e:
            efficiency.run(tiny_cfg(tmp_path / "pool", alphas=alphas), default_plugins(), None, gen=object())
        assert e.value.key == "experiment_args.alphas" and "0.5" in e.value.fix and "reference" in e.value.problem


@pytest.mark.parametrize(
    "key,value",
    [
        ("n", 0),
        ("candidates", 1),
        ("alphas", [1.0]),
        ("scales", [2]),
        ("adaptive_deltas", [0.0]),
        ("starts", [0]),
        ("replicates", 0),
        ("replicates", 17),
    ],
)
def test_efficiency_bad_arguments_name_the_key(tmp_path, key, value):
    with pytest.raises(ConfigError, match=f"experiment_args.{key}"):
        efficiency.run(tiny_cfg(tmp_path / "pool", **{key: value}), default_plugins(), None, gen=object())


def test_perplexity_on_the_same_pool(ran, capsys):
    from rodeco.experiments import perplexity

    d, _, _ = ran
    cfg = tiny_cfg(d / "pool", "perplexity")
    out = perplexity.run(cfg, default_plugins(), d / "ppl", gen=None)  # the pool is complete: no model
    res = json.loads((d / "ppl" / "perplexity.json").read_text())
    rep = [p for p in res["per_prompt"] if p["prompt_index"] in res["halves"]["report"]]
    for p in rep:  # the perplexity form: every score is minus a perplexity
        assert all(x <= -1.0 for x in p["final"])
    rows = {r["method"]: r for r in res["table"]}
    for N in (1, 2, 4, 8, 16):  # Best-of-N keeps the lowest perplexity of N samples
        want = float(np.mean([-expected_best_of(p["final"], N) for p in rep]))
        assert rows[f"Best-of-{N}"]["perplexity"] == pytest.approx(want)
    chosen = out.extra["headline"]["chosen_alpha"]
    sel = [
        r
        for r in res["table_selection"]
        if r.get("scale") == 1 and r["label"] in ("fixed_alpha_0.3", "fixed_alpha_0.5")
    ]
    assert chosen == perplexity.choose_alpha(res["table_selection"])
    assert chosen in {r["label"] for r in sel}
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("gap_closed") and any(x.startswith("chosen_alpha: fixed_alpha_0.") for x in lines)


def test_perplexity_refuses_another_reward(tmp_path):
    from rodeco.experiments import perplexity

    cfg = tiny_cfg(tmp_path / "pool", "perplexity")
    assert cfg.reward.form == "perplexity"  # the experiment's default
    with open_dict(cfg):
        cfg.reward.form = "mean"
    with pytest.raises(ConfigError, match="reward.form=perplexity"):
        perplexity.run(cfg, default_plugins(), None, gen=object())


def test_at_compute_interpolates_in_log_flops():
    from rodeco.experiments.perplexity import at_compute

    assert at_compute(10.0, [1.0, 100.0], [4.0, 2.0]) == pytest.approx(3.0)  # halfway in log10
    assert at_compute(1000.0, [1.0, 100.0], [4.0, 2.0]) is None


def test_the_time_model_fits_a_known_cost(tmp_path):
    class FakePool:
        step_costs = {"rows": [1, 2, 4, 8] * 3, "context": [10] * 4 + [20] * 4 + [40] * 4}

    FakePool.step_costs["seconds"] = [
        0.01 + 0.002 * r + 1e-5 * r * c for r, c in zip(FakePool.step_costs["rows"], FakePool.step_costs["context"])
    ]
    tm = analysis.TimeModel.fit(FakePool(), [])
    assert (tm.a, tm.b, tm.c) == pytest.approx((0.01, 0.002, 1e-5), rel=1e-6) and tm.r2 == pytest.approx(1.0)
    run = {"steps": 10, "decode_tokens": 40, "rows_x_context": 800, "reward_s": 0.5}
    assert tm.seconds(run, prefill_s=0.2) == pytest.approx(0.2 + 0.1 + 0.08 + 0.008 + 0.5)


def test_a_calibrated_policy_without_a_calibration_for_a_partial_reward_is_left_out(ran, tmp_path, monkeypatch):
    """``allocate`` deciding by ``same`` runs on the calibration of the run's pair; deciding by the oracle, for which
    no calibration exists, it is left out and the run says why, instead of failing or running on the wrong model."""
    import rodeco_policies.calibrated as calibrated
    from rodeco import Calibration

    def committed_for(ids):  # a calibration of the run's own pair only: the oracle has none
        f = tmp_path / "cal.json"
        Calibration(
            generator=ids["generator"],
            partial_reward=ids["reward"],
            reward=ids["reward"],
            lengths=[4, 64],
            slope=[0.5, 0.5],
            resid_sd=[0.8, 0.8],
        ).save(f)
        return f

    monkeypatch.setattr(calibrated, "committed_for", committed_for)
    d, _, _ = ran
    cfg = tiny_cfg(
        d / "pool",
        policies=["allocate"],
        partial_rewards=["same", "oracle"],
        calibrated_deltas=[],
        alphas=[0.5],
        adaptive_deltas=[],
        starts=[],
        scales=[1],
        replicates=1,
    )
    res = efficiency.run(cfg, default_plugins(), tmp_path / "run").extra
    assert list(res["skipped"]) == ["allocate_oracle"] and "another partial_reward" in res["skipped"]["allocate_oracle"]
    assert "allocate@1" in res["methods"] and "allocate_oracle@1" not in res["methods"]
