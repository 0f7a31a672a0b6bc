"""A newcomer's first commands: a prompt file on the command line, a misspelled key, a misspelled option."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import rodeco
from rodeco.common.validation import ConfigError

pytestmark = pytest.mark.slow  # fresh installs and subprocesses

RODECO = Path(sys.executable).with_name("rodeco")


def cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([str(RODECO), *args], capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


def test_a_prompt_file_on_the_command_line_replaces_the_demo_prompts(tiny_model_dir: Path, tmp_path: Path):
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["w1 w2", "w3"]))
    p = cli(
        [
            "data.path=prompts.jsonl",
            f"generator.model={tiny_model_dir}",
            "reward=logprob",
            "n=2",
            "sampling.max_new_tokens=4",
            "budget=unlimited",
            "hydra.run.dir=out",
        ],
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr
    recs = [json.loads(x) for x in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in recs] == ["w1 w2", "w3"]


def test_the_key_typed_wins_over_what_a_data_option_set():
    cfg = rodeco.load_config(["data.path=prompts.jsonl"])  # data: demo sets prompts
    assert (cfg.data.path, cfg.data.prompts) == ("prompts.jsonl", None)
    cfg = rodeco.load_config(["data=specrej100", "data.prompts=[Hello]"])  # data: specrej100 sets a path
    assert (cfg.data.path, list(cfg.data.prompts)) == (None, ["Hello"])
    cfg = rodeco.load_config(["data=specrej100"])  # nothing typed: the option's own values stay
    assert cfg.data.path.endswith("specrej_alpaca_farm_100.json") and cfg.data.prompts is None
    cfg = rodeco.load_config(["data.path=a.jsonl", "data.prompts=[Hello]"])  # both typed: both kept, the loader
    assert cfg.data.path == "a.jsonl" and list(cfg.data.prompts) == ["Hello"]  # then asks for exactly one


def test_a_misspelled_key_names_the_valid_keys_and_the_likely_one():
    with pytest.raises(ConfigError) as e:
        rodeco.load_config(["policy.alfa=0.3"])
    err = e.value
    assert err.key == "policy.alfa" and err.value == 0.3
    assert "the keys of policy are: alpha, name" in err.problem
    assert err.fix.startswith("did you mean alpha?") and "policy.alpha=0.3" in err.fix


@pytest.mark.parametrize(
    "override, key, hint",
    [
        ("sampling.temprature=0.7", "sampling.temprature", "did you mean temperature?"),
        ("nn=8", "nn", "did you mean n?"),
        ("experiment=efficiency experiment_args.alpha=[0.5]", "experiment_args.alpha", "did you mean alphas?"),
    ],
)
def test_misspelled_keys_in_typed_nodes_too(override, key, hint):
    with pytest.raises(ConfigError) as e:
        rodeco.load_config(override.split())
    assert e.value.key == key and e.value.fix.startswith(hint)


def test_a_value_of_the_wrong_type_names_its_key():
    with pytest.raises(ConfigError) as e:
        rodeco.load_config(["experiment=efficiency", "experiment_args.n=many"])
    assert e.value.key == "experiment_args.n" and e.value.value == "many"
    with pytest.raises(ConfigError) as e:  # a dict where a list belongs (serve.policies is a list of entries)
        rodeco.load_config(["serve.policies={fixed: {}}"])
    assert e.value.key == "serve.policies" and e.value.value == {"fixed": {}}


@pytest.mark.parametrize(
    "overrides, key, hint",
    [
        (["+policy.alfa=0.3"], "policy.alfa", "did you mean alpha? Use policy.alpha=0.3"),
        (["policy=adaptive", "+policy.dleta=0.1"], "policy.dleta", "did you mean delta? Use policy.delta=0.1"),
        (["+reward.batch_tokns=512"], "reward.batch_tokns", "did you mean batch_tokens? Use reward.batch_tokens=512"),
        (["partial_reward=logprob", "+partial_reward.fom=sum"], "partial_reward.fom", "did you mean form?"),
    ],
)
def test_a_misspelled_plugin_parameter_fails_when_the_config_is_composed(overrides, key, hint):
    """``+`` adds a key to an open plugin node: the plugin's registered params dataclass still catches the typo."""
    with pytest.raises(ConfigError) as e:
        rodeco.load_config(overrides)
    assert e.value.key == key and e.value.fix.startswith(hint)
    name = key.split(".")[0]
    assert f"the keys of {name} (" in e.value.problem and "name" in e.value.problem


@pytest.mark.parametrize(
    "overrides, key, problem",
    [
        (["policy.alpha=abc"], "policy.alpha", "must be a number, not a string"),
        (["policy.alpha=false"], "policy.alpha", "must be a number, not a boolean"),
        (
            ["policy=correlation", "policy.min_candidates=2.5"],
            "policy.min_candidates",
            "must be an integer, not a float",
        ),
        (["policy=adaptive", "policy.horizon=rounds"], "policy.horizon", "must be remaining or round"),
        (["reward=logprob", "reward.form=median"], "reward.form", "must be mean, perplexity or sum"),
        (["reward.batch_tokens=big"], "reward.batch_tokens", "must be an integer, not a string"),
        (
            ["reward=preference_rm", "reward.model=m", "reward.chat_template=sometimes"],
            "reward.chat_template",
            "must be true, false or auto",
        ),
    ],
)
def test_a_plugin_parameter_of_the_wrong_type_fails_when_the_config_is_composed(overrides, key, problem):
    with pytest.raises(ConfigError) as e:
        rodeco.load_config(overrides)
    assert e.value.key == key and e.value.problem == problem and "Fix:" in str(e.value)


def test_open_parameters_and_missing_values_are_left_to_the_plugin():
    cfg = rodeco.load_config(["reward=custom", "+reward.scale=50"])  # custom: the function's own parameters
    assert cfg.reward.scale == 50
    cfg = rodeco.load_config(["reward=preference_rm"])  # reward.model: ??? (required), reported when it is built
    assert OmegaConf.is_missing(cfg.reward, "model")


def test_run_checks_plugin_parameters_before_loading_a_model(monkeypatch):
    """A config changed after composing (as an experiment or a script may) is checked again by ``run``."""
    from omegaconf import open_dict

    def no_model(*a, **kw):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("rodeco.core.loading.load_generator", no_model)
    cfg = rodeco.load_config(["output.progress=false"])
    with open_dict(cfg):
        cfg.policy.alpah = 0.7
    with pytest.raises(ConfigError) as e:
        rodeco.run(cfg)
    assert e.value.key == "policy.alpah" and "did you mean alpha?" in e.value.fix


def test_a_misspelled_option_suggests_the_option():
    with pytest.raises(ConfigError) as e:
        rodeco.load_config(["policy=fixd"])
    assert e.value.key == "policy" and "fixed" in e.value.problem and e.value.fix == "did you mean policy=fixed?"


def test_the_cli_says_it_in_rodecos_words(tmp_path: Path):
    p = cli(["policy.alfa=0.3"], cwd=tmp_path)
    assert p.returncode == 2
    assert p.stderr.strip() == (
        "rodeco: error: policy.alfa=0.3: unknown key; the keys of policy are: alpha, name. "
        "Fix: did you mean alpha? Use policy.alpha=0.3"
    )
    p = cli(["+policy.alfa=0.3"], cwd=tmp_path)  # added to the node: the policy's params dataclass catches it
    assert p.returncode == 2
    assert p.stderr.strip() == (
        "rodeco: error: policy.alfa=0.3: unknown key; the keys of policy (fixed) are: alpha, "
        "name. Fix: did you mean alpha? Use policy.alpha=0.3"
    )
    p = cli(["policy=fixd"], cwd=tmp_path)
    assert p.returncode == 2 and "did you mean policy=fixed?" in p.stderr and "Traceback" not in p.stderr
    p = cli(["n=3", "'bad"], cwd=tmp_path)  # an override Hydra cannot parse: Hydra's own message, exit 1
    assert p.returncode == 1 and p.stderr.startswith("rodeco: error: ") and "Traceback" not in p.stderr


def test_a_prompt_file_replaces_the_experiments_prompt_set():
    cfg = rodeco.load_config(["experiment=efficiency", "data.path=mine.jsonl"])  # the experiment sets AlpacaFarm
    assert (cfg.data.path, cfg.data.prompts, cfg.data.indices) == ("mine.jsonl", None, None)
    assert cfg.data.limit == 100  # the experiment's size stays unless given
    cfg = rodeco.load_config(["experiment=efficiency"])
    assert cfg.data.path.endswith("alpaca_eval_805.jsonl") and len(cfg.data.indices) == 100


def test_sigterm_stops_at_a_decision_point_keeps_results_and_the_rerun_completes(tiny_model_dir: Path, tmp_path: Path):
    """A scheduler's SIGTERM: the run stops at the next decision point or batch boundary, exits non-zero with the
    command that resumes it, results.jsonl parses, and that command decodes only the missing prompts."""
    import signal
    import time

    prompts = [f"w{i} w{i + 1} w{i + 2}" for i in range(30)]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    args = [
        "data.path=prompts.jsonl",
        f"generator.model={tiny_model_dir}",
        "reward=logprob",
        "n=4",
        "sampling.max_new_tokens=24",
        "budget.kv_tokens=200",
        "data.batch_prompts=1",
        "output.progress=false",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(
        [str(RODECO), *args, "hydra.run.dir=out"],
        cwd=tmp_path,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    results = tmp_path / "out" / "results.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and not (results.is_file() and results.read_text().strip()):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "stopped by SIGTERM" in err and "Resume with: rodeco " in err
    first = [json.loads(x) for x in results.read_text().splitlines()]
    assert 1 <= len(first) < len(prompts)
    resume = err.split("Resume with: rodeco ", 1)[1].strip().splitlines()[0]
    p = cli(shlex.split(resume), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert f"resuming: {len(first)} of {len(prompts)} prompts already" in p.stderr + p.stdout
    done = [json.loads(x) for x in results.read_text().splitlines()]
    assert sorted(r["prompt_index"] for r in done) == list(range(len(prompts)))
    assert done[: len(first)] == first  # what was written before the signal is untouched
