"""Data by name: named data options read their files under the data root (``data.root``, else ``RODECO_DATA``,
else ``../shared/data``); a missing root is a ``ConfigError`` that names the key and the fix; ``data.hf`` loads a
hub dataset, or a local folder of JSON/JSONL files, through ``datasets``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import rodeco
from rodeco import ConfigError
from rodeco.tasks import prompts_of

TEXTS = [f"Prompt number {i}?" for i in range(6)]


def make_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "prompts").mkdir(parents=True)
    with open(root / "prompts" / "alpaca_eval_805.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"prompt": t}) + "\n" for t in TEXTS)
    return root


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """A working directory without the file, and no data root by default (no RODECO_DATA, no ../shared/data)."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("RODECO_DATA", raising=False)
    monkeypatch.setattr("rodeco.core.data.SHARED", Path("no-such-folder-for-rodeco-tests"))
    return work


def test_a_named_option_reads_its_file_under_data_root(tmp_path, elsewhere):
    root = make_root(tmp_path)
    cfg = rodeco.load_config(["data=alpaca_eval", f"data.root={root}", "data.limit=4"])
    assert cfg.data.path == "prompts/alpaca_eval_805.jsonl"  # no folder hard-wired in the option
    assert [p.text for p in prompts_of(cfg.data)] == TEXTS[:4]


def test_the_environment_names_the_root(tmp_path, elsewhere, monkeypatch):
    monkeypatch.setenv("RODECO_DATA", str(make_root(tmp_path)))
    assert [p.text for p in prompts_of(rodeco.load_config(["data=alpaca_eval"]).data)] == TEXTS


def test_a_missing_root_names_the_key_and_the_fix(elsewhere):
    with pytest.raises(ConfigError) as e:
        prompts_of(rodeco.load_config(["data=alpaca_eval"]).data)
    assert e.value.key == "data.root" and "RODECO_DATA" in e.value.fix and "data.path" in e.value.fix
    with pytest.raises(ConfigError) as e:
        prompts_of(rodeco.load_config(["data=alpaca_eval", "data.root=/no/such/folder"]).data)
    assert e.value.key == "data.root" and e.value.value == "/no/such/folder"


def test_a_file_in_the_working_directory_comes_first(tmp_path, elsewhere):
    root = make_root(tmp_path)
    (elsewhere / "prompts").mkdir()
    (elsewhere / "prompts" / "alpaca_eval_805.jsonl").write_text(json.dumps({"prompt": "Local?"}) + "\n")
    assert [p.text for p in prompts_of(rodeco.load_config(["data=alpaca_eval", f"data.root={root}"]).data)] == [
        "Local?"
    ]


def test_data_hf_loads_a_local_folder_as_datasets_does(tmp_path, elsewhere):
    pytest.importorskip("datasets")  # rodeco[data]; make and CI install it
    folder = tmp_path / "mydata"
    folder.mkdir()
    with open(folder / "train.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"instruction": t, "id": i}) + "\n" for i, t in enumerate(TEXTS))
    cfg = rodeco.load_config([f"data.hf={folder}", "data.field=instruction"])  # replaces the demo's inline prompts
    assert cfg.data.prompts is None
    got = prompts_of(cfg.data)
    assert [(p.index, p.text) for p in got] == list(enumerate(TEXTS))
    with pytest.raises(ConfigError) as e:
        prompts_of(rodeco.load_config([f"data.hf={folder}", "data.field=prompt"]).data)
    assert e.value.key == "data.field" and "instruction" in e.value.problem
    with pytest.raises(ConfigError) as e:
        prompts_of(rodeco.load_config([f"data.hf={folder}", "data.field=instruction", "data.split=test"]).data)
    assert e.value.key == "data.split"
