"""rodeco's built-in experiments, registered through the ``rodeco_register_experiments`` hook (entry point
``experiments`` of group ``rodeco``) like any plugin's. Each runs as ``rodeco experiment=NAME``; its
``experiment_args`` schema is in ``args.py``, its values in ``conf/experiment/NAME.yaml``. The benchmarks run
from the command line (``scripts/NAME.py``) are the modules of ``bench/``; all share ``bootstrap`` and ``speedup``."""

from __future__ import annotations

from collections.abc import Callable

from rodeco.common.hookspecs import hookimpl
from rodeco.experiments.args import (
    CalibrateArgs,
    CorrelationArgs,
    EfficiencyArgs,
    EngineBenchArgs,
    PoolArgs,
    ReplayArgs,
)


@hookimpl
def rodeco_register_experiments(register: Callable[..., None]) -> None:
    from rodeco.experiments import calibrate, correlation, efficiency, engine_bench, perplexity, record, replay_policy

    register("pool", record.run, "record M candidates per prompt into a pool directory, for replay", args=PoolArgs)
    register("replay", replay_policy.run, "a policy replayed over a recorded pool by the real loop", args=ReplayArgs)
    register(
        "engine_bench",
        engine_bench.run,
        "rodeco's loop vs model.generate() on the same model: the speedup",
        args=EngineBenchArgs,
    )
    register(
        "correlation",
        correlation.run,
        "partial vs final reward correlation by decision length (Appendix B)",
        args=CorrelationArgs,
    )
    register(
        "calibrate",
        calibrate.run,
        "how predictive partial scores are by decision length: a calibration file",
        args=CalibrateArgs,
    )
    register(
        "efficiency",
        efficiency.run,
        "Best-of-N vs Speculative Rejection at equal memory (Figure 3)",
        args=EfficiencyArgs,
    )
    register(
        "perplexity",
        perplexity.run,
        "lowest perplexity: Best-of-N vs Speculative Rejection (Table 2)",
        args=EfficiencyArgs,
    )
