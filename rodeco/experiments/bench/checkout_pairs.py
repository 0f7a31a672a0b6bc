"""One command on this checkout and on another, alternately, paired by round: how a change moves a figure.

    python scripts/checkout_pairs.py --other ../base --rounds 3 --figure rodeco_tokens_per_s \\
        --output engine_bench.json --out runs/pairs -- -m rodeco.cli experiment=engine_bench output.dir={out}

The arguments after ``--`` run as ``python ARGS`` twice a round, once with this checkout's code and once with
``--other``'s (its ``rodeco`` and built-in plugins first on ``PYTHONPATH``), the order alternating round by round
(ABBA), so that drifts in machine load hit both alike. ``{out}`` in them is each run's own folder, where the command
writes ``--output`` (a JSON file); ``--figure`` is read from it (dotted keys reach into nested objects). Prints each
round's ratio (this checkout's figure over the other's), then, last, ``this_over_other: R [lo, hi]``: the geometric
mean over rounds and its 95% bootstrap CI (``rodeco.experiments.bootstrap``). Writes every run to
``OUT/checkout_pairs.json``. Both checkouts run in this interpreter's environment. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from rodeco.experiments.bootstrap import geomean_ci


def _args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        raise SystemExit("checkout_pairs: give the command after --")
    cut = argv.index("--")
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--other", type=Path, required=True, help="the other checkout's root (a git worktree)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--figure", required=True, help="the key read from each run's output (dotted for nested keys)")
    p.add_argument("--output", required=True, help="the JSON file each run writes into its {out} folder")
    p.add_argument("--out", type=Path, required=True, help="the folder for every run and checkout_pairs.json")
    a = p.parse_args(argv[:cut])
    if a.rounds < 1:
        p.error(f"--rounds {a.rounds}: must be at least 1")
    if not (a.other / "rodeco" / "__init__.py").exists():
        p.error(f"--other {a.other}: no rodeco/ package there")
    return a, argv[cut + 1 :]


def figure(path: Path, key: str) -> float:
    """``key`` (dotted) of the JSON at ``path``."""
    node: Any = json.loads(path.read_text())
    for k in key.split("."):
        node = node[k]
    return float(node)


def run_once(cmd: list[str], checkout: Path | None, out: Path) -> None:
    """``python cmd`` with ``{out}`` filled in, run in ``out`` (a command's own folder comes first on its path, so not
    this checkout's root); with ``checkout``, that checkout's code first on the path."""
    env = dict(os.environ)
    if checkout is not None:
        root = checkout.resolve()
        env["PYTHONPATH"] = os.pathsep.join([str(root), str(root / "plugins"), env.get("PYTHONPATH", "")])
    out.mkdir(parents=True, exist_ok=True)
    cmd = [c.replace("{out}", str(out.resolve())) for c in cmd]
    subprocess.run([sys.executable, *cmd], env=env, check=True, cwd=out)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a, cmd = _args(argv)
    runs: dict[str, list[float]] = {"this": [], "other": []}
    for r in range(a.rounds):
        order = ["this", "other"] if r % 2 == 0 else ["other", "this"]
        for side in order:
            out = a.out / f"round{r}_{side}"
            run_once(cmd, a.other if side == "other" else None, out)
            runs[side].append(figure(out / a.output, a.figure))
        print(
            f"round {r}: this {runs['this'][-1]:.3f}, other {runs['other'][-1]:.3f}, "
            f"ratio {runs['this'][-1] / runs['other'][-1]:.3f}",
            flush=True,
        )
    ratios = [x / y for x, y in zip(runs["this"], runs["other"])]
    mean, lo, hi = geomean_ci(ratios)
    res = {
        "args": {k: str(v) for k, v in vars(a).items()},
        "command": cmd,
        "runs": runs,
        "ratios": ratios,
        "this_over_other": {"geomean": mean, "ci": [lo, hi]},
    }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "checkout_pairs.json").write_text(json.dumps(res, indent=1) + "\n")
    print(f"this_over_other: {mean:.3f} [{lo:.3f}, {hi:.3f}]")
    return res


if __name__ == "__main__":
    main()
