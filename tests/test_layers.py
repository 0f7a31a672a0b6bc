"""The layer table in docs/guide.md is what ``scripts/layers.py`` makes of pyproject.toml's layers contract, and
names every module of ``rodeco/``: the docs and the contract cannot disagree."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import REPO
from helpers import load_script

layers = load_script("layers")


def test_the_guide_holds_the_table_the_script_prints():
    text = (REPO / "docs" / "guide.md").read_text(encoding="utf-8")
    assert layers.block(text) == layers.table(), "docs/guide.md is out of date: python scripts/layers.py --write"


def test_every_module_of_rodeco_is_in_the_table_once_in_its_layer():
    core = REPO / "rodeco"
    modules = {p.stem for p in core.glob("*.py") if p.name != "__init__.py"}
    modules |= {p.parent.name for p in core.glob("*/__init__.py")}
    rows = layers.table().splitlines()[2:]
    named = [re.findall(r"(?:^\| \d+ \| |<br>)`(\w+)/?`", row) for row in rows]
    assert sorted(m for row in named for m in row) == sorted(modules)  # each once, none missing, none extra
    assert named == layers.layers(layers.layers_contract())  # in the contract's order, siblings in one row
    for sub in core.glob("*/__init__.py"):  # a subpackage's row lists its modules
        row = next(r for r in rows if f"`{sub.parent.name}/`" in r)
        for p in sub.parent.glob("*.py"):
            assert p.name == "__init__.py" or f"`{p.stem}`" in row, (sub.parent.name, p.stem)


def test_a_modules_entry_is_its_docstrings_first_sentence(tmp_path: Path):
    (tmp_path / "m.py").write_text('"""Scores rows, e.g. the ``best`` one | others.\n\nMore. Text."""\n')
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "__init__.py").write_text('"""A package\nover two lines. Second sentence."""\n')
    (tmp_path / "p" / "b.py").write_text("")
    (tmp_path / "p" / "a.py").write_text("")
    assert layers.entry("m", tmp_path) == "`m`: Scores rows, e.g. the `best` one \\| others."
    assert layers.entry("p", tmp_path) == "`p/` (`a`, `b`): A package over two lines."
    contract = {"layers": ["top", "mid | low"]}
    assert layers.layers(contract) == [["top"], ["mid", "low"]]
