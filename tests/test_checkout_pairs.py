"""``scripts/checkout_pairs.py``: one command run on this checkout and another, alternately, and a figure of each
paired by round."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rodeco.experiments.bench import checkout_pairs

WRITE = (
    "import json, sys, rodeco; "
    "json.dump({'x': {'rate': 3.0 if getattr(rodeco, 'OTHER', False) else 6.0}}, open(sys.argv[1] + '/o.json', 'w'))"
)


def test_each_round_runs_both_checkouts_and_pairs_their_figures(tmp_path: Path, capsys):
    other = tmp_path / "other"
    (other / "rodeco").mkdir(parents=True)
    (other / "rodeco" / "__init__.py").write_text("OTHER = True\n")  # the other checkout's rodeco, first on the path
    args = ["--other", str(other), "--rounds", "3", "--figure", "x.rate", "--output", "o.json"]
    out = checkout_pairs.main([*args, "--out", str(tmp_path / "p"), "--", "-c", WRITE, "{out}"])
    assert out["runs"] == {"this": [6.0] * 3, "other": [3.0] * 3} and out["ratios"] == [2.0] * 3
    assert out["this_over_other"]["geomean"] == pytest.approx(2.0)
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("this_over_other: 2.000")
    assert json.loads((tmp_path / "p" / "checkout_pairs.json").read_text())["ratios"] == [2.0] * 3
    assert sorted(p.name for p in (tmp_path / "p").iterdir() if p.is_dir())[:2] == ["round0_other", "round0_this"]


def test_an_other_checkout_without_rodeco_is_refused(tmp_path: Path):
    with pytest.raises(SystemExit):
        checkout_pairs.main(["--other", str(tmp_path), "--figure", "x", "--output", "o", "--out", str(tmp_path), "--"])
