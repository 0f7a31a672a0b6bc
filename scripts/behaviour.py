"""Behaviour check for refactors: fixed-seed runs whose ``results.jsonl`` must stay byte-identical (wall times
aside), and ``engine_bench``'s speedup, which must stay within its run-to-run spread.

    python scripts/behaviour.py record DIR     # before the change: run everything, keep the outputs in DIR
    python scripts/behaviour.py check DIR      # after it: run again into DIR/check and compare with DIR

The runs: the demo; adaptive + logprob; the correlation policy on the ``hf`` engine; composite Best-of-N; a small
pool recorded here, replayed with two policies. Every time field (``time_s``, ``*_seconds``, ``wall_s``) is
dropped before comparing; everything else (texts, token ids, scores, round traces, token and FLOP counts) must
be equal. Exit 0 when all runs are equal and the bench ratio is within ``--tolerance`` (default 5%) of the
recorded one, 1 otherwise. Run it on a quiet machine: the bench ratio moves with load.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

RODECO = [str(Path(sys.executable).parent / "rodeco")]  # the rodeco of this interpreter's environment
COMMON = ["output.progress=false"]
RUNS: dict[str, list[str]] = {
    "demo": ["output.all_candidates=true"],
    "adaptive_logprob": ["policy=adaptive", "reward=logprob", "sampling.max_new_tokens=48", "n=12"],
    "correlation_hf": ["policy=correlation", "generator.engine=hf", "sampling.max_new_tokens=48", "n=12"],
    "composite_bon": ["reward=composite", "policy=none", "budget=unlimited", "n=6", "sampling.max_new_tokens=32"],
}
POOL = ["experiment=pool", "data=alpacafarm100", "data.limit=3", "experiment_args.candidates=12",
        "sampling.max_new_tokens=32"]
REPLAYS: dict[str, list[str]] = {
    "replay_fixed": ["experiment=replay", "n=12", "policy=fixed", "policy.alpha=0.5", "budget.kv_tokens=600",
                     "sampling.max_new_tokens=32"],
    "replay_adaptive": ["experiment=replay", "n=12", "policy=adaptive", "budget.kv_tokens=600", "sampling.max_new_tokens=32"],
}
TIME_KEY = re.compile(r"(^time_s$|_seconds$|^seconds$|_s$|^wall)")


def rodeco(args: list[str], run_dir: Path) -> str:
    cmd = [*RODECO, *args, *COMMON, f"hydra.run.dir={run_dir}"]
    print("+ rodeco", " ".join(cmd[1:]), flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr[-3000:]}")
    return done.stdout


def strip_times(x):
    if isinstance(x, dict):
        return {k: strip_times(v) for k, v in x.items() if not TIME_KEY.search(k)}
    if isinstance(x, list):
        return [strip_times(v) for v in x]
    return x


def normalized(results: Path) -> str:
    lines = [json.loads(s) for s in results.read_text(encoding="utf-8").splitlines() if s.strip()]
    return "".join(json.dumps(strip_times(r), sort_keys=True) + "\n" for r in lines)


def bench_ratio(run_dir: Path) -> float:
    out = rodeco(["experiment=engine_bench"], run_dir)
    m = re.search(r"speedup_vs_hf_generate: ([0-9.]+)", out)
    if m is None:
        sys.exit(f"no speedup in engine_bench's output:\n{out}")
    return float(m.group(1))


def run_all(out: Path, bench: bool) -> dict[str, str | float]:
    got: dict[str, str | float] = {}
    for name, args in RUNS.items():
        rodeco(args, out / name)
        got[name] = normalized(out / name / "results.jsonl")
    pool = out / "pool"
    rodeco([*POOL, f"pool={pool}"], out / "pool_run")
    for name, args in REPLAYS.items():
        rodeco([*args, f"pool={pool}"], out / name)
        got[name] = normalized(out / name / "results.jsonl")
    if bench:
        got["engine_bench_ratio"] = bench_ratio(out / "engine_bench")
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["record", "check"])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--tolerance", type=float, default=0.05, help="allowed relative change of the bench ratio")
    ap.add_argument("--no-bench", action="store_true", help="skip engine_bench")
    a = ap.parse_args()
    ref = a.dir / "reference.json"
    if a.mode == "record":
        got = run_all(a.dir / "record", not a.no_bench)
        ref.write_text(json.dumps(got, indent=1), encoding="utf-8")
        print(f"recorded {len(got)} outputs in {ref}")
        return 0
    want = json.loads(ref.read_text(encoding="utf-8"))
    got = run_all(a.dir / "check", not a.no_bench and "engine_bench_ratio" in want)
    ok = True
    for k, v in want.items():
        if k == "engine_bench_ratio":
            if k not in got:
                continue
            rel = got[k] / v - 1
            same = abs(rel) <= a.tolerance
            print(f"{k}: recorded {v:.3f}, now {got[k]:.3f} ({rel:+.1%}) {'ok' if same else 'OUTSIDE the tolerance'}")
        else:
            same = got.get(k) == v
            print(f"{k}: {'identical' if same else 'DIFFERENT'}")
        ok &= same
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
