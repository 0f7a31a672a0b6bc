"""``calibrated``: reject by how predictive the partial scores are *at this decision length*, as measured on
training prompts (``rodeco experiment=calibrate``; ``rodeco.calibration``).

At length ``L`` a prompt's active rows' partial scores are standardized (``z``); each row's standardized final
score is modelled as ``rho(L) * z + eps``, ``eps ~ N(0, sd(L)^2)``. A row is kept when the probability that it ends
above the prompt's best row exceeds ``delta`` (``rodeco.keep_probability``), never keeping more than the budget
allows (the forced minimum is always rejected) and always keeping one. Where partial scores predict well it rejects
much; where they do not, only what the budget forces. Unlike ``adaptive``, nothing is estimated from the survivors
(whom earlier rounds selected, which biases any spread measured on them).

``n: calibrated`` asks this policy for the start: of the starts the budget allows, the one with the highest modelled
speedup over Best-of-N (the calibration model simulated on the budget's schedule: ``choose_start``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from rodeco import (
    BuildContext,
    Calibration,
    RoundView,
    StartView,
    check_number,
    keep_probability,
    keep_top,
    standardize,
    take_params,
)

COMMITTED = Path(__file__).parent / "calibrations"  # measured on alpaca_train: the embedded generator with
DEFAULT = COMMITTED / "smollm2--minilm_rm.json"  # minilm_rm (the default), and with logprob (perplexity form)


@dataclass
class CalibratedParams:
    delta: float = field(default=0.05, metadata={"help": "keep a row while its modelled chance to end above the best "
                                                          "exceeds this"})
    calibration: Optional[str] = field(default=None, metadata={"help": "a calibration file (rodeco "
                                                                        "experiment=calibrate); null: the committed "
                                                                        "one of the run's generator and reward"})
    simulations: int = field(default=400, metadata={"help": "simulated prompts per start, for n=calibrated"})


class CalibratedPolicy:
    def __init__(self, cal: Calibration, delta: float, simulations: int = 400, seed: int = 0) -> None:
        self.cal, self.delta, self.simulations, self.seed = cal, delta, simulations, seed
        # what its decisions depend on beyond its parameters: the calibration's numbers (a resumed sweep checks it)
        self.identity = hashlib.sha256(json.dumps([cal.lengths, cal.slope, cal.resid_sd]).encode()).hexdigest()[:16]

    def keep_count(self, scores: np.ndarray, length: int) -> int:
        """How many rows the model keeps (before the budget's minimum)."""
        p = keep_probability(standardize(np.asarray(scores, dtype=np.float64)), self.cal.rho(length),
                             self.cal.sd(length))
        return max(1, int(np.sum(p > self.delta)))

    def select(self, view: RoundView) -> list[list[int]]:
        return [keep_top(pv, pv.k - self.keep_count(pv.scores, pv.tokens_generated)) for pv in view.prompts]

    def choose_start(self, view: StartView) -> int:
        return best_start(self, view.kv_tokens, view.base, view.max_rows, view.max_new_tokens,
                          view.min_tokens_per_round)


def starts(max_rows: int, full: int) -> list[int]:
    """Candidate starts: from the rows that fit at full length, doubling, up to the most the budget allows."""
    out, n = [], max(1, full)
    while n < max_rows:
        out.append(n)
        n *= 2
    return out + [max_rows]


@functools.lru_cache(maxsize=None)
def _expected_max_table() -> tuple[np.ndarray, np.ndarray]:
    """E[max of N standard normals] for N on a log grid (numerical integration)."""
    from scipy.special import ndtr

    x = np.linspace(-8, 8, 4001)
    pdf, cdf = np.exp(-x * x / 2) / math.sqrt(2 * math.pi), ndtr(x)
    ns = np.unique(np.round(np.logspace(0, 5, 400)).astype(int))
    e = np.array([np.trapezoid(x * n * pdf * cdf ** (n - 1), x) for n in ns])
    return ns.astype(np.float64), e


def equivalent_best_of(e_best: float) -> float:
    """The N whose Best-of-N expects ``e_best`` (standardized), interpolated in log N."""
    ns, e = _expected_max_table()
    return float(np.exp(np.interp(e_best, e, np.log(ns))))


def simulate(policy: CalibratedPolicy, n: int, kv: int, base: int, new: int, min_tok: int,
             rng: np.random.Generator) -> tuple[float, float]:
    """(expected standardized best, decode tokens) of one prompt started with ``n`` rows, under the calibration
    model: finals ~ N(0, 1), partial scores at each decision length correlated ``rho(L)`` with them, the budget's
    decision points (the cache full), the policy's rule, rows running to ``new`` tokens."""
    cal, best, tokens = policy.cal, 0.0, 0.0
    for _ in range(policy.simulations):
        f = rng.standard_normal(n)
        alive, t = np.arange(n), 0
        while True:
            L = min(new, kv // len(alive) - base)
            tokens += len(alive) * (L - t)
            t = L
            if t >= new:
                break
            rho = cal.rho(t)
            z = rho * f[alive] + math.sqrt(max(0.0, 1 - rho * rho)) * rng.standard_normal(len(alive))
            fit = max(1, kv // (base + min(new, t + min_tok)))
            m = min(policy.keep_count(z, t), fit, len(alive))
            alive = alive[np.argsort(-z, kind="stable")[:m]]
        best += float(f[alive].max())
    return best / policy.simulations, tokens / policy.simulations


@functools.lru_cache(maxsize=256)
def _best_start(policy: CalibratedPolicy, kv: int, base: int, max_rows: int, new: int, min_tok: int) -> int:
    full = kv // (base + new)
    scored = []
    for n in starts(max_rows, full):
        e, tok = simulate(policy, n, kv, base, new, min_tok, np.random.default_rng(policy.seed))
        scored.append((equivalent_best_of(e) * new / max(tok, 1.0), n))
    return max(scored)[1]


def best_start(policy: CalibratedPolicy, kv: int, base: int, max_rows: int, new: int, min_tok: int) -> int:
    """The start with the highest modelled FLOPs speedup over Best-of-N: the equivalent Best-of-N of its expected
    best, times N full responses' tokens, over its own decode tokens."""
    return _best_start(policy, kv, base, max_rows, new, min_tok)


def committed_for(identities: dict[str, str]) -> Path:
    """The committed calibration measured with the run's generator and scorers (the default pair's outside a run;
    if none matches, the default, whose check then names what differs)."""
    for f in sorted(COMMITTED.glob("*.json")):
        cal = Calibration.load(f)
        if identities and all(getattr(cal, k) == v for k, v in identities.items()):
            return f
    return DEFAULT


def build_calibrated(params: dict[str, Any], ctx: BuildContext) -> CalibratedPolicy:
    p = take_params("policy", params, CalibratedParams)
    check_number("policy.delta", p["delta"], 0.0, 1.0, lo_open=True, hi_open=True, fix="e.g. policy.delta=0.05")
    check_number("policy.simulations", p["simulations"], 1, 100000, fix="e.g. policy.simulations=400")
    path = p["calibration"] or committed_for(ctx.identities)
    cal = Calibration.load(path)
    cal.source["path"] = str(path)
    if ctx.identities:
        cal.check(ctx.identities)
    return CalibratedPolicy(cal, float(p["delta"]), int(p["simulations"]))
