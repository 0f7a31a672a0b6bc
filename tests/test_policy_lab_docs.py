"""docs/policy-lab.md's example runs as written: its policy (a plugin in ``lab.py``) replayed by the efficiency
experiment on a pool of the tiny random Llama, next to fixed and adaptive."""

from __future__ import annotations

import json
import re

from conftest import REPO
from omegaconf import open_dict

import rodeco
from rodeco.experiments import efficiency


def lab_module() -> dict:
    text = (REPO / "docs" / "policy-lab.md").read_text(encoding="utf-8")
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    ns: dict = {"__name__": "lab"}  # not __main__: the run at the bottom is replaced by a tiny one below
    exec(compile(code, "docs/policy-lab.md", "exec"), ns)  # noqa: S102 - our own documentation
    return ns


def test_the_lab_policy_is_replayed_against_fixed_and_adaptive(tmp_path):
    from test_hooks import tiny_generator

    lab = lab_module()
    plugins = rodeco.get_plugin_manager(extra=[lab["Lab"]()])
    prompts = ",".join(f"w{i} w{i + 1}" for i in range(0, 20, 2))
    cfg = rodeco.load_config(
        [
            "experiment=efficiency",
            f"pool={tmp_path / 'pool'}",
            "experiment_args.policies=[margin]",
            "experiment_args.live_check=0",
            "reward=logprob",
            "sampling.max_new_tokens=12",
            "budget.min_tokens_per_round=2",
            f"data.prompts=[{prompts}]",
            "experiment_args.candidates=16",
            "experiment_args.n=2",
            "experiment_args.starts=[]",
            "experiment_args.bootstrap=100",
            "experiment_args.bon_groups=2",
            "judge=none",
        ],
        plugins,
    )  # the docs' AlpacaFarm pool is judged; these prompts cannot be
    with open_dict(cfg):
        cfg.output.progress = False
    efficiency.run(cfg, plugins, tmp_path / "run", gen=tiny_generator())
    res = json.loads((tmp_path / "run" / "efficiency.json").read_text())
    for key in ("margin@1", "fixed_alpha_0.5@1", "adaptive_delta_0.05@1"):
        assert "speedup_flops_ci" in res["methods"][key]["report"], key
    rounds = [p["methods"]["margin"]["1"]["rounds"] for p in res["per_prompt"]]
    assert sum(rounds) > 0  # the policy decided at decision points
    md = (tmp_path / "run" / "efficiency.md").read_text()
    assert md.count("SR margin (budget") == 2 and md.count("SR margin_oracle (budget") == 2  # and its ceiling
    assert res["args"]["calibrated_skipped"]  # no calibration of (tiny, logprob): left out, said why


def test_the_lab_policy_keeps_rows_near_the_best():
    import numpy as np

    from rodeco import PromptView, RoundView

    lab = lab_module()
    pv = PromptView(
        prompt_index=0,
        candidate_ids=[0, 1, 2, 3],
        scores=np.array([1.0, 0.9, -3.0, 0.95]),
        history=np.zeros((4, 0)),
        finished_scores=[],
        tokens_generated=8,
        min_reject=0,
    )
    view = RoundView(round=0, prompts=[pv], max_rows_next=4, max_new_tokens=32)
    assert lab["MarginPolicy"](0.5).select(view) == [[0, 1, 3]]  # 2 is far below the best
    pv.min_reject = 2
    assert lab["MarginPolicy"](0.5).select(view) == [[0, 3]]  # the budget forces one more out
