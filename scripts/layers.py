"""rodeco's layers as a Markdown table, from the one place they are defined: the layers contracts in
``pyproject.toml`` (``[tool.importlinter]``, checked by ``lint-imports``), with each module's purpose taken from the
first sentence of its docstring. The contract over ``rodeco`` orders its children; a child that is a band of layers
(``replays``, ``core``, ``common``) has a contract of its own, whose layers stand in its place, its modules named
``band.module``.

    python scripts/layers.py            # print the table
    python scripts/layers.py --write    # put it in docs/guide.md, between the layers:begin and layers:end markers

``tests/test_layers.py`` checks that docs/guide.md holds exactly what this prints and that every module of
``rodeco/`` is in it. The modules are read, not imported, so this runs without the project's dependencies.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs" / "guide.md"
BEGIN, END = "<!-- layers:begin -->", "<!-- layers:end -->"
SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)\.(?=\s|$)")


def layers_contracts(pyproject: Path = REPO / "pyproject.toml") -> dict[str, dict]:
    """The layers contracts by container: ``rodeco``'s and each band's (``rodeco.core``, ...)."""
    contracts = tomllib.loads(pyproject.read_text(encoding="utf-8"))["tool"]["importlinter"]["contracts"]
    return {c["containers"][0]: c for c in contracts if c["type"] == "layers" and len(c.get("containers", [])) == 1}


def layers_contract(pyproject: Path = REPO / "pyproject.toml") -> dict:
    """The layers contract whose container is ``rodeco``."""
    return layers_contracts(pyproject)["rodeco"]


def bands(pyproject: Path = REPO / "pyproject.toml") -> dict[str, dict]:
    """The bands: each child of ``rodeco`` with a layers contract of its own, by name (``core``), with that contract."""
    return {c.removeprefix("rodeco."): k for c, k in layers_contracts(pyproject).items() if c != "rodeco"}


def layers(contract: dict, band_contracts: dict[str, dict] | None = None) -> list[list[str]]:
    """The layers, top to bottom, each a list of sibling module names (``"a | b"`` -> ``["a", "b"]``); a layer that
    is a band (a key of ``band_contracts``) is its own contract's layers, its modules named ``band.module``."""
    band_contracts = band_contracts or {}
    out = []
    for layer in contract["layers"]:
        siblings = [m.strip() for m in layer.split("|")]
        if len(siblings) == 1 and siblings[0] in band_contracts:
            band = siblings[0]
            out += [[f"{band}.{m}" for m in row] for row in layers(band_contracts[band])]
        else:
            out.append(siblings)
    return out


def module_file(name: str, package: Path = REPO / "rodeco") -> Path:
    """``rodeco/NAME.py`` (``rodeco/BAND/NAME.py`` for ``BAND.NAME``), or a subpackage's ``rodeco/NAME/__init__.py``."""
    *folders, stem = name.split(".")
    folder = package.joinpath(*folders)
    return folder / f"{stem}.py" if (folder / f"{stem}.py").is_file() else folder / stem / "__init__.py"


def first_sentence(path: Path) -> str:
    """The first sentence of a module's docstring, on one line, with reST's ````x```` as Markdown's ```x```."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    if not doc:
        raise SystemExit(f"{path}: no module docstring (its first sentence is the module's entry in the table)")
    paragraph = " ".join(doc.split("\n\n")[0].split())
    end = SENTENCE_END.search(paragraph)
    sentence = paragraph[: end.end()] if end else paragraph
    return sentence.replace("``", "`").replace("|", "\\|")


def entry(name: str, package: Path = REPO / "rodeco") -> str:
    """One module's entry: its name (a subpackage's with its modules) and its purpose."""
    path = module_file(name, package)
    if path.name != "__init__.py":
        return f"`{name}`: {first_sentence(path)}"
    modules = [f"`{p.stem}`" for p in path.parent.glob("*.py") if p.name != "__init__.py"]
    packages = [f"`{p.parent.name}/`" for p in path.parent.glob("*/__init__.py")]
    inner = ", ".join(sorted(modules + packages, key=lambda m: m.strip("`/")))
    return f"`{name}/` ({inner}): {first_sentence(path)}"


def table(contract: dict | None = None) -> str:
    """The layer table: one row per layer, top to bottom; a row's modules are siblings."""
    rows = ["| layer | modules: what each is for (from its docstring) |", "|---|---|"]
    for i, siblings in enumerate(layers(contract or layers_contract(), bands()), 1):
        rows.append(f"| {i} | " + "<br>".join(entry(m) for m in siblings) + " |")
    return "\n".join(rows) + "\n"


def block(text: str) -> str:
    """What lies between the markers in ``text``."""
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise SystemExit(f"{GUIDE}: expected one {BEGIN} and one {END}")
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"


def write(guide: Path = GUIDE) -> None:
    text = guide.read_text(encoding="utf-8")
    block(text)  # both markers are there, once
    head, rest = text.split(BEGIN, 1)
    guide.write_text(f"{head}{BEGIN}\n{table()}{END}{rest.split(END, 1)[1]}", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"replace the table in {GUIDE.relative_to(REPO)}")
    if parser.parse_args(argv).write:
        write()
    else:
        sys.stdout.write(table())


if __name__ == "__main__":
    main()
