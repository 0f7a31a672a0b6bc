"""``rodeco experiment=correlation`` end to end on a pool of the tiny random Llama (logprob reward)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from omegaconf import open_dict
from scipy import stats

import rodeco
from rodeco.common.validation import ConfigError
from rodeco.experiments import correlation
from rodeco.plugins import default_plugins
from rodeco.replays.pool import Pool

PROMPTS = ["write a haiku about autumn leaves", "give three tips for staying healthy", "explain the sky"]


def tiny_cfg(pool: Path, **args):
    cfg = rodeco.load_config(
        [
            "experiment=correlation",
            f"pool={pool}",
            "sampling.max_new_tokens=8",
            "data.prompts=[" + ",".join(PROMPTS) + "]",
        ]
    )
    with open_dict(cfg):
        cfg.output.progress = False
        a = cfg.experiment_args
        a.candidates, a.lengths, a.rewards, a.bootstrap = 6, [2, 4], ["logprob"], 200
        for k, v in args.items():
            a[k] = v
    return cfg


def test_correlation_end_to_end(tiny_gen, tmp_path: Path, capsys):
    correlation.run(tiny_cfg(tmp_path / "pool"), default_plugins(), tmp_path, gen=tiny_gen())
    res = json.loads((tmp_path / "correlation.json").read_text())
    assert (tmp_path / "correlation.png").stat().st_size > 1000
    assert res["lengths"] == [2, 4] and res["prompts"] == 3 and res["candidates"] == 6
    rows = res["per_prompt"]["logprob"]
    pool = Pool(tmp_path / "pool")
    checked = 0
    for L in ("2", "4"):
        rs, taus = [], []
        for r in rows:
            cands = pool.prompt(r["prompt_index"]).candidates
            cell = r["lengths"][L]
            assert cell["candidates"] == [i for i, c in enumerate(cands) if len(c.token_ids) > int(L)]
            for i, partial in zip(cell["candidates"], cell["partial"]):  # logprob (mean) of the first L tokens
                assert partial == pytest.approx(sum(cands[i].logprobs[: int(L)]) / int(L), abs=1e-6)
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
            lo, hi = s["pearson_ci"]
            assert min(rs) - 1e-12 <= lo <= hi <= max(rs) + 1e-12  # a mean of resampled prompts' values
    assert checked > 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert any(x.startswith("correlation_logprob_pearson_len2: ") for x in lines)
    assert any(x.startswith("correlation_logprob_kendall_len4: ") for x in lines)


def test_correlation_reuses_the_pool_and_its_scores(tiny_gen, tmp_path: Path):
    cfg = tiny_cfg(tmp_path / "pool")
    correlation.run(cfg, default_plugins(), tmp_path / "a", gen=tiny_gen())
    first = correlation.run(cfg, default_plugins(), tmp_path / "b", gen=None)  # no model: everything is cached
    again = json.loads((tmp_path / "a" / "correlation.json").read_text())
    assert first.extra["summary"] == again["summary"]


def test_unknown_reward_names_the_key(tmp_path: Path):
    with pytest.raises(ConfigError, match="experiment_args.rewards"):  # fails before any model is loaded
        correlation.run(tiny_cfg(tmp_path / "pool", rewards=["no_such_reward"]), default_plugins(), tmp_path)


def test_correlations_skips_small_or_constant():
    assert correlation.correlations([1.0, 2.0], [1.0, 2.0]) is None
    assert correlation.correlations([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]) is None
    r, tau = correlation.correlations([1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 4.0])
    assert r == pytest.approx(stats.pearsonr([1, 2, 3, 4], [1, 3, 2, 4]).statistic) and tau == pytest.approx(2 / 3)
    assert math.isfinite(r)
