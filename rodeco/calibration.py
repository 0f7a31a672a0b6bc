"""How predictive a partial scorer is of the final reward at each decision length: a calibration file, measured by
``rodeco experiment=calibrate`` on a pool of *training* prompts and read by the ``calibrated`` policy.

Model: within one prompt, standardize the active candidates' partial scores (``z``) and their final rewards; the
standardized final score of a candidate is ``rho(L) * z + eps`` with ``eps ~ N(0, sd(L)^2)``, ``L`` the tokens
generated. ``rho`` and ``sd`` are the pooled regression slope and residual spread over the calibration prompts,
interpolated in ``log L`` between the measured lengths (held constant outside them).

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

from rodeco.results import atomic_write
from rodeco.validation import ConfigError

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
    source: dict[str, Any] = field(default_factory=dict)  # pool, prompts, candidates, command
    format: int = FORMAT

    @classmethod
    def load(cls, path: str | Path, key: str = "policy.calibration") -> Calibration:
        f = Path(path)
        if not f.is_file():
            raise ConfigError(key, str(path), "no calibration file there",
                              "measure one: rodeco experiment=calibrate pool=TRAINING_POOL (see docs/results.md)")
        d = json.loads(f.read_text(encoding="utf-8"))
        if d.get("format") != FORMAT:
            raise ConfigError(key, str(path), f"calibration format {d.get('format')}, this rodeco reads {FORMAT}",
                              "measure it again with rodeco experiment=calibrate")
        return cls(**d)

    def save(self, path: str | Path) -> None:
        atomic_write(path, json.dumps(asdict(self), indent=1) + "\n")

    def check(self, run: dict[str, str], key: str = "policy.calibration") -> None:
        """The run's identities (``identities``) must be the ones this calibration was measured with."""
        diff = [k for k in IDENTITY_KEYS if k in run and run[k] != getattr(self, k)]
        if diff:
            both = "; ".join(f"{k}: the file's {getattr(self, k)!r}, the run's {run[k]!r}" for k in diff)
            raise ConfigError(key, self.source.get("path", "?"), f"measured with another {', '.join(diff)} ({both})",
                              "measure a calibration for this run: rodeco experiment=calibrate pool=TRAINING_POOL "
                              "with the run's generator, reward and partial_reward, and pass its file")

    def _at(self, values: list[float], length: int) -> float:
        x = np.log(np.asarray(self.lengths, dtype=np.float64))
        return float(np.interp(math.log(max(1, length)), x, np.asarray(values, dtype=np.float64)))

    def rho(self, length: int) -> float:
        return min(1.0, max(0.0, self._at(self.slope, length)))

    def sd(self, length: int) -> float:
        return max(0.0, self._at(self.resid_sd, length))


def identities(generator: str, reward: tuple[str, str | None], partial: tuple[str, str | None] | None) -> dict[str, str]:
    """What a calibration is tied to: the generator's model name, and each scorer's name with its identity (e.g. a
    trained head's hash), the partial scorer being the reward itself for ``partial_reward=same``."""
    def ident(x: tuple[str, str | None]) -> str:
        return x[0] if not x[1] else f"{x[0]}:{x[1]}"

    return {"generator": generator, "reward": ident(reward), "partial_reward": ident(partial or reward)}


def standardize(x: np.ndarray) -> np.ndarray:
    sd = x.std()
    return (x - x.mean()) / sd if sd > 0 else np.zeros_like(x)


def keep_probability(z: np.ndarray, rho: float, sd: float) -> np.ndarray:
    """P(row i's final score ends above the best row's), under ``final = rho * z + eps``: the gap between two rows'
    finals is ``rho * (z_i - z_max)`` with spread ``sd * sqrt(2)``."""
    mu = rho * z
    gap = mu - mu.max()
    if sd <= 0:
        return (gap >= 0).astype(np.float64)
    from scipy.special import ndtr

    return ndtr(gap / (sd * math.sqrt(2.0)))
