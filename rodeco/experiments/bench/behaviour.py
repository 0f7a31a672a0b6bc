"""Behaviour check for refactors: fixed-seed runs whose ``results.jsonl`` must stay byte-identical (wall times
aside), and ``engine_bench``'s speedup, which must stay within its run-to-run spread.

    python scripts/behaviour.py record DIR     # before the change: run everything, keep the outputs in DIR
    python scripts/behaviour.py check DIR      # after it: run again into DIR/check and compare with DIR

The runs: the demo; adaptive + logprob; the correlation policy on the ``hf`` engine; composite Best-of-N; the
compiled decode step; the search policies (beam, dvts, particle_filter) and the calibrated policy choosing its start
(``n=policy``); a small pool recorded here, replayed with two policies one prompt at a time and with two in
batches of prompts (``data.batch_prompts``); and two seeded requests to ``rodeco task=serve`` on loopback
(Speculative Rejection and Best-of-N; the answers less their ids and times). ``--vllm`` runs the vLLM cases instead
(in ``.venv-vllm``). Every time field (``time_s``, ``*_seconds``, ``wall_s``) is dropped before comparing;
everything else (texts, token ids, scores, round traces, token and FLOP counts) must be equal. Exit 0 when all
runs are equal and the bench ratio is within ``--tolerance`` (default 5%) of the recorded one, 1 otherwise. Run
it on a quiet machine: the bench ratio moves with load.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

RODECO = [str(Path(sys.executable).parent / "rodeco")]  # the rodeco of this interpreter's environment
COMMON = ["output.progress=false"]
RUNS: dict[str, list[str]] = {
    "demo": ["output.all_candidates=true"],
    "adaptive_logprob": ["policy=adaptive", "reward=logprob", "sampling.max_new_tokens=48", "n=12"],
    "correlation_hf": ["policy=correlation", "generator.engine=hf", "sampling.max_new_tokens=48", "n=12"],
    "composite_bon": ["reward=composite", "policy=none", "budget=unlimited", "n=6", "sampling.max_new_tokens=32"],
    "compiled_fixed": ["generator.compile=true", "sampling.max_new_tokens=32", "n=8", "output.all_candidates=true"],
    **{
        f"search_{name}": [
            f"policy={name}",
            "policy.decision_tokens=8",
            "reward=logprob",
            "n=8",
            "sampling.max_new_tokens=32",
            "budget.kv_tokens=400",
            "output.all_candidates=true",
        ]
        for name in ("beam", "dvts", "particle_filter")
    },
    "calibrated_start": ["policy=calibrated", "n=policy", "sampling.max_new_tokens=32", "budget.kv_tokens=1200"],
}
SERVED: dict[str, dict] = {  # POST /v1/completions, seeded
    "served_sr": {
        "prompt": "Name three colors.",
        "best_of": 8,
        "n": 2,
        "max_tokens": 24,
        "seed": 3,
        "rodeco": {"policy": "fixed", "params": {"alpha": 0.5}, "kv_tokens": 300},
    },
    "served_bon": {
        "prompt": "Write a haiku about autumn.",
        "best_of": 4,
        "max_tokens": 24,
        "seed": 5,
        "rodeco": {"policy": "none"},
    },
}
POOL = [
    "experiment=pool",
    "data=alpacafarm100",
    "data.limit=3",
    "experiment_args.candidates=12",
    "sampling.max_new_tokens=32",
]
REPLAYS: dict[str, list[str]] = {
    "replay_fixed": [
        "experiment=replay",
        "n=12",
        "policy=fixed",
        "policy.alpha=0.5",
        "budget.kv_tokens=600",
        "sampling.max_new_tokens=32",
    ],
    "replay_adaptive": [
        "experiment=replay",
        "n=12",
        "policy=adaptive",
        "budget.kv_tokens=600",
        "sampling.max_new_tokens=32",
    ],
}
# Replayed in batches of prompts, as a live run batches them. ``record --batch-via-api`` records these through
# ``rodeco.replays.replay.replay_batch`` itself (what a commit whose ``experiment=replay`` replays one prompt at a
# time has).
REPLAY_BATCHES: dict[str, list[str]] = {
    "replay_batch_allocate": [
        "experiment=replay",
        "n=12",
        "policy=allocate",
        "data.batch_prompts=3",
        "budget.kv_tokens=1500",
        "sampling.max_new_tokens=32",
    ],
    "replay_batch_fixed": [
        "experiment=replay",
        "n=12",
        "policy=fixed",
        "data.batch_prompts=2",
        "budget.kv_tokens=1000",
        "sampling.max_new_tokens=32",
    ],
}
VLLM_RUNS: dict[str, list[str]] = {  # --vllm: in .venv-vllm (make setup-vllm)
    "vllm_fixed": [
        "generator.engine=vllm",
        "generator.enforce_eager=true",
        "n=8",
        "sampling.max_new_tokens=32",
        "budget.kv_tokens=1024",
        "output.all_candidates=true",
    ],
    "vllm_bon": [
        "generator.engine=vllm",
        "generator.enforce_eager=true",
        "n=4",
        "policy=none",
        "budget=unlimited",
        "sampling.max_new_tokens=24",
    ],
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


def differences(old: str, new: str, tol: float = 1e-4) -> dict[str, int]:
    """Where two recorded outputs (JSON lines) differ: each differing field's path (list items as ``[]``) and how
    many times; a number within ``tol`` (relative, at least absolute) is marked ``~``: the order of sums."""
    out: dict[str, int] = {}

    def walk(a: Any, b: Any, path: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b)):
                if k in a and k in b:
                    walk(a[k], b[k], f"{path}/{k}")
                else:
                    key = f"{path}/{k} (only {'before' if k in a else 'now'})"
                    out[key] = out.get(key, 0) + 1
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            for x, y in zip(a, b):
                walk(x, y, f"{path}[]")
        elif a != b:
            close = isinstance(a, float) and isinstance(b, float) and abs(a - b) <= tol * max(1.0, abs(a))
            key = path + (" ~" if close else " (lengths differ)" if isinstance(a, list) else "")
            out[key] = out.get(key, 0) + 1

    olds, news = old.splitlines(), new.splitlines()
    if len(olds) != len(news):
        return {f"lines: {len(olds)} before, {len(news)} now": 1}
    for i, (a, b) in enumerate(zip(olds, news)):
        try:
            walk(json.loads(a), json.loads(b), "")
        except json.JSONDecodeError:  # a line that is no JSON record: compared as text
            if a != b:
                out[f"line {i} (text)"] = 1
    return out


def bench_ratio(run_dir: Path) -> float:
    out = rodeco(["experiment=engine_bench"], run_dir)
    m = re.search(r"speedup_vs_hf_generate: ([0-9.]+)", out)
    if m is None:
        sys.exit(f"no speedup in engine_bench's output:\n{out}")
    return float(m.group(1))


def replay_batches_via_api(args: list[str], pool: Path, out: Path) -> None:
    """One ``REPLAY_BATCHES`` case through ``rodeco.replays.replay.replay_batch``: the run's prompts in batches of
    ``data.batch_prompts``, each prompt's result written in order as ``experiment=replay`` writes them."""
    from rodeco.api import load_config
    from rodeco.experiments.record import pool_roles
    from rodeco.plugins import default_plugins
    from rodeco.replays.pool_rewards import PoolReward
    from rodeco.replays.replay import open_pool, replay_batch
    from rodeco.roles import choose_roles
    from rodeco.runner import loop_settings

    plugins = default_plugins()
    cfg = load_config([a for a in args if not a.startswith("experiment=")] + [f"pool={pool}"], plugins)
    p, gen = open_pool(pool)
    roles = pool_roles(cfg, plugins, p, gen).roles(choose_roles(cfg, plugins, live=False))
    s = loop_settings(cfg, gen, roles.choices.policy.name, roles.choices.reward.name)
    indices, k = list(p.indices()), cfg.data.batch_prompts
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for batch in (indices[j : j + k] for j in range(0, len(indices), k)):
        res, _, _ = replay_batch(p, gen, roles.reward, roles.policy, batch, s, partial=roles.partial)
        lines += [json.dumps(r.to_dict()) + "\n" for r in res]
    for r in [roles.reward.reward, *([roles.partial.reward] if roles.partial else [])]:
        if isinstance(r, PoolReward):
            r.save()  # as experiment=replay does: the next case is served what this one computed
    (out / "results.jsonl").write_text("".join(lines), encoding="utf-8")


def served(out: Path) -> dict[str, str]:
    """``SERVED``'s requests to one ``rodeco task=serve`` on loopback (started and stopped here), one at a time:
    each answer's choices and rodeco block, less ids and times."""
    import urllib.request

    from rodeco.experiments.bench.servers import free_port, launched

    port = free_port()
    argv = [*RODECO, "task=serve", "serve.host=127.0.0.1", f"serve.port={port}", *COMMON, f"hydra.run.dir={out}"]
    got = {}
    with launched("rodeco_serve", argv, port, out, timeout=600) as srv:
        for name, body in SERVED.items():
            print(f"+ POST /v1/completions {name}", flush=True)
            req = urllib.request.Request(
                f"{srv.url}/v1/completions",
                data=json.dumps({"model": "smollm2", **body}).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=600) as r:
                doc = json.loads(r.read())
            keep = {k: doc[k] for k in ("choices", "usage", "rodeco") if k in doc}
            got[name] = json.dumps(strip_times(keep), sort_keys=True) + "\n"
    return got


def run_all(out: Path, bench: bool, batch_via_api: bool = False, vllm: bool = False) -> dict[str, str | float]:
    got: dict[str, str | float] = {}
    if vllm:
        for name, args in VLLM_RUNS.items():
            rodeco(args, out / name)
            got[name] = normalized(out / name / "results.jsonl")
        return got
    for name, args in RUNS.items():
        rodeco(args, out / name)
        got[name] = normalized(out / name / "results.jsonl")
    pool = out / "pool"
    rodeco([*POOL, f"pool={pool}"], out / "pool_run")
    for name, args in REPLAYS.items():
        rodeco([*args, f"pool={pool}"], out / name)
        got[name] = normalized(out / name / "results.jsonl")
    for name, args in REPLAY_BATCHES.items():
        if batch_via_api:
            print(f"+ replay_batch {' '.join(args)}", flush=True)
            replay_batches_via_api([*args, *COMMON], pool, out / name)
        else:
            rodeco([*args, f"pool={pool}"], out / name)
        got[name] = normalized(out / name / "results.jsonl")
    got.update(served(out / "serve"))
    if bench:
        got["engine_bench_ratio"] = bench_ratio(out / "engine_bench")
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["record", "check"])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--tolerance", type=float, default=0.05, help="allowed relative change of the bench ratio")
    ap.add_argument("--no-bench", action="store_true", help="skip engine_bench")
    ap.add_argument("--vllm", action="store_true", help="the vLLM cases only (run with .venv-vllm/bin/python)")
    ap.add_argument(
        "--batch-via-api",
        action="store_true",
        help="record the batched replays through rodeco.replays.replay.replay_batch, not experiment=replay",
    )
    a = ap.parse_args()
    ref = a.dir / "reference.json"
    if a.mode == "record":
        got = run_all(a.dir / "record", not a.no_bench and not a.vllm, a.batch_via_api, a.vllm)
        ref.write_text(json.dumps(got, indent=1), encoding="utf-8")
        print(f"recorded {len(got)} outputs in {ref}")
        return 0
    want = json.loads(ref.read_text(encoding="utf-8"))
    got = run_all(a.dir / "check", not a.no_bench and "engine_bench_ratio" in want, vllm=a.vllm)
    (a.dir / "check.json").write_text(json.dumps(got, indent=1), encoding="utf-8")  # to compare, or renew the record
    ok = True
    for k, v in want.items():
        if k == "engine_bench_ratio":
            if k not in got:
                continue
            rel = got[k] / v - 1
            same = abs(rel) <= a.tolerance
            print(f"{k}: recorded {v:.3f}, now {got[k]:.3f} ({rel:+.1%}) {'ok' if same else 'OUTSIDE the tolerance'}")
        else:
            now = got.get(k)
            same = now == v
            print(f"{k}: {'identical' if same else 'DIFFERENT'}")
            if not same and isinstance(v, str) and isinstance(now, str):
                for path, count in differences(v, now).items():
                    print(f"    {path}: {count}")
        ok &= same
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
