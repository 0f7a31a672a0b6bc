"""Every figure in docs/results.md's claims table is in the snapshot that its row names.

The test reads the "Current claims" table row by row. A row's snapshot cell names one or more committed files in
backticks (paths from the repository root); "the same" means the previous row's snapshot. A row whose snapshot is
"none committed" is not checked (the test prints how many, and which). A named file that does not exist fails the
row.

From each snapshot the test collects every number: JSON numbers at any depth, strings and object keys that are a
number in full, and for a ``.txt`` snapshot every number in its text (a ``.json.gz`` is read through gzip). A row
that names several snapshots is checked against all of their numbers.

From the row's figure cell (code spans left out, a Unicode minus read as a minus) it checks:

- every CI triple ``v [lo, hi]`` (also written ``v× [lo, hi]`` or ``v [lo, hi] ×``): v, lo and hi must each match
  a snapshot number, and the three must sit together: one of them directly in a JSON object or list, the others in
  that one or in its direct children, as in ``[v, lo, hi]``, ``{"value": v, "ci": [lo, hi]}`` or
  ``{"ratio": v, "ratio_ci_low": lo, ...}``;
- every other ratio ``N×``: it must match a snapshot number;
- every other number printed with decimals (``0.177``, ``14.4 s``, ``12.5%``) and every whole number of GFLOPs or
  TFLOPs: it must match a snapshot number. A setting written after ``=`` or ``≈`` (``α = 0.5``) is left out.

Other whole numbers (counts such as "56 held-out pairs", N of Best-of-N, "at 429") are not checked. A lone figure
with few digits (``0.62×``) is a weak check: in a large snapshot some unrelated number may round to it.

"Match" means the snapshot's number rounds to the figure at the precision printed: 0.158 matches 0.15812, 2.53
matches 2.5317, +0.000 matches -0.0003, and a percentage also matches its fraction (12.5% matches 0.1251). A figure
the docs derive from a snapshot (a ratio of two of its numbers, a pooled CI) does not match; such a figure belongs
in the claim's text, said to be derived, not in the figure cell.
"""

from __future__ import annotations

import bisect
import gzip
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results.md"
TABLE_HEADING = "## Current claims"

# A number as the docs print it: an optional sign only where it starts a word, thousands with commas.
NUMBER = r"(?<![\w.])(?:[+-](?=\d))?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
TRIPLE = re.compile(rf"({NUMBER})\s*×?\s*\[\s*({NUMBER})\s*,\s*({NUMBER})\s*\]")
RATIO = re.compile(rf"({NUMBER})×")
PLAIN = re.compile(rf"({NUMBER})(%?)")
FLOPS_UNIT = re.compile(r"\s*[GT]FLOPs\b")  # a whole number before it is a figure too
SETTING = re.compile(r"[=≈]\s*$")  # the text before a number that makes it a setting, not a figure
TEXT_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


@dataclass(frozen=True)
class Row:
    """One row of the claims table: its line in the file, claim, figure cell and the snapshot files it names (None
    where none is committed)."""

    line: int
    claim: str
    figure: str
    snapshots: tuple[str, ...] | None


@dataclass(frozen=True)
class Figure:
    """A figure to check: ``ci`` (value, low, high), ``ratio`` or ``value``, as the docs print them."""

    kind: str
    texts: tuple[str, ...]

    def __str__(self) -> str:
        if self.kind == "ci":
            return f"{self.texts[0]} [{self.texts[1]}, {self.texts[2]}]"
        return self.texts[0] + ("×" if self.kind == "ratio" else "")


@dataclass
class Snapshot:
    """The numbers of one or more snapshot files, sorted, each with the ids of the containers it sits in (its own
    object or list, and that one's parent)."""

    values: list[float] = field(default_factory=list)
    groups: list[tuple[int, ...]] = field(default_factory=list)

    def add(self, value: float, groups: tuple[int, ...]) -> None:
        if not math.isfinite(value):  # NaN would break the sorted search
            return
        self.values.append(value)
        self.groups.append(groups)

    def sort(self) -> Snapshot:
        order = sorted(range(len(self.values)), key=self.values.__getitem__)
        return Snapshot([self.values[i] for i in order], [self.groups[i] for i in order])

    def matches(self, text: str) -> set[int]:
        """Indices of the numbers that round to the figure ``text`` at the precision printed."""
        found: set[int] = set()
        for value, tolerance in readings(text):
            lo = bisect.bisect_left(self.values, value - tolerance)
            hi = bisect.bisect_right(self.values, value + tolerance)
            found.update(range(lo, hi))
        return found

    def together(self, texts: tuple[str, ...]) -> bool:
        """Whether the figures match numbers that sit together: one of them directly in a container, the others in
        it or in its direct children."""
        shared: set[int] | None = None
        own: set[int] = set()
        for text in texts:
            matched = self.matches(text)
            own |= {self.groups[i][0] for i in matched}
            ids = {g for i in matched for g in self.groups[i]}
            shared = ids if shared is None else shared & ids
        return bool(shared and shared & own)


def normalise(text: str) -> str:
    """A Unicode minus read as a minus, thin and no-break spaces as spaces."""
    return text.replace("−", "-").replace("\u2009", " ").replace("\xa0", " ")


def readings(text: str) -> list[tuple[float, float]]:
    """(value, tolerance) pairs a printed figure stands for: the value rounded at its printed precision, and for a
    percentage its fraction too."""
    percent = text.endswith("%")
    digits = text.rstrip("%").replace(",", "")
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    value = float(digits)
    tolerance = 0.5 * 10**-decimals + 1e-9 * max(1.0, abs(value))
    out = [(value, tolerance)]
    if percent:
        out.append((value / 100, tolerance / 100))
    return out


def split_row(line: str) -> list[str]:
    """A table row's cells; a ``|`` inside a code span does not split them."""
    cells: list[str] = []
    current: list[str] = []
    code = False
    for char in line.strip().strip("|"):
        if char == "`":
            code = not code
        if char == "|" and not code:
            cells.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    cells.append("".join(current).strip())
    return cells


def parse_rows(text: str) -> list[Row]:
    """The claims table's rows, with "the same" resolved to the previous row's snapshot."""
    lines = text.splitlines()
    start = lines.index(TABLE_HEADING)
    rows: list[Row] = []
    previous: tuple[str, ...] | None = None
    header_seen = False
    for number, line in enumerate(lines[start + 1 :], start + 2):
        if line.startswith("## "):
            break
        if not line.startswith("|"):
            continue
        cells = split_row(line)
        if not header_seen:
            assert cells[:4] == ["claim", "figure [95% CI]", "command", "snapshot"], cells
            header_seen = True
            continue
        if set(line) <= set("|-: "):
            continue
        assert len(cells) == 4, f"results.md:{number}: {len(cells)} cells"
        claim, figure, _, snapshot = cells
        if snapshot == "the same":
            assert rows, f"results.md:{number}: the first row cannot say 'the same'"
            snapshots = previous
        elif snapshot == "none committed":
            snapshots = None
        else:
            snapshots = tuple(re.findall(r"`([^`]+)`", snapshot))
            assert snapshots, f"results.md:{number}: snapshot cell {snapshot!r} names no file"
        rows.append(Row(number, claim, figure, snapshots))
        previous = snapshots
    return rows


def figures(cell: str) -> list[Figure]:
    """The figures of a figure cell that the test checks (see the module's docstring)."""
    text = normalise(re.sub(r"`[^`]*`", lambda m: " " * len(m.group()), cell))
    out: list[Figure] = []
    taken: list[tuple[int, int]] = []
    for m in TRIPLE.finditer(text):
        out.append(Figure("ci", (m.group(1), m.group(2), m.group(3))))
        taken.append(m.span())
    for m in RATIO.finditer(text):
        if not any(a <= m.start() < b for a, b in taken):
            out.append(Figure("ratio", (m.group(1),)))
            taken.append(m.span())
    for m in PLAIN.finditer(text):
        if any(a <= m.start() < b for a, b in taken) or SETTING.search(text[: m.start()]):
            continue
        if "." not in m.group(1) and not FLOPS_UNIT.match(text, m.end()):
            continue
        out.append(Figure("value", (m.group(1) + m.group(2),)))
    return out


def _walk(node: Any, snapshot: Snapshot, parents: tuple[int, ...], counter: Iterator[int]) -> None:
    """Adds every number under ``node``; ``parents`` are the ids of its container and that one's parent."""
    if isinstance(node, bool) or node is None:
        return
    if isinstance(node, int | float):
        snapshot.add(float(node), parents)
    elif isinstance(node, str):
        if TEXT_NUMBER.fullmatch(node.strip()):
            snapshot.add(float(node), parents)
    elif isinstance(node, dict | list):
        own = next(counter)
        inner = (own, parents[0]) if parents else (own,)
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in items:
            if isinstance(key, str) and TEXT_NUMBER.fullmatch(key.strip()):
                snapshot.add(float(key), inner)
            _walk(child, snapshot, inner, counter)


@cache
def load(path: str) -> Snapshot:
    """Every number of one snapshot file."""
    file = REPO / path
    snapshot = Snapshot()
    counter = iter(range(1 << 48))
    if path.endswith(".txt"):
        for m in TEXT_NUMBER.finditer(file.read_text(encoding="utf-8")):
            snapshot.add(float(m.group()), (next(counter),))
        return snapshot.sort()
    raw = gzip.decompress(file.read_bytes()) if path.endswith(".gz") else file.read_bytes()
    _walk(json.loads(raw), snapshot, (), counter)
    return snapshot.sort()


def combined(paths: tuple[str, ...]) -> Snapshot:
    """The numbers of several snapshot files together (a container of one file never shares an id with another's)."""
    if len(paths) == 1:
        return load(paths[0])
    snapshot = Snapshot()
    for index, path in enumerate(paths):
        part = load(path)
        for value, groups in zip(part.values, part.groups, strict=True):
            snapshot.add(value, tuple(index << 48 | g for g in groups))
    return snapshot.sort()


def problems(row: Row, snapshot: Snapshot) -> list[str]:
    """What of the row's figure cell its snapshot does not hold."""
    out = []
    for figure in figures(row.figure):
        missing = [t for t in figure.texts if not snapshot.matches(t)]
        if missing:
            out.append(f"{figure}: {', '.join(missing)} not in the snapshot")
        elif figure.kind == "ci" and not snapshot.together(figure.texts):
            out.append(f"{figure}: the three numbers are in the snapshot but not together")
    return out


def rows() -> list[Row]:
    """The rows of docs/results.md's claims table."""
    return parse_rows(RESULTS.read_text(encoding="utf-8"))


def test_claims_table_parses() -> None:
    parsed = rows()
    skipped = [r for r in parsed if r.snapshots is None]
    print(f"{len(parsed)} claims rows: {len(parsed) - len(skipped)} checked, {len(skipped)} with no snapshot")
    for row in skipped:
        print(f"  skipped (none committed), results.md:{row.line}: {row.claim[:80]}")
    assert len(parsed) >= 10
    assert all(figures(r.figure) for r in parsed if r.snapshots is not None)


@pytest.mark.parametrize("row", [r for r in rows() if r.snapshots is not None], ids=lambda r: f"line{r.line}")
def test_claim_figures_are_in_their_snapshot(row: Row) -> None:
    assert row.snapshots is not None
    absent = [p for p in row.snapshots if not (REPO / p).is_file()]
    assert not absent, f"results.md:{row.line}: snapshot not committed: {absent}"
    found = problems(row, combined(row.snapshots))
    assert not found, f"results.md:{row.line} ({row.claim[:60]}...), {', '.join(row.snapshots)}:\n" + "\n".join(found)


def _synthetic(data: Any) -> Snapshot:
    snapshot = Snapshot()
    _walk(data, snapshot, (), iter(range(1 << 48)))
    return snapshot.sort()


def test_a_figure_not_in_the_snapshot_is_caught() -> None:
    data = {
        "ratio": 1.7012,
        "ci": [1.6893, 1.7201],
        "acc": [0.15812, 0.1342, 0.1838],
        "other": {"x": 0.5},
        "gflops": 218.29,
        "flops_ratio": float("nan"),
    }
    snapshot = _synthetic(data)
    table = "\n".join(
        [
            TABLE_HEADING,
            "",
            "| claim | figure [95% CI] | command | snapshot |",
            "|---|---|---|---|",
            "| a | 1.70× [1.69, 1.72]; 0.158 [0.134, 0.184] | `x` | `docs/data/x.json` |",
            "| b | 1.70× [1.69, 1.73] | the same | the same |",
            "| c | 0.158 [0.134, 0.500] | the same | the same |",
            "| d | 0.158 [0.134, 0.184]; 2.53× | the same | the same |",
            "| e | −0.159 at α = 0.5 | the same | the same |",
            "| f | 0.158 at 218 GFLOPs, 219 GFLOPs; 56 pairs | the same | the same |",
            "| g | 9.9 | x | none committed |",
        ]
    )
    parsed = parse_rows(table)
    assert [r.snapshots for r in parsed] == [("docs/data/x.json",)] * 6 + [None]
    assert problems(parsed[0], snapshot) == []
    assert problems(parsed[1], snapshot) == ["1.70 [1.69, 1.73]: 1.73 not in the snapshot"]
    assert problems(parsed[2], snapshot) == [
        "0.158 [0.134, 0.500]: the three numbers are in the snapshot but not together"
    ]
    assert problems(parsed[3], snapshot) == ["2.53×: 2.53 not in the snapshot"]
    assert problems(parsed[4], snapshot) == ["-0.159: -0.159 not in the snapshot"]
    assert problems(parsed[5], snapshot) == ["219: 219 not in the snapshot"]


def test_a_changed_figure_in_the_real_table_is_caught() -> None:
    """The first checked row with a CI, its high end moved by one in the last digit printed, fails against its own
    snapshot."""
    row = next(r for r in rows() if r.snapshots is not None and any(f.kind == "ci" for f in figures(r.figure)))
    assert row.snapshots is not None
    snapshot = combined(row.snapshots)
    assert problems(row, snapshot) == []
    ci = next(f for f in figures(row.figure) if f.kind == "ci")
    high = ci.texts[2]
    decimals = len(high.split(".")[1]) if "." in high else 0
    moved = f"{float(normalise(high)) + 10**-decimals:.{decimals}f}"
    text = normalise(row.figure)
    at = text.index(f", {normalise(high)}]")
    changed = Row(row.line, row.claim, text[:at] + f", {moved}]" + text[at + len(high) + 3 :], row.snapshots)
    assert problems(changed, snapshot), changed.figure


def test_rounding_and_units_of_a_match() -> None:
    snapshot = Snapshot()
    for v in (0.15812, 2.5317, -0.0003, 0.1251, 99882):
        snapshot.add(v, (0,))
    snapshot = snapshot.sort()
    assert snapshot.matches("0.158") and snapshot.matches("2.53") and snapshot.matches("+0.000")
    assert snapshot.matches("12.5%") and snapshot.matches("99,882")
    assert not snapshot.matches("0.159") and not snapshot.matches("2.54") and not snapshot.matches("0.12")
