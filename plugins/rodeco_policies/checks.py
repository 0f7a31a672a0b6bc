"""Checking policy parameters: errors name the config key, the value and the fix."""

from __future__ import annotations

import math
from typing import Any

from rodeco.errors import ConfigError


def check_number(key: str, value: Any, lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False,
                 fix: str) -> float:
    """``value`` as a float if it lies in the interval, else a ``ConfigError`` naming ``key`` and ``fix``."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
    ok = ok and (value > lo if lo_open else value >= lo) and (value < hi if hi_open else value <= hi)
    if not ok:
        rng = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        raise ConfigError(key, value, f"must be a number in {rng}", fix)
    return float(value)
