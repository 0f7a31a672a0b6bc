"""Two builds of rodeco, the same benchmark, alternating: is the new one slower on closed batches?

    python scripts/build_pairs.py OLD_TREE NEW_TREE --rounds 6 --out runs/build_pairs

Each round runs ``rodeco experiment=engine_bench`` once with each build (its source tree first on ``PYTHONPATH``;
the order alternates round by round, old-new then new-old, so that drifts in machine load hit both alike) and reads
every engine's tokens a second from its ``engine_bench.json``. Prints, per engine, the paired ratio new/old: the
geometric mean of the rounds' ratios with a 95% bootstrap CI over rounds, and writes every run to
``OUT/build_pairs.json``. ``--set KEY=VALUE`` passes overrides to ``engine_bench`` (repeat it; default: the fast
engine's eager step, one timed repeat a run; ``--set 'experiment_args.engines=[fast,fast-compiled]'`` adds the
compiled step). Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from rodeco.experiments.bootstrap import geomean_ci

DEFAULT = ["experiment_args.repeats=1", "experiment_args.engines=[fast]"]


def bench(tree: Path, out: Path, overrides: list[str]) -> dict[str, float]:
    """One engine_bench run with ``tree``'s rodeco: each engine's tokens a second."""
    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [
        sys.executable,
        "-c",
        "from rodeco.cli import main; main()",
        "experiment=engine_bench",
        f"hydra.run.dir={out}",
        *overrides,
    ]
    subprocess.run(cmd, env=env, check=True, cwd=tree, stdout=subprocess.DEVNULL)
    res = json.loads((out / "engine_bench.json").read_text())
    return {e: r["tokens_per_s"] for e, r in res["engines"].items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old", type=Path, help="the old build's source tree")
    ap.add_argument("new", type=Path, help="the new build's source tree")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="an engine_bench override (repeat)")
    a = ap.parse_args(argv)
    overrides = a.overrides or DEFAULT
    runs: list[dict] = []
    for i in range(a.rounds):
        order = [("old", a.old), ("new", a.new)] if i % 2 == 0 else [("new", a.new), ("old", a.old)]
        got = {name: bench(tree.resolve(), (a.out / f"round{i}_{name}").resolve(), overrides) for name, tree in order}
        runs.append(got)
        print(f"round {i}: " + ", ".join(f"{e} new/old {got['new'][e] / got['old'][e]:.3f}" for e in got["new"]))
    summary = {}
    for e in runs[0]["new"]:
        ratios = [r["new"][e] / r["old"][e] for r in runs]
        g, lo, hi = geomean_ci(ratios)
        summary[e] = {"ratio": g, "ci": [lo, hi], "ratios": ratios}
        print(f"{e}: new/old {g:.3f} [{lo:.3f}, {hi:.3f}] (95% bootstrap CI over {len(ratios)} rounds)")
    (a.out / "build_pairs.json").write_text(json.dumps({"runs": runs, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
