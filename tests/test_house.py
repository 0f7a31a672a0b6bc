"""The house rules a linter does not check, read from the source's syntax trees: no function over 80 lines outside
tests, no ``sys.path`` edits, scripts/ thin command lines over the package, every device question asked of
``rodeco.common.hardware``, and mypy configured over all of the code."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE = ("rodeco", "plugins", "scripts")
MAX_LINES = 80
# the device probes: the module that answers device questions, and the GPU report that records what torch sees
DEVICE_ANSWERS = {"rodeco/common/hardware.py", "rodeco/experiments/bench/gpu_report.py"}
THIN_LINES = 12  # a script's command line: a docstring, the import of its main, the call
TOOLS = {"layers.py"}  # the repository's own tool (docs/guide.md's layer table from pyproject.toml), not a benchmark


def sources(base: Path, *roots: str) -> list[Path]:
    return sorted(p for r in roots for p in (base / r).rglob("*.py"))


def long_functions(path: Path, base: Path = ROOT, limit: int = MAX_LINES) -> list[str]:
    """``path:line name (n lines)`` for each function longer than ``limit`` lines, counted from ``def`` to its last
    line (docstring, comments and blank lines included)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = (node.end_lineno or node.lineno) - node.lineno + 1
            if n > limit:
                out.append(f"{path.relative_to(base)}:{node.lineno} {node.name} ({n} lines)")
    return out


def sys_path_edits(path: Path, base: Path = ROOT) -> list[str]:
    """``path:line`` for each call that changes ``sys.path`` (``sys.path.insert``, ``.append``, ``.extend``)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("insert", "append", "extend") and ast.unparse(node.func.value) == "sys.path":
                out.append(f"{path.relative_to(base)}:{node.lineno}")
    return out


def is_thin(path: Path, limit: int = THIN_LINES) -> bool:
    """A command line: at most ``limit`` lines, no function or class of its own, its ``main`` imported from a
    package module."""
    tree = ast.parse(path.read_text())
    defines = any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in tree.body)
    mains = [
        n
        for n in tree.body
        if isinstance(n, ast.ImportFrom) and n.module and "." in n.module and n.names[0].name == "main"
    ]
    return len(path.read_text().splitlines()) <= limit and not defines and bool(mains)


def device_questions(path: Path, base: Path = ROOT) -> list[str]:
    """``line: code`` for each place that asks torch about the machine's devices itself: ``torch.cuda.is_available``,
    ``torch.cuda.device_count``, a device's ``.type`` compared with ``"cuda"`` or ``"cpu"``, or a device name's
    ``.startswith("cuda")``."""
    src = path.read_text()
    out = []
    for node in ast.walk(ast.parse(src)):
        asks = False
        if isinstance(node, ast.Attribute) and node.attr in ("is_available", "device_count"):
            asks = ast.unparse(node.value) == "torch.cuda"
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute) and node.left.attr == "type":
            asks = any(isinstance(c, ast.Constant) and c.value in ("cuda", "cpu") for c in node.comparators)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "startswith":
            asks = any(isinstance(a, ast.Constant) and a.value == "cuda" for a in node.args)
        if asks:
            out.append(f"{path.relative_to(base)}:{node.lineno}: {ast.get_source_segment(src, node)}")
    return out


def test_no_function_outside_tests_is_longer_than_80_lines():
    assert [f for p in sources(ROOT, *CODE) for f in long_functions(p)] == []


def test_the_length_check_counts_from_def_to_the_last_line(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES - 2))  # with def and pass: 80 lines
    (tmp_path / "m.py").write_text(
        f"def fits():\n{body}\n    pass\n\n\ndef over():\n{body}\n    # a comment\n    pass\n"
    )
    assert long_functions(tmp_path / "m.py", tmp_path) == [f"m.py:{MAX_LINES + 3} over ({MAX_LINES + 1} lines)"]


def test_no_code_edits_sys_path():
    assert [e for p in sources(ROOT, *CODE) for e in sys_path_edits(p)] == []


def test_scripts_are_thin_command_lines_over_the_package():
    scripts = sorted((ROOT / "scripts").glob("*.py"))
    assert scripts, "no scripts found"
    assert [p.name for p in scripts if p.name not in TOOLS and not is_thin(p)] == []


def test_the_thin_check_refuses_logic_and_the_sys_path_check_sees_edits(tmp_path):
    (tmp_path / "ok.py").write_text('"""x."""\n\nfrom pkg.mod import main\n\nif __name__ == "__main__":\n    main()\n')
    (tmp_path / "logic.py").write_text("from pkg.mod import main\n\n\ndef helper():\n    pass\n")
    (tmp_path / "edit.py").write_text("import sys\n\nsys.path.insert(0, 'x')\n")
    assert is_thin(tmp_path / "ok.py") and not is_thin(tmp_path / "logic.py")
    assert sys_path_edits(tmp_path / "edit.py", tmp_path) == ["edit.py:3"]


def test_device_questions_are_asked_of_rodeco_hardware_only():
    asked = [
        q for p in sources(ROOT, *CODE) if str(p.relative_to(ROOT)) not in DEVICE_ANSWERS for q in device_questions(p)
    ]
    assert asked == []


def test_the_device_check_sees_each_kind_of_question(tmp_path):
    src = 'torch.cuda.is_available()\nn = torch.cuda.device_count()\nx.device.type == "cuda"\nd.startswith("cuda")\n'
    (tmp_path / "m.py").write_text(src + 'w.device.type != "meta"\n')
    assert len(device_questions(tmp_path / "m.py", tmp_path)) == 4


def test_mypy_checks_the_whole_house():
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert sorted(conf["files"]) == sorted(CODE)
    assert conf["check_untyped_defs"] is True
