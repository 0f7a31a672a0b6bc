"""Per-prompt results as JSONL, rewritten atomically (temp file + rename) as each prompt finishes; resume."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write(path: str | Path, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8, or bytes) to ``path`` through a temporary file renamed into place: readers
    see the old file or the whole new one, never a half-written one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class ResultsWriter:
    """``results.jsonl`` (or ``name``) in ``out_dir``: one line per finished prompt. A crash loses at most the
    prompts in flight."""

    def __init__(self, out_dir: str | Path, resume: bool = True, name: str = "results.jsonl") -> None:
        self.path = Path(out_dir) / name
        self.records: dict[int, dict[str, Any]] = {}
        if resume and self.path.exists():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    rec = json.loads(line)
                    self.records[int(rec["prompt_index"])] = rec

    def done(self) -> set[int]:
        return set(self.records)

    def write(self, record: dict[str, Any]) -> None:
        self.records[int(record["prompt_index"])] = record
        self.save()

    def save(self) -> None:
        """Rewrite the file from ``records``, ordered by ``prompt_index``."""
        lines = (json.dumps(self.records[k], ensure_ascii=False) for k in sorted(self.records))
        atomic_write(self.path, "\n".join(lines) + "\n")

    def write_json(self, name: str, obj: Any) -> Path:
        path = self.path.parent / name
        atomic_write(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")
        return path


def export_alpaca_eval(results_jsonl: str | Path, out_path: str | Path, generator: str) -> Path:
    """Write a run's best responses as AlpacaEval ``model_outputs.json`` (``instruction``, ``output``,
    ``generator``, and the judges' scores under ``judge`` when the run has them), in prompt order, for judging with
    the ``alpaca_eval`` tool."""
    recs = [json.loads(x) for x in Path(results_jsonl).read_text(encoding="utf-8").splitlines() if x.strip()]
    recs.sort(key=lambda r: int(r["prompt_index"]))
    rows = [
        {
            "instruction": r["prompt"],
            "output": r["best"]["text"],
            "generator": generator,
            **({"judge": r["judge"]} if "judge" in r else {}),
        }
        for r in recs
    ]
    out = Path(out_path)
    atomic_write(out, json.dumps(rows, indent=2, ensure_ascii=False) + "\n")
    return out


if __name__ == "__main__":  # python -m rodeco.core.results RESULTS.jsonl OUT.json GENERATOR_NAME
    import sys

    if len(sys.argv) != 4:
        sys.exit("usage: python -m rodeco.core.results RESULTS.jsonl model_outputs.json GENERATOR_NAME")
    print(export_alpaca_eval(sys.argv[1], sys.argv[2], sys.argv[3]))
