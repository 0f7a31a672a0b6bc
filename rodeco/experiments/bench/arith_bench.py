"""Accuracy against FLOPs on a verifiable set: seeded arithmetic problems with exact answers, decoded live by the
generator (default: the embedded SmolLM2), every method guided by one reward (``--reward``; default ``logprob``: the
generator's own mean token log-probability; ``minilm_rm``: the default reward model; none is told the answer).

Methods, each live and charged all it does (prefill, decode of every row, copies, every scorer call):

- ``bon_N``: Best-of-N, the winner by reward; ``vote_N`` / ``wvote_N``: the same candidates, the winner by majority
  vote / reward-weighted vote over the extracted answer (``winner.rule``, ``last_number``), which costs the same;
- ``sr_N``: Speculative Rejection (``fixed``, alpha 0.5) from N rows at Best-of-4's memory, the winner by reward;
- ``pf_N``: ``particle_filter`` from N rows at Best-of-4's memory (winner by reward, and ``pf_N_wvote``);
- ``beam_N`` / ``dvts_N``: ``beam`` and ``dvts`` (``beam_width`` 4) from N rows at Best-of-4's memory.

Accuracy is the share of problems whose winner's last number is the answer, with a bootstrap 95% CI over problems;
FLOPs are the mean per problem (generator and reward). Nothing is chosen on these problems: every method runs at
its defaults (the search policies decide every 8 tokens of the 32). Results are written per problem as they finish
(``--out DIR``, resumable; a rerun with more ``--methods`` runs only what a problem lacks), then summarized::

    python scripts/arith_bench.py --problems 200 --reward minilm_rm --out runs/arith200_minilm
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
from pathlib import Path

import numpy as np

from rodeco.experiments.bootstrap import mean_ci

METHODS = ("bon_1", "bon_4", "bon_16", "sr_16", "pf_16", "pf_4", "beam_16", "dvts_16")
SEARCH = {"pf": "particle_filter", "beam": "beam", "dvts": "dvts"}


N_DISTINCT = 2 * 51 * 29 + 8 * 8  # a + b and a - b with a in 10..60, b in 2..30; a * b with a, b in 2..9


def problems(k: int, seed: int, distinct: bool = True) -> list[tuple[str, int]]:
    """``k`` seeded problems: sums and differences of two-digit numbers, products of one-digit ones. ``distinct``:
    a problem drawn again is skipped (the draws go on until there are ``k``), so no problem counts twice;
    otherwise every draw is kept (the 40-problem table in docs/results.md was made so: 38 distinct)."""
    if distinct and k > N_DISTINCT:
        raise ValueError(f"--problems {k}: there are only {N_DISTINCT} distinct problems; ask for at most that many")
    rng = random.Random(seed)
    out: list[tuple[str, int]] = []
    seen: set[str] = set()
    while len(out) < k:
        kind = rng.choice("+-*")
        a, b = (rng.randint(2, 9), rng.randint(2, 9)) if kind == "*" else (rng.randint(10, 60), rng.randint(2, 30))
        ans = a + b if kind == "+" else a - b if kind == "-" else a * b
        q = f"What is {a} {kind} {b}? Answer with the number."
        if distinct and q in seen:
            continue
        seen.add(q)
        out.append((q, ans))
    return out


def run_method(gen, method: str, prompt: str, new: int, reward: str = "logprob") -> dict:
    import rodeco
    from rodeco.common.budget import full_length_tokens

    kind, n = method.split("_")[0], int(method.split("_")[1])
    ov = [f"reward={reward}", f"sampling.max_new_tokens={new}", "output.all_candidates=true"]
    if kind == "bon":
        ov += ["policy=none", "budget=unlimited"]
    else:
        kv = full_length_tokens(4, [len(gen.encode(prompt))], new, gen.kv)
        ov += [f"budget.kv_tokens={kv}"]
        ov += (
            ["policy=fixed", "policy.alpha=0.5"]
            if kind == "sr"
            else [f"policy={SEARCH[kind]}", "policy.decision_tokens=8"]
        )
    out = rodeco.decode([prompt], generator=gen, n=n, overrides=ov)
    (r,) = out.results
    assert r.candidates is not None  # output.all_candidates=true
    return {
        "candidates": [{"text": c.text, "score": c.score, "finished": c.finished} for c in r.candidates],
        "flops": out.compute.total_flops,
        "decode_tokens": out.compute.gen_decode_tokens,
        "peak_kv_tokens": out.compute.peak_kv_tokens,
    }


def winner_answers(rec: dict) -> dict[str, int | None]:
    """Each winner rule's answer (its winner's last number) from a run's finished candidates."""
    from rodeco.common.state import Candidate
    from rodeco.common.winner import WinnerRule, last_number, normalize

    fin = [Candidate(i, [], c["text"], c["score"], True) for i, c in enumerate(rec["candidates"]) if c["finished"]]
    out = {}
    for rule in ("reward", "majority", "weighted"):
        best = WinnerRule(rule=rule, extractor="last_number").choose(fin).best
        num = last_number(best.text)
        out[rule] = int(float(normalize(num))) if num is not None and normalize(num).lstrip("-").isdigit() else None
    return out


def bon_at_flops(recs: list[dict], flops: float) -> tuple[np.ndarray, bool] | None:
    """Best-of-N's per-problem correctness (reward winner) at ``flops``, linear in log FLOPs between the two measured
    Best-of-N sizes around it, and whether ``flops`` is past the largest (then: the largest's); None without bon."""
    sizes = sorted(int(m.split("_")[1]) for m in recs[0] if m.startswith("bon_"))
    if not sizes:
        return None
    f = np.log([np.mean([r[f"bon_{n}"]["flops"] for r in recs]) for n in sizes])
    ok = np.array([[winner_answers(r[f"bon_{n}"])["reward"] == r["answer"] for n in sizes] for r in recs], float)
    x = float(np.log(flops))
    if x >= f[-1]:
        return ok[:, -1], x > f[-1]
    if x <= f[0]:
        return ok[:, 0], False
    k = int(np.searchsorted(f, x))  # f[k - 1] < x <= f[k]
    w = (x - f[k - 1]) / (f[k] - f[k - 1])
    return (1 - w) * ok[:, k - 1] + w * ok[:, k], False


def summarize(recs: list[dict], methods: list[str]) -> list[dict]:
    """Each method's (and winner rule's) accuracy with its CI and mean TFLOPs, and, for methods other than
    Best-of-N, its accuracy minus Best-of-N's at the same FLOPs (``bon_at_flops``), paired over problems."""
    rows = []
    for m in methods:
        rules = ("reward", "majority", "weighted") if m.startswith(("bon", "pf")) else ("reward",)
        for rule in rules:
            ok = np.array([winner_answers(r[m])[rule] == r["answer"] for r in recs], dtype=float)
            flops = float(np.mean([r[m]["flops"] for r in recs]))
            row = {
                "method": m if rule == "reward" else f"{m}_{'vote' if rule == 'majority' else 'wvote'}",
                "accuracy": float(ok.mean()),
                "ci": mean_ci(ok),
                "tflops": flops / 1e12,
                "problems": len(recs),
            }
            at = None if m.startswith("bon") else bon_at_flops(recs, flops)
            if at is not None:
                d = ok - at[0]
                row["vs_bon_at_flops"] = {"value": float(d.mean()), "ci": mean_ci(d), "beyond_curve": at[1]}
            rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", type=int, default=40, help="how many problems (distinct unless --repeats)")
    ap.add_argument(
        "--repeats",
        action="store_true",
        help="keep a problem drawn twice (as the 40-problem table in docs/results.md was made)",
    )
    ap.add_argument("--seed", type=int, default=0, help="the problems' seed")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--reward", default="logprob", help="the guiding reward option (logprob, minilm_rm, ...)")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS, help="the methods, in this order")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--snapshot", type=Path, default=None, help="also write the summary and every problem's record here (.json.gz)"
    )
    a = ap.parse_args()
    import rodeco
    from rodeco.core.loading import load_generator
    from rodeco.core.results import atomic_write

    gen = load_generator(rodeco.load_config([]).generator)
    a.out.mkdir(parents=True, exist_ok=True)
    recs = []
    for i, (q, ans) in enumerate(problems(a.problems, a.seed, distinct=not a.repeats)):
        f = a.out / f"{i}.json"
        rec = {"problem": q, "answer": ans, "reward": a.reward}
        if f.is_file():
            rec = json.loads(f.read_text(encoding="utf-8"))
            if rec["problem"] != q or rec.get("reward", "logprob") != a.reward:
                ap.error(
                    f"{f} holds problem {i} of another list or reward ({rec['problem']!r}, "
                    f"{rec.get('reward', 'logprob')}; here {q!r}, {a.reward}): resume with the options it was "
                    "written with (--seed, --repeats, --reward), or use another --out"
                )
        todo = [m for m in a.methods if m not in rec]
        for m in todo:
            rec[m] = run_method(gen, m, q, a.max_new_tokens, a.reward)
        if todo:
            atomic_write(f, json.dumps(rec) + "\n")
            print(f"problem {i}: {q} = {ans}", file=sys.stderr)
        recs.append(rec)
    rows = summarize(recs, a.methods)
    atomic_write(a.out / "summary.json", json.dumps(rows, indent=1) + "\n")
    if a.snapshot is not None:  # what a reader needs to check a figure: every candidate's text, score and FLOPs
        doc = {"args": {k: str(v) for k, v in vars(a).items()}, "summary": rows, "records": recs}
        a.snapshot.write_bytes(gzip.compress(json.dumps(doc).encode(), mtime=0))
    print(
        f"{len(recs)} problems; scorer: {a.reward}; accuracy [95% CI over problems], mean TFLOPs per problem, and "
        "accuracy minus Best-of-N's at the same FLOPs (linear in log FLOPs between Best-of-N sizes), paired"
    )
    for r in rows:
        v = r.get("vs_bon_at_flops")
        vs = (
            f"  vs Best-of-N interpolated at these FLOPs {v['value']:+.3f} [{v['ci'][0]:+.3f}, {v['ci'][1]:+.3f}]"
            + (" (beyond the curve)" if v["beyond_curve"] else "")
            if v
            else ""
        )
        print(f"{r['method']:>14}  {r['accuracy']:.3f} [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]  {r['tflops']:.4f}{vs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
