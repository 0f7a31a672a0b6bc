"""How predictive a partial scorer is of the final reward at each decision length: a calibration file, measured by
``rodeco experiment=calibrate`` on a pool of *training* prompts and read by the ``calibrated`` policy.

Model: within one prompt, standardize the active candidates' partial scores (``z``) and their final rewards; the
standardized final score of a candidate is ``rho(L) * z + eps`` with ``eps ~ N(0, sd(L)^2)``, ``L`` the tokens
generated. ``rho`` and ``sd`` are the pooled regression slope and residual spread over the calibration prompts,
interpolated in ``log L`` between the measured lengths (held constant outside them). ``final_offset`` and
``final_spread`` say where the finals themselves sit against the partial scores (what puts an already finished
candidate's final on the standardized scale); files measured before they existed lack them.

A file names the generator, the partial scorer and the reward it was measured with; ``Calibration.check`` refuses
a run with any other (``ConfigError`` naming both).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rodeco.common.validation import ConfigError
from rodeco.core.results import atomic_write

FORMAT = 1
IDENTITY_KEYS = ("generator", "partial_reward", "reward")


@dataclass
class Calibration:
    generator: str  # what the identities are: see ``identities``
    partial_reward: str
    reward: str
    lengths: list[int]  # decision lengths measured (tokens generated)
    slope: list[float]  # regression of the standardized final on the standardized partial score, per length
    resid_sd: list[float]  # its residual spread
    pearson: list[float] = field(default_factory=list)  # mean per-prompt Pearson (and its bootstrap CI)
    pearson_ci: list[list[float]] = field(default_factory=list)
    kendall: list[float] = field(default_factory=list)  # mean per-prompt Kendall tau
    top_k: dict[str, list[float]] = field(default_factory=dict)  # k -> P(the eventual best is in the top k)
    n_prompts: list[int] = field(default_factory=list)  # prompts with >= 3 active candidates, per length
    # where the finals sit against the partial scores, within a prompt, per length (mean over prompts): their mean
    # above the partial scores' mean, and their spread, both in partial-score spreads (empty: not measured)
    final_offset: list[float] = field(default_factory=list)
    final_spread: list[float] = field(default_factory=list)
    source: dict[str, Any] = field(default_factory=dict)  # pool, prompts, candidates, command
    format: int = FORMAT

    @classmethod
    def load(cls, path: str | Path, key: str = "policy.calibration") -> Calibration:
        f = Path(path)
        if not f.is_file():
            raise ConfigError(
                key,
                str(path),
                "no calibration file there",
                "measure one: rodeco experiment=calibrate pool=TRAINING_POOL (see docs/results.md)",
            )
        d = json.loads(f.read_text(encoding="utf-8"))
        if d.get("format") != FORMAT:
            raise ConfigError(
                key,
                str(path),
                f"calibration format {d.get('format')}, this rodeco reads {FORMAT}",
                "measure it again with rodeco experiment=calibrate",
            )
        return cls(**d)

    def save(self, path: str | Path) -> None:
        atomic_write(path, json.dumps(asdict(self), indent=1) + "\n")

    def check(self, run: dict[str, str], key: str = "policy.calibration") -> None:
        """The run's identities (``identities``) must be the ones this calibration was measured with."""
        diff = [k for k in IDENTITY_KEYS if k in run and run[k] != getattr(self, k)]
        if diff:
            both = "; ".join(f"{k}: the file's {getattr(self, k)!r}, the run's {run[k]!r}" for k in diff)
            raise ConfigError(
                key,
                self.source.get("path", "?"),
                f"measured with another {', '.join(diff)} ({both})",
                "measure a calibration for this run: rodeco experiment=calibrate pool=TRAINING_POOL "
                "with the run's generator, reward and partial_reward, and pass its file",
            )

    def _at(self, values: list[float], length: int) -> float:
        x = np.log(np.asarray(self.lengths, dtype=np.float64))
        return float(np.interp(math.log(max(1, length)), x, np.asarray(values, dtype=np.float64)))

    def rho(self, length: int) -> float:
        return min(1.0, max(0.0, self._at(self.slope, length)))

    def sd(self, length: int) -> float:
        return max(0.0, self._at(self.resid_sd, length))

    def final_link(self, length: int) -> tuple[float, float] | None:
        """(offset, spread) of the finals against the partial scores at ``length``, in partial-score spreads: a
        final ``F`` of a prompt whose partial scores have mean ``m`` and spread ``s`` at this length is
        ``(F - m - offset * s) / (spread * s)`` on the standardized final scale. None where not measured."""
        if len(self.final_offset) != len(self.lengths) or len(self.final_spread) != len(self.lengths):
            return None
        spread = self._at(self.final_spread, length)
        return (self._at(self.final_offset, length), spread) if spread > 0 else None


def identities(
    generator: str, reward: tuple[str, str | None], partial: tuple[str, str | None] | None
) -> dict[str, str]:
    """What a calibration is tied to: the generator's model name, and each scorer's name with its identity (e.g. a
    trained head's hash), the partial scorer being the reward itself for ``partial_reward=same``."""

    def ident(x: tuple[str, str | None]) -> str:
        return x[0] if not x[1] else f"{x[0]}:{x[1]}"

    return {"generator": generator, "reward": ident(reward), "partial_reward": ident(partial or reward)}


def standardize(x: np.ndarray) -> np.ndarray:
    sd = x.std()
    return (x - x.mean()) / sd if sd > 0 else np.zeros_like(x)


def best_probability(mu: np.ndarray, sd: float, best: float | np.ndarray = -math.inf, grid: int = 91) -> np.ndarray:
    """P(row ``i``'s final is the eventual best), for independent finals ``N(mu_i, sd^2)`` competing with each other
    and with a known final ``best`` (a finished candidate's; ``-inf``: none):
    ``P_i = integral over x > best of N(x; mu_i, sd^2) * prod_{j != i} Phi((x - mu_j) / sd) dx``, by the trapezoid
    rule on ``grid`` points over ``max(mu) +- 6 sd`` (outside it the integrand is below 1e-9; the result is within
    2e-4 of the exact value). The ``P_i`` sum to the chance that some row beats ``best`` (1 without one). With
    ``sd = 0`` the rows tied at the top share it, if they are not below ``best``. ``mu`` is ``[..., k]`` (leading axes:
    independent prompts, ``best`` one per prompt, computed a chunk at a time); deterministic, ``O(k * grid)`` per
    prompt."""
    mu = np.asarray(mu, dtype=np.float64)  # [..., k]
    top = mu.max(axis=-1)  # [...]
    best = np.broadcast_to(np.asarray(best, dtype=np.float64), top.shape)
    if sd <= 1e-12 * (1.0 + float(np.max(np.abs(top)))):
        win = (mu == top[..., None]) & (top >= best)[..., None]
        return win / np.maximum(1, win.sum(axis=-1, keepdims=True))
    flat, b = mu.reshape(-1, mu.shape[-1]), best.reshape(-1)  # [B, k], [B]
    chunk = max(1, (1 << 20) // (flat.shape[1] * grid))  # about 8 MB per intermediate array
    out = [_best_probability(flat[i : i + chunk], sd, b[i : i + chunk], grid) for i in range(0, len(flat), chunk)]
    return np.concatenate(out).reshape(mu.shape)


def _best_probability(mu: np.ndarray, sd: float, best: np.ndarray, grid: int) -> np.ndarray:
    from scipy.special import ndtr

    top = mu.max(axis=-1)  # [B]
    lo, hi = np.maximum(best, top - 6.0 * sd), top + 6.0 * sd
    step = np.maximum(hi - lo, 0.0) / (grid - 1)
    x = lo[:, None] + step[:, None] * np.arange(grid)  # [B, G]
    t = (x[:, None, :] - mu[:, :, None]) / sd  # [B, k, G]; every t >= -6 (x >= max(mu) - 6 sd): no underflow
    cdf = ndtr(t)
    integrand = np.exp(-0.5 * t * t) / (sd * math.sqrt(2.0 * math.pi)) * cdf.prod(axis=1, keepdims=True) / cdf
    return (integrand.sum(axis=-1) - 0.5 * (integrand[..., 0] + integrand[..., -1])) * step[:, None]


def rejectable(p: np.ndarray, delta: float) -> np.ndarray | int:
    """How many of the least likely rows can be rejected together while the chance that the eventual best is among
    them (the sum of their ``p``, over the last axis) stays at most ``delta``."""
    mass = np.cumsum(np.sort(np.asarray(p, dtype=np.float64), axis=-1), axis=-1)
    n = np.sum(mass <= delta, axis=-1)
    return int(n) if np.ndim(n) == 0 else n
