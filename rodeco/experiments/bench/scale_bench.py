"""One process against K joblib processes on the same prompts and the same total threads: total tokens per second
of each, and the ratio, in one run. Also checks that the merged shards chose what the single run chose.

    python scripts/scale_bench.py --out runs/scale_bench                       # the embedded models, 16 prompts
    python scripts/scale_bench.py --out DIR --shards 2 -- generator.model=DIR  # extra rodeco overrides after --

Tokens counted: the generator's prefill + decode tokens of every run (summary.json), so both sides are charged
for everything they forwarded. Wall time is the whole command: Python start, model loading, decoding, scoring.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

RODECO = Path(sys.executable).with_name("rodeco")
DEFAULT = [
    "data=alpacafarm100",
    "data.limit=16",
    "n=16",
    "sampling.max_new_tokens=64",
    "data.batch_prompts=2",
    "output.progress=false",
]


def timed(args: list[str], cwd: Path, env: dict[str, str]) -> float:
    t = time.perf_counter()
    p = subprocess.run([str(RODECO), *args], cwd=cwd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"rodeco {' '.join(args)} failed:\n{p.stderr[-3000:]}")
    return time.perf_counter() - t


def tokens(summary: Path) -> int:
    c = json.loads(summary.read_text())["compute"]
    return int(c["gen_prefill_tokens"] + c["gen_decode_tokens"])


def records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def compare(a: list[dict], b: list[dict]) -> tuple[bool, float]:
    """Whether two runs chose the same (every winner's tokens, every decision's kept rows), and the largest score
    difference: different thread counts sum floats in a different order, so scores may differ in the 7th digit."""
    same, diff = len(a) == len(b), 0.0
    for x, y in zip(a, b):
        same &= (x["prompt_index"], x["best"]["token_ids"]) == (y["prompt_index"], y["best"]["token_ids"])
        same &= [r["kept_ids"] for r in x["rounds"]] == [r["kept_ids"] for r in y["rounds"]]
        diff = max(
            diff,
            abs(x["best"]["score"] - y["best"]["score"]),
            *(abs(s - r2["scores"][k]) for r1, r2 in zip(x["rounds"], y["rounds"]) for k, s in r1["scores"].items()),
        )
    return same, diff


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="a new directory for the runs")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="total threads, both sides")
    ap.add_argument("overrides", nargs="*", help="rodeco overrides (after --), added to the defaults")
    a = ap.parse_args()
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=False)
    cwd = Path.cwd()
    args = [*DEFAULT, *a.overrides]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    one = timed([*args, f"hydra.run.dir={out / 'single'}"], cwd, {**env, "OMP_NUM_THREADS": str(a.threads)})
    many = timed(
        [
            "--multirun",
            *args,
            f"data.num_shards={a.shards}",
            f"data.shard=range({a.shards})",
            "hydra/launcher=joblib",
            f"hydra.launcher.n_jobs={a.shards}",
            f"hydra.sweep.dir={out / 'sweep'}",
        ],
        cwd,
        {**env, "OMP_NUM_THREADS": str(max(1, a.threads // a.shards))},
    )
    timed(["task=merge", f"merge.dir={out / 'sweep'}", f"hydra.run.dir={out / 'merge'}"], cwd, env)
    t1, tk = tokens(out / "single/summary.json"), tokens(out / "sweep/summary.json")
    same, diff = compare(records(out / "single/results.jsonl"), records(out / "sweep/results.jsonl"))
    res = {
        "threads": a.threads,
        "shards": a.shards,
        "tokens_single": t1,
        "tokens_sharded": tk,
        "wall_s_single": round(one, 2),
        "wall_s_sharded": round(many, 2),
        "tokens_per_s_single": round(t1 / one, 2),
        "tokens_per_s_sharded": round(tk / many, 2),
        "ratio_sharded_over_single": round((tk / many) / (t1 / one), 3),
        "same_choices": same,
        "max_score_difference": diff,
        "overrides": args,
    }
    (out / "scale_bench.json").write_text(json.dumps(res, indent=2) + "\n")
    for k, v in res.items():
        print(f"{k}: {v}")
    if not same or diff > 1e-4:
        sys.exit("the merged shards differ from the single run")


if __name__ == "__main__":
    main()
