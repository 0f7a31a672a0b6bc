"""``scripts/serve_bench.py``'s clients of the servers ``servers`` starts: the client-side scorer of vLLM's
responses, the senders that ask each server, and their ``/metrics``."""

from __future__ import annotations

import argparse
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

from rodeco.experiments.bench.servers import http_get

RODECO_KEYS = (
    "queue_seconds",
    "decode_seconds",
    "decode_tokens",
    "prefill_tokens",
    "flops",
    "bon_flops_modelled",
    "candidates_started",
    "candidates_rejected",
    "rounds",
    "batch_requests",
    "kv_tokens",
)
Send = Callable[[str, int], tuple[float, dict[str, Any]]]
Traced = tuple[list[float], list[list[float]]]  # a response's tokens' log-probs, and each position's top-k ones


def choices(d: dict[str, Any], top_k: int) -> tuple[list[str], list[Traced] | None]:
    """An OpenAI chat completion's choices in index order: their texts and, where it carries them (``logprobs``),
    each one's tokens' log-probs and its positions' ``top_k`` most likely tokens' log-probs."""
    chs = sorted(d["choices"], key=lambda ch: ch["index"])
    texts = [ch["message"]["content"] or "" for ch in chs]
    if not all((ch.get("logprobs") or {}).get("content") is not None for ch in chs):
        return texts, None
    traced = []
    for ch in chs:
        toks = ch["logprobs"]["content"]
        top = [sorted((x["logprob"] for x in t.get("top_logprobs") or []), reverse=True)[:top_k] for t in toks]
        traced.append(([float(t["logprob"]) for t in toks], top))
    return texts, traced


# -- the client-side scorer (vLLM's responses) -----------------------------------------------------------------------
class Scorer:
    """The reward, built once in this process, behind ONE thread that every request's scoring queues for. With
    ``batching`` the thread scores all the requests waiting when it comes free in one reward call; each of them
    waits for, and is charged, that whole call. A reward that reads the generator's log-probs (``logprob``,
    ``confidence``) gets the ones vLLM returns with each choice (``logprobs``, ``top_k``: how many of each position's
    most likely tokens it reads); one that reads hidden states cannot score vLLM's answers."""

    def __init__(self, reward: str, batching: bool = True, threads: int = 0) -> None:
        import torch

        import rodeco
        from rodeco.plugins import default_plugins

        if threads > 0:  # torch's threads in this process: spinning against vLLM's CPU workers slows both
            torch.set_num_threads(threads)

        plugins = default_plugins()
        node = rodeco.load_config([f"reward={reward}"], plugins).reward  # the node rodeco's server builds
        self.reward = plugins.build_reward(node, rodeco.BuildContext(plugins=plugins))
        from rodeco.core.contracts import reward_info

        info = reward_info(self.reward)
        if info.needs_hidden_states:
            raise SystemExit(
                f"--reward {reward}: it reads the generator's hidden states, which vLLM's server does not return; "
                "pick a reward that reads the text or the log-probs (logprob, confidence, minilm_rm)"
            )
        self.logprobs, self.top_k = info.needs_logprobs or info.needs_top_logprobs > 0, info.needs_top_logprobs
        self.batching = batching
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="scorer", daemon=True)
        self.thread.start()

    def score(
        self, prompt: str, texts: list[str], logprobs: list[Traced] | None = None
    ) -> tuple[list[float], float, float, int]:
        """(scores, seconds waiting for the scorer, seconds of the reward call, requests in that call); ``logprobs``:
        each text's tokens' log-probs and top-k log-probs (``choices``), where the reward reads them."""
        fut: Future = Future()
        each: list[Traced | None] = list(logprobs) if logprobs is not None else [None] * len(texts)
        self.queue.put((prompt, texts, each, time.monotonic(), fut))
        return fut.result()

    def _loop(self) -> None:
        from rodeco import ScoreRequest

        while True:
            items = [self.queue.get()]
            while self.batching and items[-1] is not None:
                try:
                    items.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            stop = items[-1] is None
            items = [x for x in items if x is not None]
            if items:
                t0 = time.monotonic()
                try:
                    flat = self.reward.score(
                        [
                            ScoreRequest(
                                p,
                                t,
                                (),
                                partial=False,
                                logprobs=tuple(lp[0]) if lp is not None else None,
                                top_logprobs=tuple(map(tuple, lp[1])) if lp is not None else None,
                            )
                            for p, ts, lps, _, _ in items
                            for t, lp in zip(ts, lps)
                        ]
                    )
                    took, at = time.monotonic() - t0, 0
                    for _, ts, _, asked, fut in items:
                        fut.set_result(([float(x) for x in flat[at : at + len(ts)]], t0 - asked, took, len(items)))
                        at += len(ts)
                except Exception as e:  # these requests fail; the scorer goes on
                    for *_, fut in items:
                        if not fut.done():
                            fut.set_exception(e)
            if stop:
                return

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join(60)


def client(url: str, timeout: float) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=timeout)


def ask(c: Any, model: str, prompt: str, seed: int, a: argparse.Namespace, n: int, extra: dict[str, Any]) -> Any:
    """One chat completion of ``prompt`` at the benchmark's sampling settings, with its raw HTTP response."""
    return c.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=a.max_tokens,
        temperature=a.temperature,
        top_p=1.0,
        seed=seed,
        n=n,
        extra_body=extra,
    )


def rodeco_sender(url: str, model: str, a: argparse.Namespace, policy: dict[str, Any]) -> Send:
    c = client(url, a.request_timeout)

    def send(prompt: str, seed: int) -> tuple[float, dict[str, Any]]:
        raw = ask(c, model, prompt, seed, a, 1, {"best_of": a.best_of, "rodeco": policy})
        d = raw.http_response.json()
        rb = d["rodeco"]
        info = {k: rb.get(k) for k in RODECO_KEYS} | {
            "completion_tokens": d["usage"]["completion_tokens"],
            "prompt_tokens": d["usage"]["prompt_tokens"],
            "winner_tokens": rb["choices"][0]["tokens"],
            "text": d["choices"][0]["message"]["content"],
            "time_s": rb.get("time_s") or {},  # its own seconds of each phase
        }
        return float(rb["choices"][0]["reward"]), info

    return send


def vllm_sender(url: str, model: str, a: argparse.Namespace, scorer: Scorer) -> Send:
    c = client(url, a.request_timeout)
    extra: dict[str, Any] = {"top_k": a.top_k if a.top_k > 0 else -1}
    if scorer.logprobs:  # the reward reads the generator's log-probs: vLLM returns them with each choice
        extra |= {"logprobs": True, "top_logprobs": max(1, scorer.top_k)}

    def send(prompt: str, seed: int) -> tuple[float, dict[str, Any]]:
        t0 = time.monotonic()
        raw = ask(c, model, prompt, seed, a, a.vllm_best_of or a.best_of, extra)
        d = raw.http_response.json()
        gen_s = time.monotonic() - t0
        texts, traced = choices(d, scorer.top_k)
        if scorer.logprobs and traced is None:
            raise RuntimeError("vLLM's answer carries no log-probs, which the reward reads")
        scores, wait_s, score_s, together = scorer.score(prompt, texts, traced)
        best = int(np.argmax(scores))
        return scores[best], {
            "generate_seconds": gen_s,
            "score_wait_seconds": wait_s,
            "score_seconds": score_s,
            "score_batch_requests": together,
            "completion_tokens": d["usage"]["completion_tokens"],
            "prompt_tokens": d["usage"]["prompt_tokens"],
            "choices": len(texts),
            "scores": scores,
            "text": texts[best],
        }

    return send


def scrape(url: str) -> dict[str, float]:
    """``/metrics`` as {sample name: value summed over its labels} (histogram buckets left out); {} if it fails."""
    try:
        status, text = http_get(f"{url}/metrics", timeout=10)
    except OSError:
        return {}
    out: dict[str, float] = {}
    if status != 200:
        return out
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name = head.split("{", 1)[0]
        if name.endswith(("_bucket", "_created")):
            continue
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return out


def metrics_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0) != 0}
