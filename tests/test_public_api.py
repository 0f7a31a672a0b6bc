"""Plugins (rodeco's own and the example package alike) import only names that ``rodeco`` exports."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest
from conftest import REPO

import rodeco

PLUGIN_FILES = sorted(p for p in (REPO / "plugins").rglob("*.py") if "build" not in p.relative_to(REPO).parts)


def rodeco_imports(path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every import of rodeco or a module of it."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "rodeco":
            out.append((node.lineno, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names if a.name.split(".")[0] == "rodeco"]
    return out


def test_there_are_plugin_files_to_check():
    assert len(PLUGIN_FILES) >= 25 and any("rodeco_example" in str(p) for p in PLUGIN_FILES)


@pytest.mark.parametrize("path", PLUGIN_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_plugins_import_only_rodecos_public_names(path):
    for line, module, names in rodeco_imports(path):
        where = f"{path.relative_to(REPO)}:{line}"
        assert module == "rodeco", f"{where} imports {module}; import from rodeco's public names instead"
        private = [n for n in names if n not in rodeco.__all__]
        assert not private, f"{where} imports {private}, which rodeco does not export"


def test_every_public_name_is_there():
    for name in rodeco.__all__:
        assert getattr(rodeco, name) is not None, name


def test_importing_rodeco_does_not_import_torch():
    p = subprocess.run([sys.executable, "-c", "import sys, rodeco; print('torch' in sys.modules)"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "False", p.stdout + p.stderr
