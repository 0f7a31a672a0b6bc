"""The open loop with requests joining as it runs, against the same requests all joining at step 0: decoded tokens a
second, paired.

    python scripts/open_vs_closed.py --out runs/open_vs_closed

The same requests (the first ``--requests`` prompts of ``--data``, AlpacaFarm's of mixed lengths by default; each
``--best-of`` rows under fixed Speculative Rejection, alpha 0.5, within the memory of a quarter of its rows at full
length, the server's default ``serve.request_memory``) decode twice through the open loop
(``rodeco.Decoder.serve_open``), one request a prompt with its own budget and clock:

- **staggered**: one request joins every ``--every`` steps (the loop pauses every ``--every`` tokens to admit the
  next; a running request's decision point may pause it sooner), so that rows of different ages, finishes and
  rejections mix in the batch;
- **closed**: every request joins at step 0, a closed batch of them.

Each round runs both, the order alternating round by round, the prompts' order rotated, so that drifts in machine
load hit both alike. Tokens are the candidates' own tokens (what the rows sampled, whatever the batch stepped besides:
the same in both runs of a round), over the decode's wall time, admissions and scoring included. The guide is
``--reward`` (``logprob`` by default: no model of its own, so the figure is the loop's and the engine's). Prints each
round's ratio, then, last, ``open_over_closed_tokens_per_s: R [lo, hi]``: the geometric mean over rounds and its 95%
bootstrap CI. Writes every run to ``OUT/open_vs_closed.json``. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rodeco.experiments.bootstrap import geomean_ci  # noqa: E402

REQUEST_MEMORY = 0.25  # the server's default serve.request_memory


@dataclass
class Run:
    """One decode of the round's requests: how they joined, the candidates' tokens and the wall time."""

    mode: str
    tokens: int
    seconds: float
    requests: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


class Arrivals:
    """An open source that gives ``reqs`` one a call (``every`` > 0) or all at the first call, then closes."""

    def __init__(self, reqs: list[Any], one_at_a_time: bool) -> None:
        self.reqs, self.one = list(reqs), one_at_a_time

    def take(self, wait: bool) -> list[Any] | None:
        if not self.reqs:
            return None
        k = 1 if self.one else len(self.reqs)
        out, self.reqs = self.reqs[:k], self.reqs[k:]
        return out


def decode(dec: Any, prompts: list[Any], a: argparse.Namespace, mode: str) -> Run:
    """The requests of ``prompts`` through the open loop, staggered or all at once."""
    from rodeco.common.budget import full_length_tokens
    from rodeco.common.state import PromptRef

    got: list[Any] = []
    reqs = []
    rows, first = max(1, math.ceil(a.best_of * REQUEST_MEMORY)), min(dec.budget().min_tokens_per_round, a.max_tokens)
    for p in prompts:
        ids, kv = dec.gen.encode(p.text), dec.gen.kv
        reqs.append(
            dec.request(
                [PromptRef(p.index, p.text, seed=a.seed)],
                n=a.best_of,
                policy={"name": "fixed", "alpha": 0.5},
                max_new_tokens=a.max_tokens,
                # a quarter of its rows at full length, and at least what its first round needs (as the server sizes it)
                kv_tokens=max(
                    full_length_tokens(rows, [len(ids)], a.max_tokens, kv),
                    full_length_tokens(a.best_of, [len(ids)], first, kv),
                ),
                on_done=got.append,
            )
        )
    t0 = time.perf_counter()
    dec.serve_open(Arrivals(reqs, mode == "staggered"), kv_tokens=None, check_tokens=a.every)
    seconds = time.perf_counter() - t0
    if len(got) != len(prompts):
        raise RuntimeError(f"{mode}: {len(got)} of {len(prompts)} requests got a result")
    tokens = sum(len(c.token_ids) for r in got for c in r.candidates or [])
    return Run(mode, tokens, seconds, len(got))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--data", default="alpacafarm100", help="a data option (conf/data)")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--best-of", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--every", type=int, default=4, help="staggered: a request joins every this many steps")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--reward", default="logprob", help="the guide (a reward option)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="a config override (repeat)")
    a = ap.parse_args(argv)
    for key in ("requests", "best_of", "max_tokens", "every", "rounds"):
        if getattr(a, key) < 1:
            ap.error(f"--{key.replace('_', '-')} {getattr(a, key)}: must be at least 1")
    return a


def main(argv: list[str] | None = None, generator: Any = None) -> dict[str, Any]:
    """``generator``: an already loaded one (tests); else the config's."""
    import rodeco
    from rodeco.tasks import prompts_of

    a = parse(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    prompts = prompts_of(rodeco.load_config([f"data={a.data}", f"data.limit={a.requests}"]).data)
    dec = rodeco.Decoder(reward=a.reward, generator=generator, overrides=list(a.overrides))
    decode(dec, prompts[:2], a, "closed")  # warm-up: the first forward passes, untimed
    rounds: list[dict[str, Any]] = []
    for i in range(a.rounds):
        shift = (i * len(prompts)) // a.rounds
        order = prompts[shift:] + prompts[:shift]
        modes = ("staggered", "closed") if i % 2 == 0 else ("closed", "staggered")
        runs = {mode: decode(dec, order, a, mode) for mode in modes}
        if runs["staggered"].tokens != runs["closed"].tokens:  # a float tie broken otherwise in another batch
            print(f"round {i}: the runs sampled {runs['staggered'].tokens} and {runs['closed'].tokens} tokens")
        ratio = runs["staggered"].tokens_per_s / runs["closed"].tokens_per_s
        rounds.append({"ratio": ratio, **{m: vars(r) for m, r in runs.items()}})
        print(
            f"round {i}: staggered {runs['staggered'].tokens_per_s:.1f} tokens/s, closed "
            f"{runs['closed'].tokens_per_s:.1f}: open/closed {ratio:.3f}"
        )
    g, lo, hi = geomean_ci([r["ratio"] for r in rounds])
    out = {"args": {k: str(v) for k, v in vars(a).items()}, "rounds": rounds, "ratio": [g, lo, hi]}
    (a.out / "open_vs_closed.json").write_text(json.dumps(out, indent=1) + "\n")
    finite = all(math.isfinite(x) for x in (g, lo, hi))
    print(f"open_over_closed_tokens_per_s: {g:.3f} [{lo:.3f}, {hi:.3f}]" if finite else "no ratio")
    return out


if __name__ == "__main__":
    main()
