"""Every command shown in README.md, docs/ and the example package's README works: ``rodeco`` command lines are
composed through Hydra's compose API and put through the run's config checks (nothing heavy runs); any other
command must be one that a named test or CI runs. A documented command that does not work fails here."""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, SHARED_DATA

import rodeco
from rodeco.config import validate
from rodeco.data import prompts_of
from rodeco.plugins import BuildContext, get_plugin_manager

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "plugins" / "rodeco_example" / "README.md"]
PLACEHOLDER = re.compile(r"NAME|<[^>]*>|\bmy_|\.\.\.")  # prose such as `rodeco experiment=NAME`

# Documented commands other than `rodeco ...`, and what runs each of them.
OTHERS = {
    "make demo": "test_config.py::test_cli_end_to_end_on_embedded_model runs its command on the embedded model",
    "make test": ".ci/run (CI)",
    "make bench": "the same as `rodeco experiment=engine_bench`, composed here",
    "pip install ./plugins/rodeco_example": "conftest.py::installed_example",
    "python -m rodeco.experiments.efficiency": "test_experiment_efficiency.py (efficiency.main on a run directory)",
    "python -m rodeco.results": "test_python_m_rodeco_results_as_documented below",
    "python lab.py": "test_policy_lab_docs.py (docs/policy-lab.md's lab.py on a tiny pool)",
    "pip install 'rodeco[scale]'": "make setup and CI install the scale extra (test_scale.py uses its launchers)",
    "python scripts/scale_bench.py": "test_scale.py::test_scale_bench_script_prints_the_ratio (on the tiny model)",
    "python scripts/cost_model.py": "test_scale.py::test_cost_model_script_prints_the_table",
    "python scripts/behaviour.py": "test_behaviour_script.py (what it compares and its verdict; the runs take minutes)",
    "make setup-vllm": "make test sets up .venv-vllm the same way (CI)",
    "make test-vllm": "make test runs the same command (CI)",
    "python scripts/vllm_bench.py": "test_vllm.py::test_the_vllm_bench_script_prints_the_speedup (2 prompts, in "
                                    ".venv-vllm)",
    "python scripts/results_tables.py": "test_results_tables.py (snapshot, render, write and check on a synthetic run; "
                                        "check on every doc)",
    "python scripts/allocate_bench.py": "test_allocate.py::test_the_allocate_benchmark_runs_as_documented (a tiny "
                                        "pool)",
    "python scripts/gpu_check.py": "test_gpu_check.py (the CPU steps with --device cpu --quick on a tiny model; the skip "
                                   "without CUDA)",
}


def documented_commands() -> list[tuple[str, str]]:
    """(where, command) of every command line in a fenced code block, and of `rodeco ...` inline code spans."""
    out = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
            for line in block.splitlines():
                if re.match(r"^(rodeco|make|pip|python)( |$)", line.strip()):
                    out.append((doc.name, line.strip()))
        for span in re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S)):
            if span.startswith("rodeco ") and not PLACEHOLDER.search(span):
                out.append((doc.name, span))
    return out


COMMANDS = documented_commands()
RODECO = [(w, c) for w, c in COMMANDS if c.split()[0] == "rodeco"]


def test_the_docs_show_commands():
    assert len(RODECO) >= 30 and any("data.path=" in c for _, c in RODECO)


@pytest.mark.parametrize("where, command", [x for x in COMMANDS if x not in RODECO])
def test_every_other_documented_command_is_run_somewhere(where, command):
    assert any(command.startswith(k) for k in OTHERS), (
        f"{where}: `{command}` is not run by any test; run it in a test and list it in OTHERS")


def overrides_of(command: str) -> list[str]:
    """The overrides of a `rodeco` command line: flags dropped, a sweep replaced by its first value."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    args = shlex.split(command, comments=True)[1:]
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
    if cfg.task not in ("decode", "merge"):
        plugins.experiments.get(cfg.task)
    if cfg.data.path is not None:
        assert cfg.data.prompts is None  # a path replaces the prompts a data option set
        if "shared/data" not in cfg.data.path:
            return  # the user's own file (prompts.jsonl): nothing to read here
        if not SHARED_DATA.is_dir():
            return  # ../shared/data is not beside this checkout
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
        text = Path(data.path).read_text(encoding="utf-8")
        records = (json.loads(text) if text.lstrip().startswith("[")
                   else [json.loads(line) for line in text.splitlines() if line.strip()])
        source = [r if isinstance(r, str) else r[data.field] for r in records]
    positions = list(data.indices) if data.indices is not None else list(range(len(source)))
    positions = positions[data.offset:][: data.limit]  # limit null: all
    batches = [positions[i: i + data.batch_prompts] for i in range(0, len(positions), data.batch_prompts)]
    return [(i, source[i]) for batch in batches[data.shard:: data.num_shards] for i in batch]


@pytest.mark.parametrize("where, command", RODECO)
def test_every_documented_rodeco_command_composes_and_passes_the_checks(where, command, request):
    plugins = None
    if "example_" in command:  # the example package's commands: install it as the docs say
        request.getfixturevalue("installed_example")
        importlib.invalidate_caches()
        plugins = get_plugin_manager()
    check_command(command, plugins or rodeco.plugins.default_plugins())


def test_help_shows_rodecos_own_text_and_its_examples_work():
    p = subprocess.run([str(Path(sys.executable).with_name("rodeco")), "--help"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert "powered by Hydra" not in p.stdout and p.stdout.startswith("rodeco: reward-oriented decoding")
    for group, option in [("generator", "smollm2"), ("reward", "minilm_rm"), ("policy", "fixed"),
                          ("budget", "cpu"), ("data", "demo"), ("experiment", "efficiency")]:
        assert re.search(rf"^\s+{group}={option}\s+\S", p.stdout, re.M), f"{group}={option} not listed"
    examples = re.findall(r"^  (rodeco\b.*?)(?:\s{3,}.*)?$", p.stdout.split("Examples:")[1], re.M)
    assert len(examples) >= 3
    for command in examples:
        check_command(command, rodeco.plugins.default_plugins())


def test_python_m_rodeco_results_as_documented(tmp_path):
    rec = {"prompt_index": 0, "prompt": "Write a haiku.", "best": {"text": "Leaves fall."}}
    (tmp_path / "results.jsonl").write_text(json.dumps(rec) + "\n")
    out = tmp_path / "model_outputs.json"
    p = subprocess.run([sys.executable, "-m", "rodeco.results", str(tmp_path / "results.jsonl"), str(out),
                        "rodeco-smollm2-sr"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(out.read_text()) == [{"instruction": "Write a haiku.", "output": "Leaves fall.",
                                            "generator": "rodeco-smollm2-sr"}]
