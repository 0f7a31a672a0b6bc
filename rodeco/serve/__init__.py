"""``rodeco task=serve``: Best-of-N and Speculative Rejection behind an OpenAI-compatible HTTP API (docs/serve.md).

A thin layer over ``rodeco.Decoder``: the generator, the reward and the partial reward are loaded and built once at
start-up; the requests join one open batch (``Decoder.serve_open``), each a cohort with its policy built from its
choice among ``serve.policies``. Layers: ``schema`` (request bodies), ``jobs`` (a request checked and made a job),
``scheduler`` (the batcher thread), ``app`` (HTTP), ``metrics``.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import threading
import time
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rodeco.api import Decoder
from rodeco.common.protocols import Generator
from rodeco.common.validation import ConfigError, node_dict
from rodeco.core.config import SamplingConfig, ServeConfig
from rodeco.plugins import Plugins, default_plugins
from rodeco.serve.app import State, make_app
from rodeco.serve.jobs import REJECTION_STARTS, Planner
from rodeco.serve.metrics import Metrics
from rodeco.serve.scheduler import Scheduler

__all__ = ["build_state", "check_binding", "serve"]

log = logging.getLogger(__name__)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def api_key(cfg: DictConfig) -> str | None:
    return cfg.serve.api_key or os.environ.get("RODECO_API_KEY") or None


def check_binding(cfg: DictConfig) -> None:
    """With no key, loopback only; off loopback without a key needs ``serve.allow_public_without_key`` (warned)."""
    s = cfg.serve
    if api_key(cfg) is None and not is_loopback(s.host):
        if not s.allow_public_without_key:
            raise ConfigError(
                "serve.host",
                s.host,
                "binding off loopback with no API key would let anyone on the network decode",
                "set serve.api_key (or RODECO_API_KEY), bind to 127.0.0.1, or set serve.allow_public_without_key=true",
            )
        log.warning("serving on %s with no API key: anyone who reaches it can use it", s.host)


def check_serve(cfg: DictConfig, plugins: Plugins) -> dict[str, dict[str, Any]]:
    """The ``serve`` node's values, each error naming its key and fix; returns the policies offered (``offered``)."""
    s = cfg.serve
    for key in (
        "port",
        "best_of",
        "max_best_of",
        "max_tokens",
        "max_queue",
        "batch_requests",
        "max_batch_rows",
        "check_tokens",
        "max_body_bytes",
        "reward_threads",
    ):
        v = s[key]
        if not isinstance(v, int) or v < (0 if key == "port" else 1):
            raise ConfigError(f"serve.{key}", v, "must be a positive whole number", f"set serve.{key} to e.g. 16")
    if not 0 < s.request_memory <= 1:
        raise ConfigError("serve.request_memory", s.request_memory, "must be in (0, 1]", "set it to e.g. 0.25")
    if s.rejection_start not in REJECTION_STARTS:
        raise ConfigError(
            "serve.rejection_start", s.rejection_start, "unknown", f"use one of {', '.join(REJECTION_STARTS)}"
        )
    if s.decode_threads is not None and not (isinstance(s.decode_threads, int) and s.decode_threads >= 1):
        raise ConfigError(
            "serve.decode_threads", s.decode_threads, "must be a positive whole number or null", "set it to e.g. 1"
        )
    if s.latency_target is not None and not (isinstance(s.latency_target, (int, float)) and s.latency_target > 0):
        raise ConfigError(
            "serve.latency_target", s.latency_target, "must be a number of seconds > 0", "set it to e.g. 60, or null"
        )
    if cfg.winner.stop is not None:
        raise ConfigError(
            "winner.stop",
            cfg.winner.stop,
            "a settled vote stops a prompt's rows, and a request's n choices need n finished candidates",
            "serve with winner.stop=null (the default)",
        )
    if s.best_of > s.max_best_of:
        raise ConfigError(
            "serve.best_of",
            s.best_of,
            f"above serve.max_best_of={s.max_best_of}",
            "lower it or raise serve.max_best_of",
        )
    return offered(s.policies, plugins)


def offered(policies: Any, plugins: Plugins) -> dict[str, dict[str, Any]]:
    """``serve.policies`` (``[{name: OPTION, PARAM: [lo, hi] or {choices: [...]}}, ...]``) as option name -> the
    ranges of the parameters a request may set, each checked."""
    from rodeco.compose import option_file

    items = OmegaConf.to_container(policies, resolve=True) if not isinstance(policies, list) else policies
    if not items:
        raise ConfigError(
            "serve.policies", items, "no policy offered", "offer one, e.g. 'serve.policies=[{name: fixed}]'"
        )
    out: dict[str, dict[str, Any]] = {}
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ConfigError(
                f"serve.policies[{i}]",
                item,
                "each entry is {name: OPTION, PARAM: RANGE, ...}",
                "e.g. 'serve.policies=[{name: fixed, alpha: [0.0, 0.9]}, {name: none}]'",
            )
        name = item["name"]
        if option_file("policy", name, plugins) is None and name not in plugins.policies.names():
            raise ConfigError(
                f"serve.policies[{i}].name", name, "no such policy option", f"use one of {plugins.policies.names()}"
            )
        ranges = {k: v for k, v in item.items() if k != "name"}
        for k, spec in ranges.items():
            ok = (isinstance(spec, dict) and isinstance(spec.get("choices"), list)) or (
                isinstance(spec, list)
                and len(spec) == 2
                and all(isinstance(x, (int, float)) for x in spec)
                and spec[0] <= spec[1]
            )
            if not ok:
                raise ConfigError(
                    f"serve.policies[{i}].{k}",
                    spec,
                    "a parameter's range is [lo, hi] or {choices: [...]}",
                    f"e.g. {{name: {name}, {k}: [0.0, 0.9]}}",
                )
        out[name] = ranges
    return out


def typed(cfg: DictConfig) -> tuple[ServeConfig, SamplingConfig]:
    """The ``serve`` and ``sampling`` nodes as their schema's dataclasses (what the server reads them through)."""

    def as_(kind: type, node: Any) -> Any:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(kind), node))

    return as_(ServeConfig, cfg.serve), as_(SamplingConfig, cfg.sampling)


def build_state(cfg: DictConfig, plugins: Plugins | None = None, generator: Generator | None = None) -> State:
    """The server's state from a composed config: the decoder built once, the batcher started."""
    plugins = plugins or default_plugins()
    check_binding(cfg)
    policies = check_serve(cfg, plugins)
    dec = Decoder.from_config(cfg, plugins, generator=generator)
    serve_cfg, sampling = typed(cfg)
    model = serve_cfg.model or dec.gen.name
    metrics = Metrics()
    scheduler = Scheduler(dec, serve_cfg, metrics)
    default = node_dict(cfg.policy)
    roles = dec.builder.roles(dec.choices)  # built once: the decoder's own
    needs = tuple(dict.fromkeys(f for sc in (roles.reward, roles.partial) if sc is not None for f in sc.needs_meta))
    planner = Planner(dec.gen, serve_cfg, policies, default, scheduler.budget, sampling, plugins, model, needs)
    scheduler.start()
    return State(planner, scheduler, metrics, serve_cfg, api_key(cfg), model)


def serve(cfg: DictConfig, plugins: Plugins | None = None, generator: Generator | None = None) -> None:
    """Run the server until SIGTERM or SIGINT: then new requests get 503, in-flight ones finish within
    ``serve.drain_timeout_s`` (the rest are cancelled), and the process exits."""
    import uvicorn

    state = build_state(cfg, plugins, generator)
    config = uvicorn.Config(
        make_app(state),
        host=state.serve.host,
        port=state.serve.port,
        log_level="info",
        timeout_graceful_shutdown=5,
        lifespan="off",
    )
    server = draining_server(config, state)
    log.info(
        "rodeco serves %s on http://%s:%d (policies: %s)",
        state.model,
        state.serve.host,
        state.serve.port,
        ", ".join(state.planner.offered),
    )
    server.run()
    state.scheduler.stop("the server stopped")


def draining_server(config: Any, state: State) -> Any:
    """uvicorn's server with rodeco's shutdown: the first SIGTERM/SIGINT starts a drain (new requests 503, in-flight
    ones finish within ``serve.drain_timeout_s``), then the server exits; a second SIGINT exits at once. (uvicorn is
    imported here, when a server starts.)"""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if state.draining:
                if sig == signal.SIGINT:
                    super().handle_exit(sig, frame)
                return
            log.warning(
                "%s: draining (new requests get 503; %d in flight get %.0f s)",
                signal.Signals(sig).name,
                state.scheduler.in_flight(),
                state.serve.drain_timeout_s,
            )
            state.draining = True
            state.scheduler.close()
            threading.Thread(target=self._drain, name="rodeco-drain", daemon=True).start()

        def _drain(self) -> None:
            end = time.monotonic() + state.serve.drain_timeout_s
            while state.scheduler.in_flight() and time.monotonic() < end:
                time.sleep(0.05)
            if state.scheduler.in_flight():
                log.warning("drain timeout: cancelling %d request(s)", state.scheduler.in_flight())
            state.scheduler.stop("the server is shutting down")
            time.sleep(0.2)  # let the last answers go out
            self.should_exit = True

    return DrainingServer(config)
