"""The layer table in docs/guide.md is what ``scripts/layers.py`` makes of pyproject.toml's layers contracts, and
names every module of ``rodeco/`` and of its bands: the docs and the contracts cannot disagree."""

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
    bands = layers.bands()
    assert sorted(bands) == ["common", "core", "replays"]
    modules = {p.stem for p in core.glob("*.py") if p.name != "__init__.py"}
    modules |= {p.parent.name for p in core.glob("*/__init__.py") if p.parent.name not in bands}
    modules |= {f"{band}.{p.stem}" for band in bands for p in (core / band).glob("*.py") if p.name != "__init__.py"}
    assert not [p for band in bands for p in (core / band).glob("*/__init__.py")]  # a band holds modules only
    rows = layers.table().splitlines()[2:]
    named = [re.findall(r"(?:^\| \d+ \| |<br>)`([\w.]+?)/?`", row) for row in rows]
    assert sorted(m for row in named for m in row) == sorted(modules)  # each once, none missing, none extra
    assert named == layers.layers(layers.layers_contract(), bands)  # in the contracts' order, siblings in one row
    assert all(layers.layers_contract()["layers"].count(band) == 1 for band in bands)  # a band is a layer of its own
    for sub in core.glob("*/__init__.py"):  # a subpackage's row lists its modules
        if sub.parent.name in bands:
            continue
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
    (tmp_path / "p" / "c.py").write_text('"""In a band. More."""\n')
    assert layers.entry("p.c", tmp_path) == "`p.c`: In a band."
    top, band = {"layers": ["p", "bottom"]}, {"p": {"layers": ["c | d", "e"]}}
    assert layers.layers(top, band) == [["p.c", "p.d"], ["p.e"], ["bottom"]]
