"""Prompt sources: a JSON list or a JSONL file of records with a prompt field, an inline list, or a dataset on the
hub (or a local folder of JSON/JSONL files) loaded by ``datasets``.

Named data options (``data=alpaca_eval``) give files relative to the **data root**, the folder that holds
``prompts/`` and ``prefs/``: ``data.root``, else the environment variable ``RODECO_DATA``, else ``../shared/data``
beside the working directory or this checkout, when it exists. A relative path is read from the working directory
when it is there, else from the data root (``find_data_file``).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rodeco.common.validation import ConfigError

log = logging.getLogger(__name__)

DATA_ENV = "RODECO_DATA"
SHARED = Path("..") / "shared" / "data"  # the default data root, beside the working directory or the checkout


def data_root(root: str | None = None, key: str = "data.root") -> Path:
    """The data root: ``root`` (config key ``key``), else ``$RODECO_DATA``, else ``../shared/data`` beside the
    working directory or this checkout; a ``ConfigError`` naming ``key`` when there is none."""
    for value, where in ((root, key), (os.environ.get(DATA_ENV), f"{DATA_ENV} (environment)")):
        if value:
            p = Path(value).expanduser()
            if not p.is_dir():
                raise ConfigError(
                    where, value, "no such folder", f"point {where} at the folder that holds prompts/ and prefs/"
                )
            return p.resolve()
    tried = [Path.cwd() / SHARED, Path(__file__).resolve().parents[1] / SHARED]
    for c in tried:
        if c.is_dir():
            return c.resolve()
    raise ConfigError(
        key,
        None,
        f"no data folder: {key} and {DATA_ENV} are unset and there is no ../shared/data "
        f"(looked in {[str(c) for c in tried]})",
        f"set {key}=DIR or {DATA_ENV}=DIR (the folder that holds prompts/ and prefs/); or give a file "
        "of your own (data.path=FILE) or a hub dataset (data.hf=NAME)",
    )


def find_data_file(path: str | Path, key: str, root: str | None = None, root_key: str = "data.root") -> Path:
    """``path`` as given when it exists (absolute, or relative to the working directory), else under the data root
    (``data_root(root)``); a ``ConfigError`` naming ``key`` when it is in neither."""
    p = Path(path).expanduser()
    if p.is_absolute() or p.exists():
        if not p.exists():
            raise ConfigError(key, str(path), "no such file", "give the path of an existing file")
        return p
    q = data_root(root, root_key) / p
    if not q.exists():
        raise ConfigError(
            key,
            str(path),
            f"no such file in the working directory ({Path.cwd()}) or the data root ({q.parent})",
            "give an existing file's path, or point data.root (RODECO_DATA) at the folder that holds it",
        )
    return q


@dataclass(frozen=True)
class Prompt:
    index: int  # position in the source: results are keyed and resumed by it
    text: str
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)  # the record beyond its text


def _check_text(text: object, where: str, key: str) -> str:
    if not isinstance(text, str):
        raise ConfigError(
            key, text, f"{where}: the prompt is {type(text).__name__}, not a string", "give each prompt as a string"
        )
    if not text.strip():
        raise ConfigError(key, text, f"{where}: empty prompt", "remove it or give it some text")
    return text


def load_prompts(
    path: str | None = None,
    prompts: list[str] | None = None,
    field: str = "prompt",
    offset: int = 0,
    limit: int | None = None,
    indices: list[int] | None = None,
    root: str | None = None,
    hf: HubSource | None = None,
) -> list[Prompt]:
    """The prompts of a file (``path``: see ``find_data_file``), an inline list or a ``datasets`` source, each keyed
    by its position there; ``indices`` picks positions (in that order) before ``offset`` and ``limit`` apply."""
    given = [k for k, v in (("data.path", path), ("data.prompts", prompts), ("data.hf", hf)) if v is not None]
    if len(given) != 1:
        raise ConfigError(
            "data.path",
            path,
            f"give exactly one of data.path, data.prompts and data.hf (given: {given or 'none'})",
            "e.g. data.path=prompts.jsonl, data.prompts='[\"Hello\"]' or "
            "data.hf=tatsu-lab/alpaca_eval, the others null",
        )
    records: list[tuple[str, dict[str, Any]]]
    if prompts is not None:
        records = [(_check_text(t, f"prompt {i}", "data.prompts"), {}) for i, t in enumerate(prompts)]
    elif hf is not None:
        records = [(t, {}) for t in hf.texts(field)]
    else:
        assert path is not None  # exactly one source was given
        records = _read_file(find_data_file(path, "data.path", root), field)
    return selected([Prompt(i, t, meta) for i, (t, meta) in enumerate(records)], indices, offset, limit)


def selected(out: list[Prompt], indices: list[int] | None, offset: int = 0, limit: int | None = None) -> list[Prompt]:
    """``indices`` picks positions of ``out`` (in that order), then ``offset`` and ``limit`` apply."""
    if indices is not None:
        bad = [i for i in indices if not 0 <= int(i) < len(out)]
        if bad:
            raise ConfigError(
                "data.indices",
                bad[:5],
                f"positions outside the {len(out)} prompts",
                "give positions in the prompt source, or data.indices=null for all",
            )
        out = [out[int(i)] for i in indices]
    out = out[offset:]
    return out[:limit] if limit is not None else out


def prompts_of(data: Any) -> list[Prompt]:
    """The prompts a ``data`` config node describes (its shard ``data.shard`` of ``data.num_shards``, if set)."""
    out = load_prompts(
        data.path,
        data.prompts,
        data.field,
        data.offset,
        data.limit,
        data.get("indices"),
        data.get("root"),
        HubSource.of(data),
    )
    return shard_of(out, data.get("num_shards", 1), data.get("shard", 0), data.get("batch_prompts", 1))


@dataclass(frozen=True)
class HubSource:
    """``data.hf``: a dataset on the hub (``tatsu-lab/alpaca_eval``) or a local folder of JSON/JSONL files, loaded
    by ``datasets.load_dataset(name, subset, split=split)``."""

    name: str
    subset: str | None = None
    split: str = "train"

    @classmethod
    def of(cls, data: Any) -> HubSource | None:
        name = data.get("hf")
        return None if name is None else cls(str(name), data.get("hf_subset"), str(data.get("split") or "train"))

    def texts(self, field: str) -> list[str]:
        try:
            import datasets
        except ImportError:
            raise ConfigError(
                "data.hf",
                self.name,
                "needs the datasets package",
                "pip install 'rodeco[data]' (or datasets), or give a file: data.path=FILE",
            ) from None
        try:
            ds = datasets.load_dataset(self.name, self.subset, split=self.split)
        except ValueError as e:  # an unknown split or subset
            raise ConfigError(
                "data.split",
                self.split,
                f"{self.name}: {e}",
                "name one of its splits (data.split) or subsets (data.hf_subset)",
            ) from None
        if field not in ds.column_names:
            raise ConfigError(
                "data.field",
                field,
                f"{self.name} has no column {field!r} (it has {ds.column_names})",
                "set data.field to the column that holds the prompt text",
            )
        where = f"{self.name} ({self.split})"
        return [_check_text(t, f"{where}, row {i}", "data.hf") for i, t in enumerate(ds[field])]


def batches_of(prompts: list[Prompt], size: int) -> list[list[Prompt]]:
    """Consecutive batches of ``size`` prompts: how a run groups its prompts (and how shards deal them out)."""
    return [prompts[i : i + size] for i in range(0, len(prompts), size)]


def shard_of(prompts: list[Prompt], num_shards: int, shard: int, batch: int = 1) -> list[Prompt]:
    """Shard ``shard`` of ``num_shards``: the run's batches of ``batch`` prompts dealt round-robin, so every batch
    is the one the unsharded run decodes (same prompts, same budget split, same results), shards are disjoint and
    together all prompts, and long and short prompts spread evenly. Prompts keep their ``index``."""
    if not isinstance(num_shards, int) or isinstance(num_shards, bool) or num_shards < 1:
        raise ConfigError("data.num_shards", num_shards, "must be a positive integer", "e.g. data.num_shards=4")
    if not isinstance(shard, int) or isinstance(shard, bool) or not 0 <= shard < num_shards:
        raise ConfigError(
            "data.shard",
            shard,
            f"must be in 0..{num_shards - 1} (data.num_shards={num_shards})",
            f"e.g. data.shard=0, or 'data.shard=range({num_shards})' with --multirun",
        )
    return [p for b in batches_of(prompts, max(1, batch))[shard::num_shards] for p in b]


def _read_file(path: Path, field: str) -> list[tuple[str, dict[str, Any]]]:
    """Each record's prompt (its ``field``) and its other fields (a ``gold_answer``: the prompt's ``meta``)."""
    if not path.is_file():
        raise ConfigError(
            "data.path",
            str(path),
            f"no such file (looked in {Path.cwd()})",
            "give the path of a JSON or JSONL file of records with a prompt field",
        )
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json" or text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(
                "data.path",
                str(path),
                f"not valid JSON (line {e.lineno}: {e.msg})",
                "fix the file, or use JSONL with one record per line",
            ) from None
        if not isinstance(records, list):
            raise ConfigError(
                "data.path", str(path), "a JSON file must hold a list of records", 'write [{"prompt": "..."}, ...]'
            )
        numbered = [(f"record {i}", r) for i, r in enumerate(records)]
    else:
        numbered = []
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                numbered.append((f"line {lineno}", json.loads(line)))
            except json.JSONDecodeError as e:
                raise ConfigError(
                    "data.path",
                    str(path),
                    f"line {lineno} is not valid JSON ({e.msg})",
                    f"fix line {lineno}: each line must be one JSON object",
                ) from None
    out: list[tuple[str, dict[str, Any]]] = []
    for where, rec in numbered:
        if isinstance(rec, str):
            out.append((_check_text(rec, f"{path}, {where}", "data.path"), {}))
        elif isinstance(rec, dict) and field in rec:
            meta = {k: v for k, v in rec.items() if k != field}
            out.append((_check_text(rec[field], f"{path}, {where}", "data.path"), meta))
        else:
            keys = sorted(rec) if isinstance(rec, dict) else type(rec).__name__
            raise ConfigError(
                "data.field",
                field,
                f"{path}, {where} has no field {field!r} (it has {keys})",
                "set data.field to the key that holds the prompt text",
            )
    return out
