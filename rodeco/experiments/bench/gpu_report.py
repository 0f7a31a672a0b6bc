"""The report of ``scripts/gpu_check.py``: the environment it ran in, and its steps as JSON and Markdown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def environment(device: str) -> dict[str, Any]:
    import platform

    import torch
    import transformers

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda_available": torch.cuda.is_available(),
        "device": device,
    }
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["gpu_memory_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30
    return env


def write_report(report: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    (out / "gpu_check.md").write_text(markdown(report), encoding="utf-8")


def markdown(report: dict[str, Any]) -> str:
    lines = ["# rodeco GPU check", "", f"environment: `{json.dumps(report.get('environment', {}))}`", ""]
    if report.get("skipped"):
        return "\n".join([*lines, f"**skipped: {report['skipped']}**", ""])
    lines += ["| step | ok | seconds | figures |", "|---|---|---|---|"]
    for name, r in report.get("steps", {}).items():
        figs = {k: v for k, v in r.items() if k not in ("ok", "step_seconds", "traceback")}
        text = json.dumps(figs, default=lambda x: round(x, 4) if isinstance(x, float) else str(x))
        lines.append(f"| {name} | {r.get('ok')} | {r.get('step_seconds', 0):.1f} | `{text[:1500]}` |")
    return "\n".join([*lines, ""])
