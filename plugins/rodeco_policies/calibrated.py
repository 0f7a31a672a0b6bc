"""``calibrated``: reject by how predictive the partial scores are *at this decision length*, as measured on
training prompts (``rodeco experiment=calibrate``; ``rodeco.core.calibration``).

At length ``L`` each active row's partial score is put on the calibration's standardized scale (``z``), with the
spread of every row at the prompt's first decision point, none selected yet, and the population's location carried
from there (``calibrated_scale``: nothing is standardized among survivors). Its standardized final is modelled as
``N(rho(L) * z, sd(L)^2)``, independently of the others'. A finished candidate's final is known; the calibration's
``final_link`` (where finals sit against partial scores, measured on the training prompts) puts it on the same
scale, and a calibration without it leaves finished candidates out: read as a partial score, a final would look
several spreads better than it is (a response gains reward as it grows). From these, each row's chance to be the
*eventual best*, above every other active row's final and the best finished one (``rodeco.best_probability``).
The least likely rows are rejected together while the chance that the eventual best is among them stays at most
``delta`` (``rodeco.rejectable``), never fewer than the budget forces, always keeping one. Where partial scores
predict nothing every row has the same chance and only ``floor(delta * k)`` of ``k`` can go (none for
``k < 1 / delta``); where they predict well, every row that cannot beat the best goes.

``n: calibrated`` asks this policy for the start: of the starts the budget allows, the one with the highest modelled
speedup over Best-of-N (the calibration model simulated on the budget's schedule with the same rule: ``choose_start``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from rodeco import (
    BuildContext,
    Calibration,
    PolicyInfo,
    PromptView,
    RoundView,
    StartView,
    best_probability,
    check_number,
    keep_top,
    rejectable,
    take_params,
)
from rodeco_policies.calibrated_scale import References, Scale

log = logging.getLogger(__name__)

RULE = 2  # the decision rule's version, part of ``identity``: 2 = the eventual best, finished candidates included,
#           the first decision point's spread; 1 = against the top row, survivors re-standardized every round

COMMITTED = Path(__file__).parent / "calibrations"  # measured on alpaca_train: the embedded generator with
DEFAULT = COMMITTED / "smollm2--minilm_rm.json"  # minilm_rm (the default), and with logprob (perplexity form)


def predicted(rho: float, z: np.ndarray) -> np.ndarray:
    """``rho * z``: the standardized final the rows' standardized partial scores ``z`` predict. 0 where ``rho`` is
    0 (the scores say nothing), also for an infinite ``z`` (a spread that is 0, or underflowed to 0, so far), where
    the product would be NaN."""
    return rho * z if rho != 0 else np.zeros_like(z)


@dataclass
class CalibratedParams:
    delta: float = field(
        default=0.05,
        metadata={
            "help": "reject the least likely rows while the modelled chance that "
            "the eventual best is among them stays at most this"
        },
    )
    calibration: Optional[str] = field(
        default=None,
        metadata={
            "help": "a calibration file (rodeco "
            "experiment=calibrate); null: the committed "
            "one of the run's generator and reward"
        },
    )
    simulations: int = field(default=400, metadata={"help": "simulated prompts per start, for n=calibrated"})


class CalibratedPolicy:
    info = PolicyInfo(chooses_start=True)  # choose_start: the start with the best modelled speedup (n=policy)

    def __init__(self, cal: Calibration, delta: float, simulations: int = 400, seed: int = 0) -> None:
        self.cal, self.delta, self.simulations, self.seed = cal, delta, simulations, seed
        self.references = References(cal.rho)
        self._said_unlinked = False
        # what its decisions depend on beyond its parameters: the rule and the calibration (a resumed sweep checks it)
        blob = [RULE, cal.lengths, cal.slope, cal.resid_sd, cal.final_offset, cal.final_spread]
        self.identity = hashlib.sha256(json.dumps(blob).encode()).hexdigest()[:16]

    def keep_count(self, z: np.ndarray, length: int, best: float | np.ndarray = -math.inf) -> int | np.ndarray:
        """How many rows the rule keeps (before the budget's minimum): ``z`` the rows' standardized partial scores
        at ``length`` (``[k]``, or ``[prompts, k]`` for a count per prompt), ``best`` the best finished final on the
        same scale. ``select`` and the start simulation both decide with it."""
        z = np.asarray(z, dtype=np.float64)
        p = best_probability(predicted(self.cal.rho(length), z), self.cal.sd(length), best)
        kept = np.maximum(1, z.shape[-1] - np.asarray(rejectable(p, self.delta)))
        return int(kept) if z.ndim == 1 else kept

    def finished_best(self, pv: PromptView, scale: Scale) -> float:
        """The best finished final on the standardized final scale; ``-inf`` without one, or with a calibration
        that does not say where finals sit against partial scores (then they cannot be placed, and are left out)."""
        if not pv.finished_scores:
            return -math.inf
        link = self.cal.final_link(pv.tokens_generated)
        if link is None:
            if not self._said_unlinked:
                self._said_unlinked = True
                log.info(
                    "calibrated: the calibration has no final_offset/final_spread, so finished candidates are "
                    "left out of the decisions (measure it again with rodeco experiment=calibrate)"
                )
            return -math.inf
        offset, spread = link
        finals = Scale(scale.location + offset * scale.spread, spread * scale.spread)
        return float(finals.z(np.asarray(pv.finished_scores, dtype=np.float64)).max())

    def keep(self, pv: PromptView) -> list[int]:
        scale = self.references.scale(pv)
        best = self.finished_best(pv, scale)
        kept = self.keep_count(scale.z(pv.scores), pv.tokens_generated, best)
        assert isinstance(kept, int)  # one prompt's rows: one count
        return keep_top(pv, pv.k - kept)

    def select(self, view: RoundView) -> list[list[int]]:
        return [self.keep(pv) for pv in view.prompts]

    def choose_start(self, view: StartView) -> int:
        return best_start(
            self, view.kv_tokens, view.base, view.max_rows, view.max_new_tokens, view.min_tokens_per_round
        )


def starts(max_rows: int, full: int) -> list[int]:
    """Candidate starts: from the rows that fit at full length, doubling, up to the most the budget allows."""
    out, n = [], max(1, full)
    while n < max_rows:
        out.append(n)
        n *= 2
    return out + [max_rows]


@functools.cache
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


def simulate(
    policy: CalibratedPolicy, n: int, kv: int, base: int, new: int, min_tok: int, rng: np.random.Generator
) -> tuple[float, float]:
    """(expected standardized best, decode tokens) of one prompt started with ``n`` rows, under the calibration
    model: finals ~ N(0, 1), partial scores at each decision length correlated ``rho(L)`` with them and drawn on the
    population's scale (what ``select`` reads them on), the budget's decision points (the cache full), the policy's
    rule (``keep_count``), rows running to ``new`` tokens (no candidate finishes early). The ``simulations`` prompts
    run together: those with the same rows alive are at the same length and decide in one call."""
    S = policy.simulations
    f = rng.standard_normal((S, n))  # [S, n] standardized finals
    alive = np.ones((S, n), dtype=bool)
    t = np.zeros(S, dtype=np.int64)  # tokens at each prompt's last decision point
    pending, tokens = np.ones(S, dtype=bool), 0.0
    while pending.any():
        count = alive.sum(axis=1)
        c = int(count[pending].max())
        g = np.nonzero(pending & (count == c))[0]  # [G] the prompts with c rows alive: decision length L
        L = min(new, kv // c - base)
        tokens += c * float(np.sum(L - t[g]))
        t[g] = L
        fit = max(1, kv // (base + min(new, L + min_tok)))
        if L >= new or fit >= c:  # at the end (fit >= c: one row the budget cannot take to the end; it runs on)
            tokens += c * (new - L) * len(g)
            pending[g] = False
            continue
        alive[g] = _decide(policy, f[g], alive[g], L, fit, rng)
    return float(np.where(alive, f, -np.inf).max(axis=1).mean()), tokens / S


def _decide(
    policy: CalibratedPolicy, f: np.ndarray, alive: np.ndarray, L: int, fit: int, rng: np.random.Generator
) -> np.ndarray:
    """One decision point of simulated prompts with the same number ``c`` of rows alive: their new ``alive``."""
    G, c = len(f), int(alive[0].sum())
    cols = np.nonzero(alive)[1].reshape(G, c)  # [G, c] each prompt's alive rows
    rho = policy.cal.rho(L)
    z = rho * np.take_along_axis(f, cols, axis=1) + math.sqrt(max(0.0, 1 - rho * rho)) * rng.standard_normal((G, c))
    m = np.minimum(policy.keep_count(z, L), fit)  # [G]
    ranked = np.take_along_axis(cols, np.argsort(-z, axis=1, kind="stable"), axis=1)  # best first
    kept = np.arange(c)[None, :] < m[:, None]
    out = np.zeros_like(alive)
    out[np.nonzero(kept)[0], ranked[kept]] = True
    return out


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
    else:  # built outside a run (Plugins.build_policy without identities): nothing to check the file against
        log.warning(
            "policy=calibrated built without the identities of what its scores come from: calibration %s "
            "is not checked against the run's generator and reward (a run's roles pass them)",
            path,
        )
    return CalibratedPolicy(cal, float(p["delta"]), int(p["simulations"]))
