"""Bad input: each error names the config key, the value and the fix."""

from __future__ import annotations

import pytest
from helpers import run_tiny

from rodeco.common.validation import ConfigError
from rodeco.core.data import load_prompts
from rodeco.core.loading import load_model_and_tokenizer


def _raises(key: str, fn, *args, **kw) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        fn(*args, **kw)
    assert e.value.key == key, e.value
    assert "Fix:" in str(e.value) and key in str(e.value)
    return e.value


@pytest.mark.parametrize("alpha", [1.0, 1.5, -0.1, "nan"])
def test_alpha_outside_unit_interval(tiny_gen, alpha):
    _raises("policy.alpha", run_tiny, tiny_gen(), ["hi"], overrides=[f"policy.alpha={alpha}"])


@pytest.mark.parametrize("n", [0, -3])
def test_n_below_one(tiny_gen, n):
    _raises("n", run_tiny, tiny_gen(), ["hi"], n=n)


def test_budget_too_small_for_one_row(tiny_gen):
    err = _raises(
        "budget.kv_tokens",
        run_tiny,
        tiny_gen(),
        ["write a haiku"],
        overrides=["budget.kv_tokens=20", "sampling.max_new_tokens=16"],
    )
    assert "at least" in err.fix


def test_n_too_large_for_budget_names_a_fitting_n(tiny_gen):
    err = _raises(
        "n",
        run_tiny,
        tiny_gen(),
        ["write a haiku"],
        n=64,
        overrides=["budget.kv_tokens=200", "sampling.max_new_tokens=16"],
    )
    assert "n<=" in err.fix


def test_empty_prompt(tiny_gen):
    err = _raises("data.prompts", run_tiny, tiny_gen(), ["fine", "   "])
    assert "prompt 1" in err.problem


def test_prompt_longer_than_context(tiny_gen):
    long = "the quick brown fox " * 200  # the tiny model's context is 256 tokens
    err = _raises("data.prompts", run_tiny, tiny_gen(), ["short", long])
    assert "context" in err.problem and "prompt 1" in str(err.value)


@pytest.mark.parametrize("key", ["policy", "reward"])
def test_unknown_plugin_name_lists_known(tiny_gen, key):
    err = _raises(f"{key}.name", run_tiny, tiny_gen(), ["hi"], overrides=[f"{key}.name=nope"])
    assert ("fixed" if key == "policy" else "logprob") in err.problem


def test_unknown_plugin_parameter(tiny_gen):
    _raises("policy.alhpa", run_tiny, tiny_gen(), ["hi"], overrides=["+policy.alhpa=0.3"])


def test_missing_model_dir_and_gguf(tmp_path):
    _raises("generator.model", load_model_and_tokenizer, str(tmp_path / "nope"))
    _raises("generator.model", load_model_and_tokenizer, str(tmp_path / "model.gguf"))
    (tmp_path / "config.json").write_text("{}")
    _raises("generator.gguf_file", load_model_and_tokenizer, str(tmp_path), "missing.gguf")


def test_malformed_data_line_names_its_number(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a"}\n{"prompt": "b"\n{"prompt": "c"}\n')
    err = _raises("data.path", load_prompts, str(f))
    assert "line 2" in err.problem


def test_data_record_without_the_field(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a"}\n{"instruction": "b"}\n')
    err = _raises("data.field", load_prompts, str(f))
    assert "line 2" in err.problem and "instruction" in err.problem


def test_missing_data_file(tmp_path):
    _raises("data.path", load_prompts, str(tmp_path / "none.jsonl"))


@pytest.mark.parametrize(
    "override,key",
    [
        ("sampling.top_p=0", "sampling.top_p"),
        ("sampling.temperature=-1", "sampling.temperature"),
        ("sampling.max_new_tokens=0", "sampling.max_new_tokens"),
        ("generator.engine=turbo", "generator.engine"),
    ],
)
def test_bad_sampling_and_engine_values(tiny_gen, override, key):
    gen = tiny_gen(engine=override.split("=")[1]) if key == "generator.engine" else tiny_gen()
    _raises(key, run_tiny, gen, ["hi"], overrides=[override])
