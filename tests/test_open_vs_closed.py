"""``scripts/open_vs_closed.py``: the same requests staggered and all at once through the open loop, paired."""

from __future__ import annotations

import json

import pytest

from rodeco.experiments.bench import open_vs_closed as ovc


def test_arrivals_give_one_request_a_call_or_all_at_once():
    one = ovc.Arrivals([1, 2, 3], one_at_a_time=True)
    assert [one.take(False), one.take(True), one.take(False), one.take(False)] == [[1], [2], [3], None]
    every = ovc.Arrivals([1, 2, 3], one_at_a_time=False)
    assert [every.take(True), every.take(False)] == [[1, 2, 3], None]


def test_both_runs_decode_the_same_requests_and_the_ratio_comes_last(tiny_gen, tmp_path, capsys):
    args = ["--out", str(tmp_path), "--data", "demo", "--requests", "3", "--best-of", "4", "--max-tokens", "12"]
    out = ovc.main([*args, "--every", "2", "--rounds", "2"], generator=tiny_gen("fast"))
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1].startswith("open_over_closed_tokens_per_s: ")
    assert len(out["rounds"]) == 2 and json.loads((tmp_path / "open_vs_closed.json").read_text())["ratio"]
    for r in out["rounds"]:
        st, cl = r["staggered"], r["closed"]
        assert st["requests"] == cl["requests"] == 3
        assert 0 < st["tokens"] <= 3 * 4 * 12 and st["seconds"] > 0
        assert r["ratio"] == pytest.approx((st["tokens"] / st["seconds"]) / (cl["tokens"] / cl["seconds"]))
    g, lo, hi = out["ratio"]
    assert lo <= g <= hi


@pytest.mark.parametrize("bad", [["--every", "0"], ["--rounds", "0"], ["--best-of", "-1"]])
def test_bad_arguments_are_refused_naming_them(bad, tmp_path, capsys):
    with pytest.raises(SystemExit):
        ovc.parse(["--out", str(tmp_path), *bad])
    assert bad[0] in capsys.readouterr().err
