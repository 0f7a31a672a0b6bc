"""``rodeco experiment=efficiency`` and ``experiment=perplexity`` end to end on the tiny random Llama."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import SHARED_DATA
from omegaconf import OmegaConf, open_dict

import rodeco
from rodeco.experiments import efficiency
from rodeco.experiments.metrics import compute_to_match, expected_best_of, improvement_score
from rodeco.plugins import default_plugins
from rodeco.validation import ConfigError

PROMPTS = ["write a haiku about autumn leaves", "give three tips for staying healthy"]


def tiny_cfg(experiment: str = "efficiency", **args):
    cfg = rodeco.load_config([f"experiment={experiment}", "reward=logprob", "budget.min_tokens_per_round=2"])
    with open_dict(cfg):
        cfg.sampling.max_new_tokens = 12
        cfg.output.progress = False
        a = cfg.experiment_args
        a.prompts, a.k, a.n, a.pool_factor, a.n_start = PROMPTS, 2, 2, 8, 6
        a.alphas, a.policies, a.scales = [0.5], ["adaptive"], [1, 2]
        for k, v in args.items():
            a[k] = v
    return cfg


def test_efficiency_end_to_end(tiny_gen, tmp_path: Path, capsys):
    gen = tiny_gen()
    efficiency.run(tiny_cfg(), default_plugins(), tmp_path, gen=gen)
    res = json.loads((tmp_path / "efficiency.json").read_text())
    assert (tmp_path / "efficiency.png").stat().st_size > 1000
    md = (tmp_path / "efficiency.md").read_text()
    assert md.startswith("| method |") and "| Best-of-16 |" in md and "SR adaptive (budget x2)" in md
    prompts, curve = res["per_prompt"], res["curve"]
    assert [p["prompt_index"] for p in prompts] == [0, 1]
    assert curve["N"] == [1, 2, 4, 8, 16]
    assert curve["improvement"][curve["N"].index(2)] == pytest.approx(100.0)  # Best-of-n is the reference
    hi = [expected_best_of(p["pool"]["scores"], 2) for p in prompts]
    lo = [-expected_best_of([-x for x in p["pool"]["scores"]], 2) for p in prompts]
    checked = 0
    for p in prompts:
        L0 = len(gen.encode(PROMPTS[p["prompt_index"]]))
        assert len(p["pool"]["scores"]) == 16
        assert p["budget"] == {"1": L0 + 2 * 12, "2": L0 + 4 * 12}  # what Best-of-n (2n) fills, prompt stored once
        assert p["bon_n"]["peak_kv_tokens"] == p["budget"]["1"]  # Best-of-n fills it exactly
        for label in ("fixed_alpha_0.5", "adaptive"):
            for scale in ("1", "2"):
                r = p["methods"][label][scale]
                assert r["peak_kv_tokens"] <= p["budget"][scale]
                # Speculative Rejection's candidates are the pool's samples (same seed), scored alike
                assert r["best"] == pytest.approx(p["pool"]["scores"][r["best_id"]], abs=1e-4)
                checked += 1
    assert checked > 0
    sr = res["methods"]["fixed_alpha_0.5@1"]
    best = [p["methods"]["fixed_alpha_0.5"]["1"]["best"] for p in prompts]
    assert sr["improvement"] == pytest.approx(improvement_score(best, hi, lo))
    flops = sum(p["methods"]["fixed_alpha_0.5"]["1"]["gen_flops"] + p["methods"]["fixed_alpha_0.5"]["1"]["reward_flops"]
                for p in prompts)
    assert sr["flops"] == pytest.approx(flops)
    match = compute_to_match(sr["improvement"], curve["flops"], curve["improvement"])
    assert sr["speedup_flops"] == pytest.approx((match or curve["flops"][-1]) / flops)
    assert sr["beyond_curve"] == (match is None)
    for scale in (1, 2):  # the paper's metric, by hand: Best-of-(scale n) fills the same memory
        m = res["methods"][f"fixed_alpha_0.5@{scale}"]
        n_match = compute_to_match(m["improvement"], curve["N"], curve["improvement"]) or curve["N"][-1]
        runs = [(p["methods"]["fixed_alpha_0.5"][str(scale)], p["bon_n"]) for p in prompts]
        dev = sum(r["steps"] * b["decode_s"] / b["steps"] + r["score_s"] for r, b in runs)
        ref = sum(b["decode_s"] + scale * b["score_s"] for _, b in runs)
        assert m["relative_compute"] == pytest.approx(n_match / (2 * scale) * ref / dev)
    pool_flops = [p["pool"]["gen_flops"] + p["pool"]["reward_flops"] for p in prompts]
    assert curve["flops"][0] == pytest.approx(sum(f / 16 for f in pool_flops))  # Best-of-1 costs 1/M of the pool
    lines = capsys.readouterr().out.strip().splitlines()
    keys = [x.split(":")[0] for x in lines[-4:]]
    assert keys == ["speedup_fixed_alpha_0.5", "speedup_best_policy", "best_policy", "relative_compute_fixed_alpha_0.5"]
    assert lines[-2].split(": ")[1] in ("fixed_alpha_0.5", "adaptive")
    assert float(lines[-4].split(": ")[1]) == pytest.approx(sr["speedup_flops"], rel=1e-3)


def test_efficiency_n_from_the_budget(tiny_gen):
    cfg = tiny_cfg(n="budget", scales=[1], alphas=[0.5], policies=[], pool_factor=4, n_start="auto")
    gen = tiny_gen()
    prompts = ["hi", "give three tips for staying healthy, and say in one short sentence why each of them works"]
    L0 = max(len(gen.encode(p)) for p in prompts)
    with open_dict(cfg):
        cfg.experiment_args.prompts = prompts
        cfg.budget.kv_tokens = L0 + 3 * 12  # Best-of-3 at full length on the longer prompt, more on the shorter
    assert efficiency.choose_n(cfg, gen, efficiency.parse_args(cfg), [efficiency.Prompt(0, prompts[0])]) > 3
    out = efficiency.run(cfg, default_plugins(), None, gen=gen)
    assert out.extra["n"] == 3  # the n that fits every prompt
    assert [len(p["pool"]["scores"]) for p in out.extra["per_prompt"]] == [12, 12]


@pytest.mark.parametrize("key,value", [("k", 0), ("n", "many"), ("pool_factor", 0), ("alphas", [1.0]),
                                       ("scales", [2]), ("n_start", -1)])
def test_efficiency_bad_arguments_name_the_key(key, value):
    with pytest.raises(ConfigError, match=f"experiment_args.{key}"):
        efficiency.run(tiny_cfg(**{key: value}), default_plugins(), None, gen=object())


def test_efficiency_reads_the_papers_subset_with_full_alpacaeval_text():
    a = {**OmegaConf.to_container(rodeco.load_config(["experiment=efficiency"]).experiment_args), "k": 30}
    a["prompts_file"] = str(SHARED_DATA / "prompts/specrej_alpaca_farm_100.json")
    a["text_file"] = str(SHARED_DATA / "prompts/alpaca_eval_805.jsonl")
    if not Path(a["prompts_file"]).is_file():
        pytest.skip("../shared/data is not beside the repository")
    subset = json.loads(Path(a["prompts_file"]).read_text())[:30]
    full = {json.loads(x)["idx"]: json.loads(x)["prompt"] for x in Path(a["text_file"]).read_text().splitlines()}
    got = efficiency.load_subset(a)
    assert [p.index for p in got] == [r["af_eval_idx"] for r in subset]
    assert [p.text for p in got] == [full[r["af_eval_idx"]] for r in subset]
    assert any(p.text != r["prompt"] for p, r in zip(got, subset))  # the subset file drops AlpacaFarm's input


def test_perplexity_end_to_end(tiny_gen, tmp_path: Path, capsys):
    from rodeco.experiments import perplexity

    cfg = tiny_cfg("perplexity")
    perplexity.run(cfg, default_plugins(), tmp_path, gen=tiny_gen())
    res = json.loads((tmp_path / "perplexity.json").read_text())
    assert (tmp_path / "perplexity.png").stat().st_size > 1000
    md = (tmp_path / "perplexity.md").read_text()
    assert md.startswith("| method |") and "SR fixed_alpha_0.5 (budget x1)" in md
    prompts, curve = res["per_prompt"], res["curve"]
    for p in prompts:  # the perplexity form: every score is minus a perplexity
        assert all(x <= -1.0 for x in p["pool"]["scores"])
    for N, y in zip(curve["N"], curve["perplexity"]):  # Best-of-N keeps the lowest perplexity of N samples
        assert y == pytest.approx(sum(-expected_best_of(p["pool"]["scores"], N) for p in prompts) / len(prompts))
    assert curve["perplexity"] == sorted(curve["perplexity"], reverse=True)
    row = next(r for r in res["table"] if r["method"] == "SR fixed_alpha_0.5 (budget x1)")
    assert row["perplexity"] == pytest.approx(
        sum(-p["methods"]["fixed_alpha_0.5"]["1"]["best"] for p in prompts) / len(prompts))
    want = perplexity.at_compute(row["flops"], curve["flops"], curve["perplexity"])
    assert row["bon_perplexity_same_flops"] == (None if want is None else pytest.approx(want))
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-5].startswith("perplexity_best_of_n_same_flops_fixed_alpha_0.5: ")
    assert lines[-1].startswith("relative_compute_fixed_alpha_0.5: ")


def test_perplexity_refuses_another_reward():
    from rodeco.experiments import perplexity

    cfg = tiny_cfg("perplexity")
    assert cfg.reward.form == "perplexity"  # the experiment's default
    with open_dict(cfg):
        cfg.reward.form = "mean"
    with pytest.raises(ConfigError, match="reward.form=perplexity"):
        perplexity.run(cfg, default_plugins(), None, gen=object())


def test_at_compute_interpolates_in_log_flops():
    from rodeco.experiments.perplexity import at_compute

    assert at_compute(10.0, [1.0, 100.0], [4.0, 2.0]) == pytest.approx(3.0)  # halfway in log10
    assert at_compute(1000.0, [1.0, 100.0], [4.0, 2.0]) is None


def test_efficiency_n_from_free_cuda_memory(monkeypatch):
    """On CUDA with ``n: budget`` and ``budget=cuda``, Best-of-n's n is what free device memory holds at full
    length (the device query is faked: no GPU in CI)."""
    from types import SimpleNamespace

    import torch

    cfg = rodeco.load_config(["experiment=efficiency", "budget=cuda", "budget.reserve_gib=1",
                              "budget.memory_fraction=0.5", "experiment_args.n=budget", "sampling.max_new_tokens=100"])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (9 * 2**30, 80 * 2**30))
    kv = 23040  # SmolLM2 in bf16: 2 * 30 layers * 3 kv heads * 64 * 2 bytes
    B = int(8 * 2**30 * 0.5 // kv)
    for shares in (True, False):
        gen = SimpleNamespace(device=torch.device("cuda"), kv_bytes_per_token=kv, shares_prefix=shares,
                              encode=lambda text: [0] * 40)
        n = efficiency.choose_n(cfg, gen, efficiency.parse_args(cfg), [efficiency.Prompt(0, "hi")])
        assert n == ((B - 40) // 100 if shares else B // 140)


def test_reanalysis_from_the_json_matches_the_run(tiny_gen, tmp_path: Path, capsys):
    cfg = tiny_cfg(scales=[1], policies=[])
    out = efficiency.run(cfg, default_plugins(), tmp_path, gen=tiny_gen())
    first = capsys.readouterr().out
    (tmp_path / "efficiency.md").unlink()
    efficiency.main([str(tmp_path)])
    assert capsys.readouterr().out == first
    again = json.loads((tmp_path / "efficiency.json").read_text())
    assert again["methods"] == json.loads(json.dumps(out.extra["methods"]))
    assert (tmp_path / "efficiency.md").is_file()


def test_efficiency_writes_each_prompt_as_it_finishes_and_resumes(tiny_gen, tmp_path: Path, monkeypatch):
    cfg = tiny_cfg(scales=[1], policies=[])
    gen = tiny_gen()
    first = efficiency.run(cfg, default_plugins(), tmp_path, gen=gen)
    path = tmp_path / efficiency.PROMPTS_FILE
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    assert [r["prompt_index"] for r in recs] == [0, 1]
    path.write_text(json.dumps(recs[0]) + "\n")  # as if the run had died while measuring prompt 1
    measured = []
    real = efficiency.Runner.__call__
    monkeypatch.setattr(efficiency.Runner, "__call__",
                        lambda self, prompt, *rest: measured.append(prompt.index) or real(self, prompt, *rest))
    again = efficiency.run(cfg, default_plugins(), tmp_path, gen=gen)
    assert set(measured) == {1}  # prompt 0 was not decoded again
    assert again.extra["per_prompt"][0] == json.loads(json.dumps(first.extra["per_prompt"][0]))
    assert [json.loads(x)["prompt_index"] for x in path.read_text().splitlines()] == [0, 1]
    other = tiny_cfg(scales=[1], policies=[], alphas=[0.3])
    with pytest.raises(ConfigError, match="output.resume"):
        efficiency.run(other, default_plugins(), tmp_path, gen=gen)
