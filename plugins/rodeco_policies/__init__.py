"""rodeco's built-in rejection and search policies, registered through the ``rodeco`` entry-point group like any
third-party
plugin, with their config options (``conf/policy``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rodeco import hookimpl
from rodeco_policies.adaptive import AdaptiveParams, build_adaptive
from rodeco_policies.allocate import AllocateParams, build_allocate
from rodeco_policies.basic import FixedParams, NoneParams, build_fixed, build_none
from rodeco_policies.calibrated import CalibratedParams, build_calibrated
from rodeco_policies.correlation import CorrelationParams, build_correlation
from rodeco_policies.deepconf import DeepConfParams, build_deepconf
from rodeco_policies.search import (
    BeamParams,
    DVTSParams,
    ParticleFilterParams,
    build_beam,
    build_dvts,
    build_particle_filter,
)

CONF_DIR = Path(__file__).parent / "conf"


@hookimpl
def rodeco_register_policies(register: Callable[..., None]) -> None:
    register(
        "none", build_none, "Best-of-N: never reject (the budget must hold every row to the end)", params=NoneParams
    )
    register(
        "fixed",
        build_fixed,
        "Speculative Rejection: reject the lowest-scoring alpha fraction per prompt",
        params=FixedParams,
    )
    register(
        "adaptive",
        build_adaptive,
        "per prompt, keep rows whose estimated chance to finish above the best exceeds delta",
        params=AdaptiveParams,
    )
    register(
        "correlation",
        build_correlation,
        "rejection rate from the Kendall tau between consecutive decision points' scores",
        params=CorrelationParams,
    )
    register(
        "calibrated",
        build_calibrated,
        "reject rows unlikely to be the eventual best under a calibration of partial scores by decision length",
        params=CalibratedParams,
    )
    register(
        "allocate",
        build_allocate,
        "calibrated, with a batch's forced rejections taken from the prompts whose leader is clearest",
        params=AllocateParams,
    )
    register(
        "particle_filter",
        build_particle_filter,
        "particle filtering: resample rows in proportion to softmax(score / temperature), copies included",
        params=ParticleFilterParams,
    )
    register(
        "beam",
        build_beam,
        "reward-guided beam search: the top beam_width rows, each expanded into n / beam_width rows",
        params=BeamParams,
    )
    register(
        "deepconf",
        build_deepconf,
        "DeepConf online: stop rows whose lowest group confidence falls below a warm-up percentile; confidence vote",
        params=DeepConfParams,
    )
    register(
        "dvts",
        build_dvts,
        "diverse verifier tree search: n / beam_width independent beams of width 1",
        params=DVTSParams,
    )


@hookimpl
def rodeco_config_dirs() -> list[str]:
    return [str(CONF_DIR)]  # policy/*.yaml
