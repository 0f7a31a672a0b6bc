"""Prompt sources: a JSON list or a JSONL file of records with a prompt field, or an inline list."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rodeco.validation import ConfigError


@dataclass(frozen=True)
class Prompt:
    index: int  # position in the source: results are keyed and resumed by it
    text: str


def _check_text(text: object, where: str, key: str) -> str:
    if not isinstance(text, str):
        raise ConfigError(key, text, f"{where}: the prompt is {type(text).__name__}, not a string",
                          "give each prompt as a string")
    if not text.strip():
        raise ConfigError(key, text, f"{where}: empty prompt", "remove it or give it some text")
    return text


def load_prompts(path: str | None = None, prompts: list[str] | None = None, field: str = "prompt",
                 offset: int = 0, limit: int | None = None, indices: list[int] | None = None) -> list[Prompt]:
    """The prompts of a file or an inline list, each keyed by its position there; ``indices`` picks positions (in
    that order) before ``offset`` and ``limit`` apply."""
    if (path is None) == (prompts is None):
        raise ConfigError("data.path", path, "give exactly one of data.path and data.prompts",
                          "e.g. data.path=prompts.jsonl, or data.prompts='[\"Hello\"]' with data.path=null")
    if prompts is not None:
        texts = [_check_text(t, f"prompt {i}", "data.prompts") for i, t in enumerate(prompts)]
    else:
        texts = _read_file(Path(path), field)
    out = [Prompt(i, t) for i, t in enumerate(texts)]
    if indices is not None:
        bad = [i for i in indices if not 0 <= int(i) < len(out)]
        if bad:
            raise ConfigError("data.indices", bad[:5], f"positions outside the {len(out)} prompts",
                              "give positions in the prompt source, or data.indices=null for all")
        out = [out[int(i)] for i in indices]
    out = out[offset:]
    return out[:limit] if limit is not None else out


def prompts_of(data: Any) -> list[Prompt]:
    """The prompts a ``data`` config node describes (its shard ``data.shard`` of ``data.num_shards``, if set)."""
    out = load_prompts(data.path, data.prompts, data.field, data.offset, data.limit, data.get("indices"))
    return shard_of(out, data.get("num_shards", 1), data.get("shard", 0), data.get("batch_prompts", 1))


def batches_of(prompts: list[Prompt], size: int) -> list[list[Prompt]]:
    """Consecutive batches of ``size`` prompts: how a run groups its prompts (and how shards deal them out)."""
    return [prompts[i: i + size] for i in range(0, len(prompts), size)]


def shard_of(prompts: list[Prompt], num_shards: int, shard: int, batch: int = 1) -> list[Prompt]:
    """Shard ``shard`` of ``num_shards``: the run's batches of ``batch`` prompts dealt round-robin, so every batch
    is the one the unsharded run decodes (same prompts, same budget split, same results), shards are disjoint and
    together all prompts, and long and short prompts spread evenly. Prompts keep their ``index``."""
    if not isinstance(num_shards, int) or isinstance(num_shards, bool) or num_shards < 1:
        raise ConfigError("data.num_shards", num_shards, "must be a positive integer", "e.g. data.num_shards=4")
    if not isinstance(shard, int) or isinstance(shard, bool) or not 0 <= shard < num_shards:
        raise ConfigError("data.shard", shard, f"must be in 0..{num_shards - 1} (data.num_shards={num_shards})",
                          f"e.g. data.shard=0, or 'data.shard=range({num_shards})' with --multirun")
    return [p for b in batches_of(prompts, max(1, batch))[shard::num_shards] for p in b]


def _read_file(path: Path, field: str) -> list[str]:
    if not path.is_file():
        raise ConfigError("data.path", str(path), f"no such file (looked in {Path.cwd()})",
                          "give the path of a JSON or JSONL file of records with a prompt field")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json" or text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError("data.path", str(path), f"not valid JSON (line {e.lineno}: {e.msg})",
                              "fix the file, or use JSONL with one record per line") from None
        if not isinstance(records, list):
            raise ConfigError("data.path", str(path), "a JSON file must hold a list of records",
                              'write [{"prompt": "..."}, ...]')
        numbered = [(f"record {i}", r) for i, r in enumerate(records)]
    else:
        numbered = []
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                numbered.append((f"line {lineno}", json.loads(line)))
            except json.JSONDecodeError as e:
                raise ConfigError("data.path", str(path), f"line {lineno} is not valid JSON ({e.msg})",
                                  f"fix line {lineno}: each line must be one JSON object") from None
    out = []
    for where, rec in numbered:
        if isinstance(rec, str):
            out.append(_check_text(rec, f"{path}, {where}", "data.path"))
        elif isinstance(rec, dict) and field in rec:
            out.append(_check_text(rec[field], f"{path}, {where}", "data.path"))
        else:
            keys = sorted(rec) if isinstance(rec, dict) else type(rec).__name__
            raise ConfigError("data.field", field, f"{path}, {where} has no field {field!r} (it has {keys})",
                              "set data.field to the key that holds the prompt text")
    return out
