"""``llm_judge``'s prompt and verdict parsing checked on held-out preference pairs, with rodeco's own server as the
judging model::

    python scripts/llm_judge_pairs.py --pairs 100 --out runs/llm_judge_pairs.json

It starts ``rodeco task=serve`` on 127.0.0.1 (a free port; the embedded SmolLM2-135M unless ``--set`` says
otherwise; ``serve.best_of=1``, so a request as ``llm_judge`` sends it decodes one greedy candidate), waits for
``/health``, and stops it by its process id at the end. ``--base-url`` judges against a server already running
instead (nothing is started).

Each pair of ``alpaca_eval_prefs_test`` (a seeded sample of ``--pairs``) is judged exactly as ``llm_judge`` judges
a response against the reference: ``LLMJudge.score`` with the chosen answer as the response and the rejected one in
the reference's place, so the judge is asked twice at temperature 0 (chosen as A, then chosen as B) with its own
system prompt, template and verdict parsing. A pair scores 1 when the parseable verdicts prefer the chosen answer, 0
when they prefer the rejected one, 0.5 when they disagree or none parses. Printed: the accuracy with a bootstrap 95%
CI over pairs, the length-only baseline (prefer the longer answer) on the same pairs and the paired difference,
the accuracy on the pairs whose chosen answer is the shorter, the position bias (share of verdicts "A"), unparseable
verdicts, failed pairs, and the cost as the server reports it (requests, prompt and completion tokens, seconds).
The snapshot (``--out``) holds the figures and, per pair, its index in the test file, the two verdicts, the
replies' first characters and both answers' lengths; no text.

Every request is bounded (``--timeout`` seconds, ``--retries`` more tries), the loop by ``--pairs`` and
``--max-seconds`` (a pair is not started past it; the pairs judged are then a prefix of the same seeded sample);
three failed pairs in a row stop it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rodeco.experiments.bootstrap import ci, draws, mean_ci
from rodeco_rewards.reference import References

SPLIT = "alpaca_test"
REPLY_CHARS = 16  # of each reply, kept in the snapshot
FAILURES = 3  # pairs failed in a row that stop the run (the server is gone or refuses every request)


class Rejected(References):
    """``llm_judge``'s references, standing in: whatever the prompt, the current pair's rejected answer."""

    def __init__(self) -> None:
        super().__init__([], {}, "llm_judge_pairs", "preference pairs (the rejected answer in the reference's place)")
        self.current = ""

    def answer(self, prompt: str) -> str:
        return self.current


def sample(n_total: int, n: int, seed: int) -> list[int]:
    """``n`` indices of ``n_total`` pairs, a seeded random order (a prefix of it is a random sample too)."""
    return [int(i) for i in np.random.default_rng(seed).permutation(n_total)[:n]]


def length_vote(chosen: str, rejected: str) -> float:
    """The length-only baseline: 1 if the chosen answer is the longer (characters), 0.5 at equal length, else 0."""
    return 1.0 if len(chosen) > len(rejected) else 0.5 if len(chosen) == len(rejected) else 0.0


def judge_pairs(
    pairs: Sequence[Any],
    indices: Sequence[int],
    post: Callable[[dict[str, Any]], dict[str, Any]],
    model: str,
    max_tokens: int = 4,
    max_seconds: float = math.inf,
    base_url: str = "",
    clock: Callable[[], float] = time.monotonic,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each pair ``pairs[i]`` (``prompt``, ``chosen``, ``rejected``) for ``i`` in ``indices`` judged by ``llm_judge``
    through ``post`` (a chat-completions request body -> the response body): per pair its record, and the run's
    cost and the judge's own report. Stops before a pair once ``max_seconds`` have passed."""
    from rodeco import ScoreRequest
    from rodeco_rewards.llm_judge import LLMJudge, parse_verdict

    asked: list[dict[str, Any]] = []  # every response of this run, in order

    def recording(body: dict[str, Any]) -> dict[str, Any]:
        out = post(body)
        asked.append(out)
        return out

    refs = Rejected()
    judge = LLMJudge(refs, recording, model, max_tokens, base_url)  # llm_judge's own system prompt and template
    records: list[dict[str, Any]] = []
    t0 = clock()
    stopped = None
    for i in indices:
        if clock() - t0 > max_seconds:
            stopped = f"--max-seconds {max_seconds:g} reached after {len(records)} pairs"
            break
        if len(records) >= FAILURES and all(r["score"] is None for r in records[-FAILURES:]):
            stopped = f"{FAILURES} pairs failed in a row: {records[-1]['error']}"
            break
        p = pairs[i]
        refs.current = p.rejected
        before = len(asked)
        rec: dict[str, Any] = {
            "index": int(i),
            "chosen_chars": len(p.chosen),
            "rejected_chars": len(p.rejected),
            "length_vote": length_vote(p.chosen, p.rejected),
        }
        try:
            (score,) = judge.score([ScoreRequest(p.prompt, p.chosen, (), partial=False)])
            rec["score"] = float(score)
        except Exception as e:  # a failed request: the pair is counted as failed, not scored
            rec["score"] = None
            rec["error"] = f"{type(e).__name__}: {e}"[:200]
        replies = [_reply(r) for r in asked[before:]]
        # the first request has the chosen answer as A, the second as B
        rec["verdicts"] = [parse_verdict(r) for r in replies]
        rec["replies"] = [r[:REPLY_CHARS] for r in replies]
        records.append(rec)
    usage = [r.get("usage") or {} for r in asked]
    cost = {
        "requests": len(asked),
        "prompt_tokens": int(sum(int(u.get("prompt_tokens", 0)) for u in usage)),
        "completion_tokens": int(sum(int(u.get("completion_tokens", 0)) for u in usage)),
        "seconds": clock() - t0,
        "stopped": stopped,
    }
    return records, {"cost": cost, "judge_report": judge.report(), "judge_identity": judge.identity}


def _reply(response: dict[str, Any]) -> str:
    try:
        return str(response["choices"][0]["message"]["content"] or "")
    except (KeyError, IndexError, TypeError):
        return ""


def summarize(records: Sequence[dict[str, Any]], resamples: int = 10000, seed: int = 0) -> dict[str, Any]:
    """Accuracy (and the length baseline, their paired difference, the accuracy where the chosen answer is the
    shorter) with bootstrap 95% CIs over the scored pairs, and the verdict counts."""
    ok = [r for r in records if r["score"] is not None]
    s = np.array([r["score"] for r in ok], dtype=np.float64)
    length = np.array([r["length_vote"] for r in ok], dtype=np.float64)
    shorter = np.array([r["chosen_chars"] < r["rejected_chars"] for r in ok], dtype=bool)
    idx = draws(len(s), resamples, seed)

    def stat(x: np.ndarray) -> dict[str, Any]:
        if not len(x):
            return {"value": math.nan, "ci": [math.nan, math.nan]}
        return {"value": float(x.mean()), "ci": ci(x[idx].mean(1))}

    sub = s[shorter]
    verdicts = [v for r in records for v in r["verdicts"]]
    parsed = [v for v in verdicts if v is not None]
    both = [r for r in ok if None not in r["verdicts"] and len(r["verdicts"]) == 2]
    return {
        "pairs": len(records),
        "scored": len(ok),
        "failed": len(records) - len(ok),
        "accuracy": stat(s),
        "length_baseline": stat(length),
        "accuracy_minus_length": stat(s - length),
        "chosen_shorter": {
            "pairs": int(shorter.sum()),
            "accuracy": float(sub.mean()) if len(sub) else math.nan,
            "ci": mean_ci(sub, resamples, seed + 1),
        },
        "verdicts": len(verdicts),
        "unparseable": len(verdicts) - len(parsed),
        "share_a": float(np.mean([v == "A" for v in parsed])) if parsed else math.nan,
        "consistent": sum(r["score"] in (0.0, 1.0) for r in both),
        "both_parsed": len(both),
        "resamples": resamples,
        "seed": seed,
    }


def table(summary: dict[str, Any], cost: dict[str, Any]) -> list[str]:
    f = lambda x: f"{x['value']:.3f} [{x['ci'][0]:.3f}, {x['ci'][1]:.3f}]"  # noqa: E731
    d = summary["accuracy_minus_length"]
    cs = summary["chosen_shorter"]
    per = cost["seconds"] / max(summary["pairs"], 1)
    rows = [
        ("pairs judged (scored / failed)", f"{summary['pairs']} ({summary['scored']} / {summary['failed']})"),
        ("llm_judge accuracy", f(summary["accuracy"])),
        ("length only (prefer the longer)", f(summary["length_baseline"])),
        ("llm_judge - length, paired", f"{d['value']:+.3f} [{d['ci'][0]:+.3f}, {d['ci'][1]:+.3f}]"),
        (
            f"accuracy, chosen the shorter ({cs['pairs']} pairs)",
            f"{cs['accuracy']:.3f} [{cs['ci'][0]:.3f}, {cs['ci'][1]:.3f}]",
        ),
        (
            "verdicts (unparseable)",
            f"{summary['verdicts']} ({summary['unparseable']}); share A {summary['share_a']:.3f}; "
            f"both orders agree {summary['consistent']}/{summary['both_parsed']}",
        ),
        (
            "cost",
            f"{cost['requests']} requests, {cost['prompt_tokens']} prompt + {cost['completion_tokens']} completion "
            f"tokens, {cost['seconds']:.1f} s, {per:.2f} s/pair",
        ),
    ]
    w = max(len(k) for k, _ in rows)
    out = [f"{k:<{w}}  {v}" for k, v in rows]
    if cost.get("stopped"):
        out.append(f"stopped early: {cost['stopped']}")
    a = summary["accuracy"]
    out.append(f"llm_judge_accuracy: {a['value']:.3f} [{a['ci'][0]:.3f}, {a['ci'][1]:.3f}]")
    return out


def server_argv(a: argparse.Namespace, port: int, run_dir: Path) -> list[str]:
    from rodeco.experiments.bench.servers import rodeco_exe

    return [
        str(rodeco_exe()),
        "task=serve",
        "serve.host=127.0.0.1",
        f"serve.port={port}",
        "serve.best_of=1",  # llm_judge's requests name no best_of: one greedy candidate each
        "policy=none",
        "reward=logprob",  # one candidate: the reward picks nothing, so the cheapest
        f"budget.kv_tokens={a.kv_tokens}",
        f"serve.request_timeout_s={a.timeout}",
        "serve.drain_timeout_s=5",
        f"hydra.run.dir={run_dir}",
        *a.set,
    ]


def load_test_pairs(data_root: str | None) -> tuple[list[Any], Path]:
    from rodeco import ConfigError
    from rodeco_rewards.prefs import data_dir, load_pairs, split_file

    try:
        root = data_dir(data_root, "--data-root")
        return load_pairs(SPLIT, root), split_file(SPLIT, root)
    except ConfigError as e:
        raise SystemExit(f"no held-out preference pairs (prefs/alpaca_eval_prefs_test.jsonl.gz): {e}") from None


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=100, help="pairs judged, a seeded sample (default 100)")
    ap.add_argument("--seed", type=int, default=0, help="the sample's and the bootstrap's seed")
    ap.add_argument("--max-seconds", type=float, default=900.0, help="no pair is started after this (default 900)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per request (default 120)")
    ap.add_argument("--retries", type=int, default=0, help="more tries after a connection error, 429 or 5xx")
    ap.add_argument("--max-tokens", type=int, default=4, help="the verdict's tokens, as llm_judge's default")
    ap.add_argument("--model", default="smollm2", help="the model name the requests give (the server's)")
    ap.add_argument("--base-url", default=None, help="judge against this running API (.../v1); nothing started")
    ap.add_argument("--kv-tokens", type=int, default=16384, help="the started server's budget.kv_tokens")
    ap.add_argument("--start-timeout", type=float, default=300.0, help="seconds the server may take to be healthy")
    ap.add_argument("--set", action="append", default=[], help="another override of the started server (repeat)")
    ap.add_argument("--data-root", default=None, help="the folder holding prefs/ (default: rodeco's data root)")
    ap.add_argument("--resamples", type=int, default=10000, help="bootstrap resamples (default 10000)")
    ap.add_argument("--out", type=Path, default=None, help="the JSON snapshot to write")
    a = ap.parse_args(argv)
    if a.pairs < 1 or a.timeout <= 0 or a.max_seconds <= 0 or a.retries < 0:
        ap.error("--pairs and --timeout, --max-seconds must be positive, --retries 0 or more")
    return a


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse(argv)
    from rodeco_rewards.llm_judge import SYSTEM, TEMPLATE, http_post

    pairs, path = load_test_pairs(a.data_root)
    indices = sample(len(pairs), a.pairs, a.seed)
    started: dict[str, Any] = {}

    def run(base_url: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        post = http_post(base_url, "", a.timeout, a.retries)  # no key: a loopback server
        return judge_pairs(pairs, indices, post, a.model, a.max_tokens, a.max_seconds, base_url)

    if a.base_url:
        records, extra = run(a.base_url)
    else:
        from rodeco.experiments.bench.servers import free_port, launched

        port = free_port()
        with tempfile.TemporaryDirectory(prefix="llm-judge-pairs-") as tmp:
            argv_ = server_argv(a, port, Path(tmp) / "hydra")
            with launched("rodeco-serve", argv_, port, Path(tmp), a.start_timeout, unset=("RODECO_API_KEY",)) as srv:
                shown = [x for x in argv_[1:] if not x.startswith(("hydra.run.dir=", "serve.port="))]
                started = {"argv": ["rodeco", *shown], "startup_seconds": srv.started_s}
                records, extra = run(srv.url + "/v1")
    summary = summarize(records, a.resamples, a.seed)
    lines = table(summary, extra["cost"])
    print("\n".join(lines))
    out = {
        "command": "python scripts/llm_judge_pairs.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "split": SPLIT,
        "file": f"prefs/{path.name}",
        "file_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "file_pairs": len(pairs),
        "judge": {
            "model": a.model,
            "max_tokens": a.max_tokens,
            "system_template_digest": hashlib.sha256((SYSTEM + "\0" + TEMPLATE).encode()).hexdigest()[:12],
            "report": extra["judge_report"],
        },
        "server": started or {"base_url": a.base_url},
        "summary": summary,
        "cost": extra["cost"],
        "per_pair": records,
    }
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(out, indent=1, default=float) + "\n")
    return out


if __name__ == "__main__":
    main()
