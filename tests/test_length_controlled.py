"""``scripts/length_controlled.py``: a judge's Best-of-64 gain, raw and with the change in log characters controlled,
on the committed judged search snapshot (it only reads the file), and on a made-up snapshot whose judge is length."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import REPO

from rodeco.experiments.bench import length_controlled

SNAPSHOT = REPO / "docs" / "data" / "search_judged_af100x128.json.gz"


@pytest.fixture(scope="module")
def lc():
    return length_controlled


def test_the_committed_snapshot_gives_the_documented_chrf_figures(lc, capsys):
    out = lc.main([str(SNAPSHOT), "--judge", "chrf", "--resamples", "2000"])
    assert (out["prompts"], out["sets"], out["all_reported"]) == (50, 2, False)
    assert f"{out['raw_gain']['value']:+.2f}" == "+2.69"
    assert f"{out['controlled_gain']['value']:+.2f}" == "+0.57"
    assert f"{out['within_prompt_r']:+.2f}" == "+0.85"
    lo, hi = out["raw_gain"]["ci"]
    assert 1.0 < lo < 1.5 and 4.0 < hi < 4.6  # the documented [+1.26, +4.31], up to the bootstrap's draws
    lo, hi = out["controlled_gain"]["ci"]
    assert -0.95 < lo < -0.45 and 1.2 < hi < 1.6 and lo < 0 < hi  # documented [-0.73, +1.39]
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("raw_gain: +2.69 [") and lines[2].startswith("controlled_gain: +0.57 [")


def test_a_judge_that_is_only_length_gains_nothing_once_length_is_controlled(lc):
    rng = np.random.default_rng(0)
    winners: dict[str, list[dict]] = {"best_of_1": [], "best_of_64": []}
    for p in range(12):
        for s in range(2):
            for m, extra in (("best_of_1", 0), ("best_of_64", int(rng.integers(5, 60)))):
                text = "x" * int(20 + rng.integers(0, 30) + extra)
                winners[m].append(
                    {"prompt_index": p, "set": s, "text": text, "judge": {"chrf": 3.0 + 10 * np.log(len(text))}}
                )
    out = lc.analyse({"prompts": list(range(12)), "firsts": [0, 64], "winners": winners}, "chrf", resamples=200)
    assert out["raw_gain"]["value"] > 3 and out["raw_gain"]["ci"][0] > 0
    assert out["controlled_gain"]["value"] == pytest.approx(0, abs=1e-9)
    assert out["slope_per_log_char"]["value"] == pytest.approx(10)
    assert out["within_prompt_r"] == pytest.approx(1)


def test_a_snapshot_without_winners_texts_is_refused(lc):
    with pytest.raises(SystemExit, match="no winners' texts"):
        lc.analyse({"judged": {}}, "chrf")
    with pytest.raises(SystemExit, match="no ref_simx scores"):
        lc.main([str(SNAPSHOT), "--judge", "ref_simx", "--resamples", "10"])
