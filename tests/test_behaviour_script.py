"""``scripts/behaviour.py``: what it compares (every field but the times) and its verdict (exit 1 on any difference
or a bench ratio outside the tolerance). The runs themselves take minutes: the script is run by hand around a
refactor (docs/guide.md)."""

from __future__ import annotations

import json
import sys

import pytest

from rodeco.experiments.bench import behaviour


@pytest.fixture()
def beh():
    return behaviour


def test_times_are_dropped_and_nothing_else(beh, tmp_path):
    rec = {
        "prompt_index": 0,
        "best": {"text": "a", "score": 0.5, "token_ids": [1, 2]},
        "compute": {"gen_decode_tokens": 9, "time_s": {"decode": 1.2}, "record_seconds": 3.0, "wall_s": 4.0},
        "rounds": [{"tokens_generated": 8, "scores": {"0": 0.1}}],
    }
    assert beh.strip_times(rec) == {
        "prompt_index": 0,
        "best": {"text": "a", "score": 0.5, "token_ids": [1, 2]},
        "compute": {"gen_decode_tokens": 9},
        "rounds": [{"tokens_generated": 8, "scores": {"0": 0.1}}],
    }
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(json.dumps(rec) + "\n")
    b.write_text(json.dumps({**rec, "compute": {**rec["compute"], "time_s": {"decode": 9.9}}}) + "\n")
    assert beh.normalized(a) == beh.normalized(b)
    b.write_text(json.dumps({**rec, "best": {**rec["best"], "score": 0.50001}}) + "\n")
    assert beh.normalized(a) != beh.normalized(b)


@pytest.mark.parametrize(
    "now, code",
    [
        ({"demo": "x\n", "engine_bench_ratio": 2.05}, 0),
        ({"demo": "y\n", "engine_bench_ratio": 2.0}, 1),
        ({"demo": "x\n", "engine_bench_ratio": 1.8}, 1),
    ],
)
def test_check_compares_with_what_was_recorded(beh, tmp_path, monkeypatch, now, code):
    (tmp_path / "reference.json").write_text(json.dumps({"demo": "x\n", "engine_bench_ratio": 2.0}))
    monkeypatch.setattr(beh, "run_all", lambda out, bench, **kw: now)
    monkeypatch.setattr(sys, "argv", ["behaviour.py", "check", str(tmp_path)])
    assert beh.main() == code


def test_a_difference_is_named_by_its_fields_and_what_was_got_is_kept(beh, tmp_path, monkeypatch, capsys):
    rec = {"best": {"score": 0.5, "token_ids": [1, 2]}, "compute": {"gen_prefill_tokens": 40}}
    now = {"best": {"score": 0.50001, "token_ids": [1, 2, 3]}, "compute": {"gen_prefill_tokens": 37}}
    old, new = json.dumps(rec) + "\n", json.dumps(now) + "\n"
    assert beh.differences(old, new) == {
        "/best/score ~": 1,
        "/best/token_ids (lengths differ)": 1,
        "/compute/gen_prefill_tokens": 1,
    }
    assert beh.differences(old, old) == {}
    two = old + old  # a field one side lacks, counted on each line
    assert beh.differences(two, two.replace('"gen_prefill_tokens"', '"prefill"')) == {
        "/compute/gen_prefill_tokens (only before)": 2,
        "/compute/prefill (only now)": 2,
    }
    (tmp_path / "reference.json").write_text(json.dumps({"demo": old}))
    monkeypatch.setattr(beh, "run_all", lambda out, bench, **kw: {"demo": new})
    monkeypatch.setattr(sys, "argv", ["behaviour.py", "check", str(tmp_path)])
    assert beh.main() == 1
    assert "    /compute/gen_prefill_tokens: 1" in capsys.readouterr().out.splitlines()
    assert json.loads((tmp_path / "check.json").read_text()) == {"demo": new}
