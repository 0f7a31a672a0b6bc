"""Plugins (rodeco's own and the example package alike) import only names that ``rodeco`` exports; a plugin's
experiments (its ``experiments/`` folder) may also use rodeco's measurement code, ``rodeco.experiments`` (the one
bootstrap, the server launchers)."""

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
    experiment = "experiments" in path.relative_to(REPO).parts
    for line, module, names in rodeco_imports(path):
        where = f"{path.relative_to(REPO)}:{line}"
        if experiment and module.startswith("rodeco.experiments"):
            continue
        assert module == "rodeco", f"{where} imports {module}; import from rodeco's public names instead"
        private = [n for n in names if n not in rodeco.__all__]
        assert not private, f"{where} imports {private}, which rodeco does not export"


# What each public name is, as docs/plugins.md and rodeco's docstring describe it: a function with the documented
# leading parameters, a dataclass with the documented fields, a Protocol with its method, an exception, a class.
FUNCTIONS = {
    "decode": ["prompts", "n", "reward", "policy", "generator", "overrides"],
    "load_config": ["overrides", "plugins"],
    "run": ["cfg", "plugins", "out_dir"],
    "get_plugin_manager": ["load_entrypoints", "extra"],
    "keep_top": ["pv", "n_reject"],
    "keep_best": ["pv", "n_reject"],
    "best_first": ["pv", "rows"],
    "token_confidence": ["top", "k"],
    "group_confidences": ["c", "window"],
    "lowest_group_confidence": ["top", "k", "window"],
    "take_params": ["node", "params", "defaults"],
    "check_number": ["key", "value"],
    "check_positive_int": ["key", "value"],
    "node_dict": ["node", "resolve"],
    "best_probability": [],
    "rejectable": [],
    "standardize": [],
    "atomic_write": ["path", "data"],
    "required": ["help"],
    "load_model_and_tokenizer": ["model"],
    "resolve_dtype": ["dtype"],
    "resolve_device": ["device", "key"],
    "cache_dir": [],
    "open_pool": ["path"],
    "pool_served": ["plugins", "pool", "node"],
    "check_training_prompts": [],
    "prompts_of": ["data"],
    "data_root": ["root", "key"],
    "find_data_file": ["path", "key", "root"],
}
DATACLASSES = {
    "ScoreRequest": {
        "prompt",
        "response",
        "response_ids",
        "partial",
        "prompt_index",
        "candidate_id",
        "logprobs",
        "hidden_state",
        "stream",
    },
    "PromptView": {
        "scores",
        "history",
        "candidate_ids",
        "finished_scores",
        "tokens_generated",
        "min_reject",
        "parents",
        "origins",
        "finished_ids",
        "max_rows",
        "rng",
        "top_logprobs",
    },
    "RoundView": {"round", "prompts", "max_rows_next", "max_new_tokens", "n_start"},
    "PromptRef": {"index", "text", "stream", "seed", "messages", "meta"},
    "SamplingParams": {"temperature", "top_k", "top_p"},
    "WinnerRule": {"rule", "extractor", "pattern", "temperature", "weight", "stop", "stop_threshold", "stop_tokens"},
    "StartView": {"kv_tokens", "base", "max_rows", "max_new_tokens", "min_tokens_per_round"},
    "PolicyInfo": {"decision_tokens", "chooses_start", "rejects", "top_logprobs", "winner"},
    "EngineInfo": {"name", "compiled", "gathers_prompt", "linear", "draws_on_device"},
    "BuildContext": {"generator", "device", "plugins"},
    "PromptResult": {"best", "rounds", "compute"},
    "Candidate": {"candidate_id", "token_ids", "text", "score", "parent", "forked_round", "confidence"},
    "RewardCost": set(),
    "Compute": set(),
    "Round": set(),
    "RunOutput": set(),
    "Calibration": set(),
}
PROTOCOLS = {"Policy": "select", "Reward": "score", "TaskSource": "generate"}
EXCEPTIONS = {"ConfigError", "PluginError"}
CLASSES = {"Plugins", "Scorer", "ResultsWriter", "PoolReward", "Counts", "Decoder"}


def test_every_public_name_is_what_the_docs_say():
    import dataclasses
    import inspect

    import pluggy

    kinds = [set(FUNCTIONS), set(DATACLASSES), set(PROTOCOLS), EXCEPTIONS, CLASSES, {"hookimpl"}]
    assert sorted(n for k in kinds for n in k) == sorted(rodeco.__all__), "a public name without its kind here"
    for name, params in FUNCTIONS.items():
        f = getattr(rodeco, name)
        assert inspect.isfunction(f), name
        assert list(inspect.signature(f).parameters)[: len(params)] == params, (name, inspect.signature(f))
    for name, fields in DATACLASSES.items():
        cls = getattr(rodeco, name)
        assert dataclasses.is_dataclass(cls) and isinstance(cls, type), name
        assert fields <= {f.name for f in dataclasses.fields(cls)}, (name, fields)
    assert isinstance(rodeco.RoundView.min_reject_total, property)
    for name, method in PROTOCOLS.items():
        proto = getattr(rodeco, name)
        assert getattr(proto, "_is_protocol", False) and callable(getattr(proto, method)), name
    for name in EXCEPTIONS:
        assert issubclass(getattr(rodeco, name), Exception), name
    assert all(inspect.isclass(getattr(rodeco, n)) for n in CLASSES)
    assert isinstance(rodeco.hookimpl, pluggy.HookimplMarker) and rodeco.hookimpl.project_name == "rodeco"


def test_public_names_import_as_documented():
    """``from rodeco import X`` for every name; a lazy one (torch, pools) is its module's object; the message of a
    ``ConfigError`` reads as docs/plugins.md shows it; an unknown name is an AttributeError."""
    import importlib

    ns: dict = {}
    exec("from rodeco import " + ", ".join(rodeco.__all__), ns)  # noqa: S102 - a fixed import line
    assert all(ns[n] is getattr(rodeco, n) for n in rodeco.__all__)
    for name, module in rodeco._LAZY.items():
        assert getattr(rodeco, name) is getattr(importlib.import_module(module), name), name
    e = rodeco.ConfigError("policy.keep", 0, "must be a positive integer", "set e.g. policy.keep=2")
    assert str(e) == "policy.keep=0: must be a positive integer. Fix: set e.g. policy.keep=2"
    with pytest.raises(AttributeError, match="no attribute 'keep_all'"):
        rodeco.keep_all  # noqa: B018


def test_importing_rodeco_does_not_import_torch():
    p = subprocess.run(
        [sys.executable, "-c", "import sys, rodeco; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0 and p.stdout.strip() == "False", p.stdout + p.stderr
