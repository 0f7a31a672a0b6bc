"""Every command shown in README.md, docs/ (its subfolders too) and the example package's README works. ``rodeco``
command lines are composed through Hydra's compose API and put through the run's config checks (nothing heavy
runs). Every other command (fenced, or inline code) is run when cheap, or parsed and checked against what it names:
a Makefile target (dry-run, its rodeco recipe composed), a script's own argparse parser given the documented
arguments, a ``pip install`` of a project or extra this repository defines, a pytest selection that selects tests,
a file of the docs that a named test runs. A documented command that does not work fails here."""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import re
import runpy
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import pytest
from conftest import REPO, SHARED_DATA

import rodeco
from rodeco.core.config import validate
from rodeco.plugins import BuildContext, get_plugin_manager
from rodeco.tasks import prompts_of

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("**/*.md")), REPO / "plugins" / "rodeco_example" / "README.md"]
PLACEHOLDER = re.compile(r"NAME|<[^>]*>|\bmy_|\.\.\.")  # prose such as `rodeco experiment=NAME`
COMMAND = re.compile(r"^(rodeco|rodeco-serve|make|pip|python|pytest)( |$)")
INLINE = " (inline)"  # where an inline code span was found: `python scripts/x.py` alone names the script
# Files whose text is in the docs (the reader saves them) and the test that runs them as the docs show.
DOC_FILES = {
    "lab.py": (
        "policy-lab.md",
        "test_policy_lab_docs.py",
        "test_the_lab_policy_is_replayed_against_fixed_and_adaptive",
    ),
    "example.py": ("rewards.md", "test_rewards_docs.py", "test_value_function_example_runs"),
}


def documented_commands() -> list[tuple[str, str]]:
    """(where, command) of every command line in a fenced code block, and of inline code spans that are commands
    without placeholders."""
    out = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        name = doc.relative_to(REPO / "docs").as_posix() if doc.is_relative_to(REPO / "docs") else doc.name
        for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
            for line in block.splitlines():
                if COMMAND.match(line.strip()):
                    out.append((name, line.strip()))
        for span in re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S)):
            if COMMAND.match(span) and " " in span and not PLACEHOLDER.search(span):
                out.append((name if span.startswith("rodeco ") else name + INLINE, span))
    return sorted(set(out), key=out.index)


COMMANDS = documented_commands()
RODECO = [(w, c) for w, c in COMMANDS if c.split()[0] in ("rodeco", "rodeco-serve")]
OTHERS = [(w, c) for w, c in COMMANDS if c.split()[0] not in ("rodeco", "rodeco-serve")]


def test_the_docs_show_commands():
    assert len(RODECO) >= 30 and any("data.path=" in c for _, c in RODECO)
    kinds = {c.split()[0] if c.split()[1] not in ("-m",) else "python -m" for _, c in OTHERS}
    assert {"make", "pip", "python", "python -m", "pytest"} <= kinds, kinds
    assert len(OTHERS) >= 25


@pytest.mark.parametrize("where, command", OTHERS)
def test_every_other_documented_command_runs_or_checks_out(where, command, tmp_path):
    tool, *args = shlex.split(command, comments=True)
    if tool == "make":
        check_make(args)
    elif tool == "pip":
        check_pip(args)
    elif tool == "pytest":
        check_pytest(args)
    elif args[:2] == ["-m", "rodeco.core.results"]:
        run_results_export(args[2:], tmp_path)
    elif args and args[0].startswith("scripts/"):
        check_script(args[0], args[1:] if args[1:] or not where.endswith(INLINE) else ["--help"])
    elif args and args[0] in DOC_FILES:
        check_doc_file(where, args[0], args[1:])
    else:
        pytest.fail(f"{where}: `{command}`: no check for this kind of command; add one to test_docs_commands.py")


def make_rules() -> dict[str, list[str]]:
    """The Makefile's rules: target -> recipe lines."""
    rules: dict[str, list[str]] = {}
    target = None
    for line in (REPO / "Makefile").read_text(encoding="utf-8").splitlines():
        m = re.match(r"^([A-Za-z][\w.-]*):(?!=)", line)
        if m:
            target = m.group(1)
            rules[target] = []
        elif line.startswith("\t") and target is not None:
            rules[target].append(line.strip())
        elif not line.strip():
            target = None
    return rules


def check_make(args: list[str]) -> None:
    """Each target is a rule of the Makefile, a dry run of it succeeds, and a ``rodeco`` command in its recipe
    composes and passes the checks (``make demo``, ``make bench``)."""
    rules = make_rules()
    targets = [a for a in args if "=" not in a]
    assert targets and all(t in rules for t in targets), f"make {' '.join(args)}: targets are {sorted(rules)}"
    if shutil.which("make"):
        p = subprocess.run(["make", "-n", *args], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
    for t in targets:
        for line in rules[t]:
            m = re.match(r"^\$\(VENV\)/bin/(rodeco\b.*)$", line)
            if m:
                check_command(m.group(1), rodeco.plugins.default_plugins())


def check_pip(args: list[str]) -> None:
    """``pip install`` of this repository (``.``), one of its plugin directories, or ``rodeco[extra]``: the
    directory holds a pyproject.toml, and a named project is this repository's with those extras."""
    ap = argparse.ArgumentParser(prog="pip", exit_on_error=False)
    ap.add_argument("command", choices=["install"])
    ap.add_argument("-e", "--editable", action="append", default=[])
    ap.add_argument("--no-deps", action="store_true")
    ap.add_argument("--no-build-isolation", action="store_true")
    ap.add_argument("requirements", nargs="*")
    a = ap.parse_args(args)
    for req in [*a.editable, *a.requirements]:
        if req.startswith((".", "/")):
            assert (REPO / req / "pyproject.toml").is_file(), f"pip install {req}: no pyproject.toml there"
            continue
        m = re.fullmatch(r"([\w.-]+)(?:\[([\w,-]+)\])?", req)
        assert m, f"pip install {req}: not a project name with extras"
        project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
        assert m.group(1) == project["name"], f"pip install {req}: this repository is {project['name']}"
        extras = set(m.group(2).split(",")) if m.group(2) else set()
        assert extras <= set(project["optional-dependencies"]), f"pip install {req}: no such extra"


def check_pytest(args: list[str]) -> None:
    """The test files exist and ``-k`` selects at least one test function of them (by name); ``-m`` names only
    markers pyproject.toml registers (without paths: the whole suite)."""
    ap = argparse.ArgumentParser(prog="pytest", exit_on_error=False)
    ap.add_argument("paths", nargs="*")
    ap.add_argument("-k", default=None)
    ap.add_argument("-m", default=None)
    ap.add_argument("-s", action="store_true")
    ap.add_argument("-q", action="store_true")
    a = ap.parse_args(args)
    if a.m is not None:
        import tomllib

        ini = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"]["ini_options"]
        known = {m.split(":")[0].strip() for m in ini["markers"]}
        used = [w for w in re.findall(r"\w+", a.m) if w not in ("and", "or", "not")]
        assert used and set(used) <= known, f"pytest -m {a.m}: markers {used}, registered {sorted(known)}"
    if not a.paths:
        assert a.k is None, "pytest -k without paths: name the test files"
        return
    names = []
    for path in a.paths:
        f = REPO / path.split("::")[0]
        assert f.is_file(), f"pytest {path}: no such file"
        names += [
            n.name
            for n in ast.walk(ast.parse(f.read_text(encoding="utf-8")))
            if isinstance(n, ast.FunctionDef) and n.name.startswith("test")
        ]
    words = [w for w in re.findall(r"\w+", a.k or "") if w not in ("and", "or", "not")]
    assert any(all(w in n for w in words) for n in names), f"pytest -k {a.k}: selects none of {names}"


class Parsed(Exception):
    """Raised once the outermost argparse call of a script returns: its arguments are parsed, nothing has run."""

    def __init__(self, namespace: argparse.Namespace, extras: list[str]) -> None:
        super().__init__("parsed")
        self.namespace, self.extras = namespace, extras


@contextmanager
def parse_only() -> Iterator[None]:
    """argparse as it is (its errors, ``--help``, sub-commands), except that the outermost ``parse_args`` or
    ``parse_known_args`` raises ``Parsed`` instead of returning."""
    depth = 0

    def wrap(real, known: bool):
        def parse(self, args=None, namespace=None):
            nonlocal depth
            depth += 1
            try:
                out = real(self, args, namespace)
            finally:
                depth -= 1
            if depth == 0:
                raise Parsed(*(out if known else (out, [])))
            return out

        return parse

    P = argparse.ArgumentParser
    with (
        mock.patch.object(P, "parse_args", wrap(P.parse_args, False)),
        mock.patch.object(P, "parse_known_args", wrap(P.parse_known_args, True)),
    ):
        yield


def check_script(path: str, args: list[str]) -> None:
    """The script, run as ``python <path> <args>`` up to its argument parsing: its own parser accepts the
    documented arguments (``--help``: it has a parser). Config overrides it passes on (``allocate_bench``'s extra
    arguments, ``scale_bench``'s ``overrides``) compose as a ``rodeco`` command's would."""
    assert (REPO / path).is_file(), f"{path}: no such script"
    script_dir = str((REPO / path).parent)  # python puts a script's own directory first on sys.path
    with (
        mock.patch.object(sys, "argv", [str(REPO / path), *args]),
        mock.patch.object(sys, "path", [script_dir, *sys.path]),
        parse_only(),
    ):
        try:
            runpy.run_path(str(REPO / path), run_name="__main__")
        except Parsed as p:
            overrides = [*p.extras, *getattr(p.namespace, "overrides", [])]
            if overrides:
                check_command(shlex.join(["rodeco", *overrides]), rodeco.plugins.default_plugins())
            return
        except SystemExit as e:
            assert e.code == 0 and args == ["--help"], f"python {path} {shlex.join(args)}: its parser refused them"
            return
    pytest.fail(f"python {path}: it ran to the end without parsing its arguments with argparse")


def run_results_export(args: list[str], tmp_path: Path) -> None:
    """``python -m rodeco.core.results RESULTS OUT NAME`` run as documented, in a directory where RESULTS is a run's
    results file."""
    results, out, name = args  # its usage: exactly three arguments
    (tmp_path / results).parent.mkdir(parents=True, exist_ok=True)
    rec = {"prompt_index": 0, "prompt": "Write a haiku.", "best": {"text": "Leaves fall."}}
    (tmp_path / results).write_text(json.dumps(rec) + "\n")
    p = subprocess.run(
        [sys.executable, "-m", "rodeco.core.results", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert p.returncode == 0, p.stderr
    assert json.loads((tmp_path / out).read_text()) == [
        {"instruction": "Write a haiku.", "output": "Leaves fall.", "generator": name}
    ]


def check_doc_file(where: str, name: str, args: list[str]) -> None:
    """A file whose text the docs show (``lab.py``): shown in this doc, and run by the named test, which reads it
    from this doc."""
    doc, test_file, test = DOC_FILES[name]
    assert where.split()[0] == doc and not args, f"{where}: `python {name}` is {doc}'s, without arguments"
    source = (REPO / "tests" / test_file).read_text(encoding="utf-8")
    assert test in {n.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)}, test
    assert f'"{doc}"' in source, f"{test_file} does not read docs/{doc}"
    assert name in (REPO / "docs" / doc).read_text(encoding="utf-8")


def overrides_of(command: str) -> list[str]:
    """The overrides of a `rodeco` command line: flags dropped, a sweep replaced by its first value."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    args = shlex.split(command, comments=True)
    args = ["task=serve", *args[1:]] if args[0] == "rodeco-serve" else args[1:]  # rodeco-serve: rodeco task=serve
    out, skip = [], False
    for a in args:
        if skip or a in ("-m", "--multirun", "--help", "-h", "--info") or a.startswith("hydra"):
            skip = False  # flags, and Hydra's own settings (hydra/launcher=..., hydra.sweep.dir=...): test_scale.py
            continue
        if a in ("--cfg", "-c", "--package", "-p"):
            skip = True
            continue
        o = OverridesParser.create().parse_override(a)
        out.append(f"{a.split('=')[0]}={next(o.sweep_string_iterator())}" if o.is_sweep_override() else a)
    return out


def check_command(command: str, plugins) -> None:
    cfg = rodeco.load_config(overrides_of(command), plugins)
    validate(cfg)
    plugins.rewards.get(cfg.reward.name)
    plugins.build_policy(cfg.policy, BuildContext(plugins=plugins))  # checks the policy's parameters
    if cfg.task == "serve":  # the server's own checks, as at its start-up
        from rodeco.serve import check_binding, check_serve

        check_binding(cfg)
        check_serve(cfg, plugins)
    elif cfg.task == "judge":  # its judges, as task=judge chooses them (names known, none the guide)
        from rodeco.roles import choose, choose_judges

        assert choose_judges(cfg.judge, plugins, (choose(cfg.reward, "reward", plugins),)), command
    elif cfg.task not in ("decode", "merge"):
        plugins.experiments.get(cfg.task)
    if cfg.data.hf is not None:  # a hub dataset: not reachable here (tests/test_data_root.py loads a local one)
        assert cfg.data.path is None and cfg.data.prompts is None, command  # it replaces the option's source
        return
    if cfg.data.source is not None:  # generated by a task source: exactly data.size problems, each with its gold answer
        got = prompts_of(cfg.data)
        assert len(got) == cfg.data.size and all(p.meta.get("gold_answer") is not None for p in got), command
        return
    if cfg.data.root is not None and not Path(cfg.data.root).is_dir():
        cfg.data.root = str(SHARED_DATA)  # a documented placeholder (/data/rodeco): read from this checkout's root
    if cfg.data.path is not None:
        assert cfg.data.prompts is None  # a path replaces the prompts a data option set
        if not (SHARED_DATA / cfg.data.path).is_file():
            return  # the user's own file (prompts.jsonl), or ../shared/data (the data root) is not beside the checkout
    cwd = os.getcwd()
    os.chdir(REPO)  # documented paths are relative to the repository root
    try:
        got = [(p.index, p.text) for p in prompts_of(cfg.data)]
        assert got and got == expected_prompts(cfg.data), command
    finally:
        os.chdir(cwd)


def expected_prompts(data) -> list[tuple[int, str]]:
    """(position, text) of the prompts a ``data`` node selects, read here from its source: the inline list or the
    file's records (a JSON list or JSONL, the text under ``data.field``); then ``data.indices`` (in their order),
    ``data.offset``, ``data.limit``, and the shard's batches of ``data.batch_prompts`` dealt round-robin."""
    if data.prompts is not None:
        source = list(data.prompts)
    else:
        path = Path(data.path) if Path(data.path).is_file() else SHARED_DATA / data.path  # else: the data root
        text = path.read_text(encoding="utf-8")
        records = (
            json.loads(text)
            if text.lstrip().startswith("[")
            else [json.loads(line) for line in text.splitlines() if line.strip()]
        )
        source = [r if isinstance(r, str) else r[data.field] for r in records]
    positions = list(data.indices) if data.indices is not None else list(range(len(source)))
    positions = positions[data.offset :][: data.limit]  # limit null: all
    batches = [positions[i : i + data.batch_prompts] for i in range(0, len(positions), data.batch_prompts)]
    return [(i, source[i]) for batch in batches[data.shard :: data.num_shards] for i in batch]


@pytest.mark.parametrize("where, command", RODECO)
def test_every_documented_rodeco_command_composes_and_passes_the_checks(where, command, request):
    plugins = None
    if "example_" in command:  # the example package's commands: install it as the docs say
        request.getfixturevalue("installed_example")
        importlib.invalidate_caches()
        plugins = get_plugin_manager()
    check_command(command, plugins or rodeco.plugins.default_plugins())


def test_help_shows_rodecos_own_text_and_its_examples_work():
    p = subprocess.run(
        [str(Path(sys.executable).with_name("rodeco")), "--help"], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    assert "powered by Hydra" not in p.stdout and p.stdout.startswith("rodeco: reward-oriented decoding")
    for group, option in [
        ("generator", "smollm2"),
        ("reward", "minilm_rm"),
        ("policy", "fixed"),
        ("budget", "cpu"),
        ("data", "demo"),
        ("experiment", "efficiency"),
    ]:
        assert re.search(rf"^\s+{group}={option}\s+\S", p.stdout, re.M), f"{group}={option} not listed"
    line = {m.group(1): m.group(2) for m in re.finditer(r"^\s+reward=(\w+)\s+(.*)$", p.stdout, re.M)}
    assert [r for r, text in line.items() if "default" in text] == ["minilm_rm"], line  # the one default reward
    assert "prefix-trained head" in line["minilm_prefix"] and "partial_reward" in line["minilm_prefix"]
    examples = re.findall(r"^  (rodeco\b.*?)(?:\s{3,}.*)?$", p.stdout.split("Examples:")[1], re.M)
    assert len(examples) >= 3
    for command in examples:
        check_command(command, rodeco.plugins.default_plugins())
