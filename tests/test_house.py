"""The house rules a linter does not check, read from the source's syntax trees: no function over 80 lines outside
tests, no import cycle among scripts/, every device question asked of ``rodeco.hardware``, and mypy configured
over all of the code."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE = ("rodeco", "plugins", "scripts")
MAX_LINES = 80
# the device probes: the module that answers device questions, and the GPU report that records what torch sees
DEVICE_ANSWERS = {"rodeco/hardware.py", "scripts/gpu_report.py"}


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


def script_imports(scripts: Path) -> dict[str, set[str]]:
    """Each script's imports of other scripts (they import each other by bare module name), at any depth of its
    syntax tree: a function's deferred import counts too."""
    names = {p.stem for p in scripts.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for p in scripts.glob("*.py"):
        deps: set[str] = set()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import):
                deps |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                deps.add(node.module.split(".")[0])
        graph[p.stem] = (deps & names) - {p.stem}
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle in ``graph`` (its modules in order, the first repeated last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return path[path.index(d) :] + [d]
            if d not in state and (found := visit(d)):
                return found
        state[m] = 2
        path.pop()
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


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


def test_scripts_import_each_other_without_a_cycle():
    graph = script_imports(ROOT / "scripts")
    assert graph, "no scripts found"
    assert cycle(graph) is None


def test_the_cycle_check_finds_a_cycle_of_any_length_and_deferred_imports(tmp_path):
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("from c import x\n")
    (tmp_path / "c.py").write_text("def f():\n    from a import y\n")
    (tmp_path / "d.py").write_text("import a\nimport os\n")
    assert cycle(script_imports(tmp_path)) == ["a", "b", "c", "a"]
    (tmp_path / "c.py").write_text("import os\n")
    assert cycle(script_imports(tmp_path)) is None


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
