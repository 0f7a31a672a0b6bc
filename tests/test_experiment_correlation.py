"""``rodeco experiment=correlation`` end to end on the tiny random Llama (logprob reward, inline prompts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import open_dict
from scipy import stats

import rodeco
from rodeco.experiments import correlation
from rodeco.plugins import default_plugins
from rodeco.runner import run_decode

PROMPTS = ["write a haiku about autumn leaves", "give three tips for staying healthy"]


def tiny_cfg(**args):
    cfg = rodeco.load_config(["experiment=correlation"])
    with open_dict(cfg):
        cfg.sampling.max_new_tokens = 8
        cfg.experiment_args.prompts = PROMPTS
        cfg.experiment_args.n = 4
        cfg.experiment_args.lengths = [2, 4]
        cfg.experiment_args.rewards = ["logprob"]
        for k, v in args.items():
            cfg.experiment_args[k] = v
    return cfg


def test_correlation_end_to_end(tiny_gen, tmp_path: Path, capsys):
    out = correlation.run(tiny_cfg(), default_plugins(), tmp_path, gen=tiny_gen())
    res = json.loads((tmp_path / "correlation.json").read_text())
    assert (tmp_path / "correlation.png").stat().st_size > 1000
    assert res["lengths"] == [2, 4] and res["prompts"] == 2 and res["n"] == 4
    rows = res["per_prompt"]["logprob"]
    assert len(rows) == 2 and all(len(r["final"]) == 4 for r in rows)
    checked = 0
    for L in ("2", "4"):
        rs, taus = [], []
        for r, pr in zip(rows, out.results):
            cell = r["lengths"][L]
            longer = [c.candidate_id for c in pr.candidates if len(c.token_ids) > int(L)]
            assert cell["candidates"] == longer  # only candidates longer than L count
            if cell["pearson"] is not None:
                assert cell["pearson"] == pytest.approx(stats.pearsonr(cell["partial"], cell["final"]).statistic)
                assert cell["kendall"] == pytest.approx(stats.kendalltau(cell["partial"], cell["final"]).statistic)
                rs.append(cell["pearson"])
                taus.append(cell["kendall"])
                checked += 1
        s = res["summary"]["logprob"][L]
        assert s["prompts_used"] == len(rs)
        if rs:
            assert s["pearson"] == pytest.approx(sum(rs) / len(rs))
            assert s["kendall"] == pytest.approx(sum(taus) / len(taus))
    assert checked > 0  # the hand check above ran at least once
    lines = capsys.readouterr().out.strip().splitlines()
    assert any(x.startswith("correlation_logprob_pearson_len2: ") for x in lines)
    assert any(x.startswith("correlation_logprob_kendall_len4: ") for x in lines)


def test_teacher_forced_logprob_matches_decode(tiny_gen):
    """The full-length logprob score from one teacher-forced pass equals the decode loop's final score."""
    gen = tiny_gen()
    cfg = tiny_cfg()
    a = correlation._args(cfg)
    plugins = default_plugins()
    pool = run_decode(correlation.pool_config(cfg, a), plugins, out_dir=None, gen=gen)
    reward = correlation.build_reward("logprob", plugins, gen)
    n = 0
    for res in pool.results:
        lps = correlation.teacher_forced_logprobs(gen, res.prompt, [c.token_ids for c in res.candidates], batch=3)
        row = correlation.score_prompt(reward, gen, res, [2], lps)
        for c, mine in zip(res.candidates, row["final"]):
            assert mine == pytest.approx(c.score, abs=1e-4)
            n += 1
    assert n == 8


def test_unknown_reward_names_the_key(tiny_gen, tmp_path: Path):
    from rodeco.validation import ConfigError

    with pytest.raises(ConfigError, match="experiment_args.rewards"):
        # fails before the generator is loaded
        correlation.run(tiny_cfg(rewards=["no_such_reward"]), default_plugins(), tmp_path, gen=None)


def test_correlations_skips_small_or_constant():
    assert correlation.correlations([1.0, 2.0], [1.0, 2.0]) is None
    assert correlation.correlations([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]) is None
    r, tau = correlation.correlations([1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 4.0])
    assert r == pytest.approx(stats.pearsonr([1, 2, 3, 4], [1, 3, 2, 4]).statistic) and tau == pytest.approx(2 / 3)
