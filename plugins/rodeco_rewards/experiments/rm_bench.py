"""``rodeco experiment=rm_bench``: scoring throughput of the configured reward (default: the embedded
``minilm_rm``) at typical partial lengths, called through ``score`` as the loop calls it.

Responses are real AlpacaEval test answers cut to ``k`` generator tokens (SmolLM2's tokenizer), paired with the
demo prompts; each (length, batch) cell is warmed up once (so per-prompt caches are as they are after a run's
first decision point) and timed as the median of ``repeats`` calls.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from omegaconf import DictConfig

from rodeco import BuildContext, Compute, Plugins, ResultsWriter, RunOutput, ScoreRequest, node_dict

PROMPTS = [
    "Give three tips for staying healthy.",
    "Explain in two sentences why the sky is blue.",
    "Write a haiku about autumn.",
]


def run(cfg: DictConfig, plugins: Plugins, out_dir: str | Path | None) -> RunOutput:
    from rodeco import load_model_and_tokenizer
    from rodeco_rewards.prefs import data_dir, load_pairs

    args = node_dict(cfg.experiment_args)  # keys and types checked by RMBenchArgs
    _, gtok = load_model_and_tokenizer(cfg.generator.model, cfg.generator.gguf_file, dtype="float32", device="cpu")
    answers = [p.chosen for p in load_pairs("alpaca_test", data_dir(args["data_dir"]))]
    name = str(cfg.reward.name)
    reward = plugins.build_reward(cfg.reward, BuildContext(device="cpu", plugins=plugins))
    rows = []
    for k in args["lengths"]:
        for batch in args["batches"]:
            resp = [gtok.decode(gtok(answers[i * 7], add_special_tokens=False)["input_ids"][:k]) for i in range(batch)]
            reqs = [ScoreRequest(PROMPTS[i % 3], r, (), partial=True) for i, r in enumerate(resp)]
            reward.score(reqs)  # warm-up
            times = []
            for _ in range(args["repeats"]):
                t0 = time.perf_counter()
                reward.score(reqs)
                times.append(time.perf_counter() - t0)
            rows.append({"tokens": k, "batch": batch, "requests_per_s": batch / statistics.median(times)})
    if out_dir is not None:
        ResultsWriter(out_dir, resume=False).write_json("rm_bench.json", {"reward": name, "rows": rows})
    for r in rows:
        print(f"{name}_requests_per_s_len{r['tokens']}_batch{r['batch']}: {r['requests_per_s']:.1f}")
    return RunOutput([], Compute(), Path(out_dir) if out_dir else None, extra={"rows": rows})
