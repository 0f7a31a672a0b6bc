"""rodeco's built-in rewards, registered through the ``rodeco`` entry-point group like any third-party plugin."""

from __future__ import annotations

from rodeco.hookspecs import hookimpl
from rodeco_rewards.logprob import build_logprob


@hookimpl
def rodeco_register_rewards(register):
    register("logprob", build_logprob, "mean token log-probability of the response under the generator")
