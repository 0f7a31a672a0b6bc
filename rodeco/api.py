"""The Python API: the same config and code path as the CLI, composed with Hydra's compose API.

``run(cfg)`` is what ``rodeco ...`` does apart from Hydra itself: a decode, or the experiment ``cfg.task`` names.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, open_dict

from rodeco.common.budget import Budget
from rodeco.common.state import Compute, Counts, PromptRef, PromptResult, RoundView, RunOutput, SamplingParams
from rodeco.common.validation import node_dict
from rodeco.compose import check_plugin_params, load_config
from rodeco.core.config import validate
from rodeco.plugins import Plugins, default_plugins

if TYPE_CHECKING:
    from rodeco.common.protocols import Generator, Policy, Session
    from rodeco.core.loop import LoopSettings, OpenStats, Request, Source
    from rodeco.roles import Roles

__all__ = ["Decoder", "decode", "load_config", "run"]


def run(cfg: DictConfig, plugins: Plugins | None = None, out_dir: str | Path | None = None) -> RunOutput:
    """Run what ``cfg.task`` names: ``decode``, ``merge`` (the shards of a multirun), ``judge`` (score a run's or a
    pool's responses by ``cfg.judge``), or a registered experiment."""
    from rodeco.runner import run_decode

    plugins = plugins or default_plugins()
    validate(cfg)
    check_plugin_params(cfg, plugins)
    if cfg.task == "decode":
        return run_decode(cfg, plugins, out_dir)
    if cfg.task == "serve":
        from rodeco.common.validation import ConfigError

        raise ConfigError(
            "task",
            "serve",
            "the server runs from the command line or rodeco.serve",
            "run `rodeco task=serve ...`, or rodeco.serve.serve(cfg) in Python",
        )
    if cfg.task == "merge":
        from rodeco.merge import merge

        return merge(cfg, cfg.output.dir)
    if cfg.task == "judge":
        from rodeco.rejudge import judge_task

        return judge_task(cfg, plugins)
    entry = plugins.experiments.get(cfg.task)
    return entry.factory(cfg, plugins, Path(out_dir) if out_dir is not None else None)


def _compose(
    plugins: Plugins,
    overrides: list[str] | None,
    n: int | str | None,
    reward: str | None,
    policy: str | None,
    generator: str | Generator | None,
    prompts: list[str] | str | None,
    kw: dict[str, Any],
) -> DictConfig:
    """The config of a Python call: ``rodeco.decode``'s arguments as overrides, the prompts inline."""
    ov = list(overrides or [])
    ov += [f"reward={reward}"] if reward else []
    ov += [f"policy={policy}"] if policy else []
    ov += [f"generator={generator}"] if isinstance(generator, str) else []
    ov += [f"n={n}"] if n is not None else []
    cfg = load_config(ov, plugins)
    with open_dict(cfg):
        cfg.data.path, cfg.data.prompts = None, [prompts] if isinstance(prompts, str) else list(prompts or [])
        cfg.output.progress = False
        for k, v in kw.items():
            cfg[k] = v
    validate(cfg)
    return cfg


class Decoder:
    """A loaded generator and its roles, built once, decoding many calls: what a notebook or a server holds.

        dec = rodeco.Decoder(reward="minilm_rm", overrides=["sampling.max_new_tokens=64"])
        out = dec.decode(["Write a haiku about autumn."], n=16, policy="fixed")

    The generator is loaded and the reward (and partial reward) built at construction; a call may change what
    the config lets a run change (``n``, ``policy`` and its parameters, sampling, the budget, the seed, the winner
    rule) but not the generator or the reward, which would need a new ``Decoder`` (a ``ConfigError`` says so).
    Policies are built per call (they are cheap and may carry per-run state)."""

    def __init__(
        self,
        *,
        reward: str | None = None,
        generator: str | Generator | None = None,
        overrides: list[str] | None = None,
        plugins: Plugins | None = None,
        **kw: Any,
    ) -> None:
        self.plugins = plugins or default_plugins()
        self.overrides: list[str] | None = [
            *(overrides or []),
            *([f"reward={reward}"] if reward else []),
            *([f"generator={generator}"] if isinstance(generator, str) else []),
        ]
        self.kw = kw
        self._build(_compose(self.plugins, self.overrides, None, None, None, None, None, kw), generator)

    @classmethod
    def from_config(
        cls, cfg: DictConfig, plugins: Plugins | None = None, generator: Generator | None = None
    ) -> Decoder:
        """A decoder for a composed config (the CLI's, ``rodeco task=serve``); ``generator``: an already loaded one."""
        self = cls.__new__(cls)
        self.plugins, self.overrides, self.kw = plugins or default_plugins(), None, {}
        validate(cfg)
        self._build(cfg, generator)
        return self

    def _build(self, cfg: DictConfig, generator: str | Generator | None) -> None:
        from rodeco.core.loading import load_generator
        from rodeco.plugins import BuildContext
        from rodeco.roles import RoleBuilder, choose_roles

        self.cfg = cfg
        check_plugin_params(self.cfg, self.plugins)
        self.choices = choose_roles(self.cfg, self.plugins)
        self.gen = (
            generator
            if generator is not None and not isinstance(generator, str)
            else load_generator(self.cfg.generator)
        )
        ctx = BuildContext(generator=self.gen, device=str(self.gen.device), plugins=self.plugins)
        self.builder = RoleBuilder(self.plugins, self.gen.name, ctx)
        self.builder.roles(self.choices)  # the reward and partial reward, built now and reused by every call

    def decode(
        self,
        prompts: list[str] | str,
        *,
        n: int | str | None = None,
        policy: str | None = None,
        overrides: list[str] | None = None,
        out_dir: str | Path | None = None,
        **kw: Any,
    ) -> RunOutput:
        """Decode ``prompts`` as ``rodeco.decode`` would with the decoder's settings plus this call's."""
        from rodeco.common.validation import ConfigError
        from rodeco.roles import choose_roles
        from rodeco.runner import DecodeRun
        from rodeco.tasks import prompts_of

        if self.overrides is None:
            raise ConfigError(
                "Decoder.decode",
                "(a decoder made by from_config)",
                "its config was composed elsewhere, so a call's overrides cannot be composed onto it",
                "call batch() with this call's settings, or build rodeco.Decoder(overrides=[...])",
            )
        cfg = _compose(
            self.plugins, [*self.overrides, *(overrides or [])], n, None, policy, None, prompts, {**self.kw, **kw}
        )
        check_plugin_params(cfg, self.plugins)
        for key in ("generator", "reward", "partial_reward"):
            if cfg[key] != self.cfg[key]:
                raise ConfigError(
                    key,
                    str(dict(cfg[key])),
                    "a Decoder's generator and rewards are fixed when it is built",
                    f"build another rodeco.Decoder with this {key}",
                )
        roles = self.builder.roles(choose_roles(cfg, self.plugins))
        return DecodeRun(
            cfg, self.plugins, self.gen, roles, prompts_of(cfg.data), out_dir if out_dir is not None else cfg.output.dir
        ).run()

    def _settings(
        self,
        policy: dict[str, Any] | None,
        n: int,
        sampling: SamplingParams | None,
        max_new_tokens: int | None,
        kv_tokens: int | None,
        stop: Sequence[str],
        all_candidates: bool,
        check_tokens: int | None = None,
    ) -> tuple[LoopSettings, Roles]:
        """A call's loop settings, the decoder's with this call's in their place, and its roles (``policy``: a
        policy node, None: the decoder's)."""
        from rodeco.runner import loop_settings

        choices = self.choices.with_(self.plugins, policy=policy) if policy is not None else self.choices
        s = loop_settings(self.cfg, self.gen, choices.policy.name, choices.reward.name)
        s = replace(
            s,
            n=n,
            all_candidates=all_candidates,
            stop=tuple(stop),
            check_tokens=check_tokens,
            sampling=sampling or s.sampling,
            max_new_tokens=max_new_tokens or s.max_new_tokens,
            budget=s.budget if kv_tokens is None else Budget(kv_tokens, s.budget.min_tokens_per_round),
        )
        return s, self.builder.roles(choices)

    def batch(
        self,
        prompts: Sequence[PromptRef],
        *,
        n: int,
        policy: dict[str, Any] | None = None,
        sampling: SamplingParams | None = None,
        max_new_tokens: int | None = None,
        kv_tokens: int | None = None,
        stop: Sequence[str] = (),
        check_tokens: int | None = None,
        all_candidates: bool = True,
        on_done: Callable[[PromptResult], None] | None = None,
        on_round: Callable[[RoundView, list[Counts]], None] | None = None,
        cancelled: Callable[[Session], Collection[int]] | None = None,
        wrap_policy: Callable[[Policy], Policy] | None = None,
    ) -> tuple[list[PromptResult], Compute]:
        """Decode ``prompts`` (``PromptRef``s: each its own index, stream key and seed) as one batch with this call's
        settings, composing no config. ``policy`` is a policy node (``{"name": "fixed", "alpha": 0.5}``; None: the
        decoder's), ``sampling``/``max_new_tokens``/``stop`` replace the decoder's, ``kv_tokens`` is the batch's
        budget (None: the decoder's). ``cancelled`` and ``check_tokens``: see ``rodeco.core.loop.decode_batch``, which
        this calls with the decoder's reward and partial reward; ``wrap_policy`` wraps the built policy. The call is a
        run to the decoder's plugins: ``rodeco_run_start`` (the decoder's config with this call's settings), then
        ``rodeco_round_end`` and ``rodeco_prompt_done`` from the loop, then ``rodeco_run_end``."""
        from rodeco.core.loop import decode_batch

        s, roles = self._settings(policy, n, sampling, max_new_tokens, kv_tokens, stop, all_candidates, check_tokens)
        self.plugins.run_start(config=_call_config(self.cfg, s, roles, kv_tokens), n_prompts=len(prompts))
        results, compute = decode_batch(
            self.gen,
            roles.reward,
            wrap_policy(roles.policy) if wrap_policy is not None else roles.policy,
            prompts,
            s,
            on_round=on_round,
            on_done=on_done,
            partial=roles.partial,
            cancelled=cancelled,
            hooks=self.plugins,
        )
        self.plugins.run_end(results=results, compute=compute)
        return results, compute

    def request(
        self,
        prompts: Sequence[PromptRef],
        *,
        n: int,
        on_done: Callable[[PromptResult], None],
        policy: dict[str, Any] | None = None,
        sampling: SamplingParams | None = None,
        max_new_tokens: int | None = None,
        kv_tokens: int | None = None,
        stop: Sequence[str] = (),
        all_candidates: bool = True,
        wrap_policy: Callable[[Policy], Policy] | None = None,
        **callbacks: Any,
    ) -> Request:
        """A cohort for ``serve_open``: ``prompts`` admitted together with this call's settings, as ``batch`` takes
        them (``kv_tokens``: their budget); ``callbacks``: ``Request``'s ``on_round``, ``on_admit``, ``on_error`` and
        ``cancelled``. A server's request is a cohort of one prompt."""
        from rodeco.core.loop import Request

        s, roles = self._settings(policy, n, sampling, max_new_tokens, kv_tokens, stop, all_candidates)
        built = roles.policy
        return Request(prompts, s, wrap_policy(built) if wrap_policy is not None else built, on_done, **callbacks)

    def serve_open(self, source: Source, *, kv_tokens: int | None, check_tokens: int = 16, **kw: Any) -> OpenStats:
        """Decode the requests ``source`` gives (``request``) as they arrive, each joining the running batch on its
        own clock, until it closes (``rodeco.core.loop.decode_open``, with the decoder's reward and partial reward, its
        plugins' ``rodeco_round_end`` and ``rodeco_prompt_done`` fired by the loop); ``kv_tokens``: what the running
        requests' budgets may add up to. It fires no ``run_start`` or ``run_end``: its caller (the server) says
        where its run starts and ends."""
        from rodeco.core.contracts import policy_info
        from rodeco.core.loop import decode_open
        from rodeco.core.rounds import top_logprobs_read
        from rodeco.runner import loop_settings

        roles = self.builder.roles(self.choices)
        s = loop_settings(self.cfg, self.gen, self.choices.policy.name, self.choices.reward.name)
        info = policy_info(roles.policy, s.policy_name)  # the session records what the decoder's own policy reads
        kw.setdefault("top_logprobs", top_logprobs_read(s, info))
        return decode_open(
            self.gen, roles.reward, source, kv_tokens, roles.partial, check_tokens, hooks=self.plugins, **kw
        )

    def budget(self) -> Budget:
        """The decoder's budget (its config's ``budget`` on its generator)."""
        from rodeco.core.config import make_budget

        return make_budget(self.cfg, self.gen)


def _call_config(cfg: DictConfig, s: LoopSettings, roles: Roles, kv_tokens: int | None) -> dict[str, Any]:
    """A ``Decoder.batch`` call's run config as ``rodeco_run_start`` sees it: the decoder's ``cfg`` with the call's
    ``n``, policy node, sampling, stop strings, candidates and budget (where it gave one) in their place."""
    config = node_dict(cfg)
    config["n"] = s.n
    config["policy"] = {"name": roles.choices.policy.name, **roles.choices.policy.params}
    config["sampling"] = {
        **config["sampling"],
        **asdict(s.sampling),
        "max_new_tokens": s.max_new_tokens,
        "stop": list(s.stop),
    }
    config["output"] = {**config["output"], "all_candidates": s.all_candidates}
    if kv_tokens is not None:
        config["budget"] = {**config["budget"], "kv_tokens": kv_tokens}
    return config


def decode(
    prompts: list[str] | str,
    *,
    n: int | str | None = None,
    reward: str | None = None,
    policy: str | None = None,
    generator: str | Generator | None = None,
    overrides: list[str] | None = None,
    out_dir: str | Path | None = None,
    plugins: Plugins | None = None,
    **kw: Any,
) -> RunOutput:
    """Decode ``prompts`` and return a ``RunOutput`` (``.results``: one ``PromptResult`` per prompt).

    ``reward``/``policy`` pick config group options (``"logprob"``, ``"fixed"``, ...); ``generator`` is either a
    config option name or an already loaded generator (``rodeco.common.protocols.Generator``: a
    ``rodeco.core.generator.TorchGenerator``, vLLM's); ``overrides`` are Hydra overrides;
    keyword arguments set top-level keys (``seed=1``). With ``out_dir``, results are also written there.
    """
    from rodeco.runner import run_decode

    plugins = plugins or default_plugins()
    cfg = _compose(plugins, overrides, n, reward, policy, generator, prompts, kw)
    gen = generator if generator is not None and not isinstance(generator, str) else None
    return run_decode(cfg, plugins, out_dir, gen=gen)
