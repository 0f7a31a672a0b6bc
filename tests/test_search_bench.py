"""``scripts/search_bench.py``'s live runs: which methods run on which prompts and sets, and how
particle_filter's temperature is set (a grid on the selection half, or given)."""

from __future__ import annotations

import argparse

from rodeco.experiments.bench import eos_share, search_bench, search_judged


def fake_run(calls: list):
    def run(i: int, node: dict, n: int, kv: int, first: int) -> dict:
        calls.append((i, dict(node), first))
        return {"best": -abs(node.get("temperature", 1.0) - 0.5) + i / 100}  # 0.5 is the best temperature

    return run


def args(tmp_path, **kw) -> argparse.Namespace:
    base = dict(
        run_dir=tmp_path,
        pool="pool",
        compile=False,
        report_only=True,
        methods=["particle_filter_start_16"],
        firsts=[0],
        pf_grid=[0.25, 0.5, 1.0],
        pf_temperature=None,
        alternatives=False,
    )
    return argparse.Namespace(**{**base, **kw})


def test_particle_filter_temperature_is_chosen_on_the_selection_half_or_given(tmp_path, monkeypatch):
    sb = search_bench
    records = [{"prompt_index": i, "budget": {"1": 100}} for i in range(4)]
    sel, rep = [0, 1], [2, 3]
    calls: list = []
    monkeypatch.setattr(sb, "live_runner", lambda *a, **k: fake_run(calls))
    done = sb.run_searches(args(tmp_path / "grid"), records, sel, rep)
    grid = [(i, n["temperature"]) for i, n, _ in calls if i in sel]
    assert sorted(grid) == sorted((i, t) for i in sel for t in (0.25, 0.5, 1.0))
    assert {n["temperature"] for i, n, _ in calls if i in rep} == {0.5}  # the grid's best, on the report half
    assert set(done[2]["methods"]) == {"particle_filter_start_16"}

    calls.clear()
    sb.run_searches(args(tmp_path / "given", pf_temperature=0.25), records, sel, rep)
    assert [(i, n["temperature"]) for i, n, _ in calls] == [(2, 0.25), (3, 0.25)]  # no grid, the report half only


def test_best_of_n_sizes_follow_the_candidate_sets():
    sizes = search_judged.set_sizes
    assert sizes([0, 64], 128) == [1, 2, 4, 8, 16, 32, 64]
    assert sizes([0], 16) == [1, 2, 4, 8, 16]  # one set of a 16-candidate pool
    assert sizes([0], 100) == [1, 2, 4, 8, 16, 32, 64]
    assert sizes([0, 8], 24) == [1, 2, 4, 8]  # the smaller set bounds both


def test_eos_share_cuts_a_pool_and_finds_where_best_of_n_winners_end(tmp_path, tiny_tokenizer, monkeypatch):
    """A pool at 8 tokens cut at 4: candidates longer than 4 end by length there, and the guide (here the length)
    picks the longest of the first N; the shares follow."""
    import json as js

    import rodeco_rewards.minilm.reward as minilm
    from rodeco.replays.pool import Pool, PoolCandidate, PoolPrompt

    es = eos_share
    pool = Pool.create(tmp_path / "pool", {"candidates": 3, "max_new_tokens": 8})
    tiny_tokenizer.save_pretrained(tmp_path / "pool" / "tokenizer")
    ids = tiny_tokenizer.encode("one two three four five six seven eight nine")
    lengths = {0: [(3, True), (8, False), (5, True)], 1: [(2, True), (3, True), (4, True)]}  # (tokens, ends by EOS)
    for i, cands in lengths.items():
        pool.write_prompt(
            PoolPrompt(
                i,
                f"prompt {i}",
                [1, 2],
                [
                    PoolCandidate(ids[:n], tiny_tokenizer.decode(ids[:n]), [0.0] * n, 1 if eos else None)
                    for n, eos in cands
                ],
                0.0,
            )
        )

    class Length:
        def score(self, reqs):
            return [len(r.response_ids) for r in reqs]

    monkeypatch.setattr(minilm, "build_minilm_rm", lambda *a, **k: Length())
    out = tmp_path / "eos.json"
    assert es.main([str(tmp_path / "pool"), "--cuts", "4", "8", "--n", "1", "3", "--json", str(out)]) == 0
    got = js.loads(out.read_text())["cuts"]
    # cut at 4: prompt 0 -> [eos, length, length], prompt 1 -> all eos (4 tokens end by EOS at exactly 4)
    assert got["4"]["candidates_eos"] == (1 / 3 + 1) / 2
    assert got["4"]["best_of_1_eos"] == 1.0  # the first candidates: 3 tokens with EOS, 2 tokens with EOS
    assert got["4"]["best_of_3_eos"] == (0 + 1) / 2  # the longest: prompt 0's is cut (ties: the first), 1's ends
    assert got["8"]["best_of_3_eos"] == (0 + 1) / 2 and got["8"]["candidates_eos"] == (2 / 3 + 1) / 2
