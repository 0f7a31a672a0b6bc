"""``rodeco experiment=efficiency``: Best-of-N vs Speculative Rejection at equal memory (the paper's Figure 3), on a
recorded pool (``rodeco.replays.pool``) replayed by the real loop (``rodeco.replays.replay``).

Per prompt of the run's prompts (``data``; the pool ``pool=DIR`` is recorded first where prompts are missing):

- **Best-of-N** for N = 1, 2, 4, ..., M: its expected reward is the expected best of a random size-N subset of the
  prompt's M pool candidates (``metrics.expected_best_of``, unbiased). Its cost is that of a real Best-of-N run
  replayed on disjoint groups of N candidates (averaged over ``min(bon_groups, M // N)`` groups: as many as the
  pool holds, so fewer for the largest N): one full prefill, N candidates' decode, N final rewards.
- **Speculative Rejection**: every swept method (``policy=fixed`` at each alpha, ``adaptive`` at each delta, the
  other ``policies``, and fixed alpha 0.5 from each of ``starts``) replayed under the memory that Best-of-(scale*n)
  fills at full length, for each of ``scales``, from ``replicates`` sets of pool candidates (rows drawn from
  candidates ``k``, ``k + 1``, ... with ``k = r * M / replicates``, wrapping round: another draw of the candidates,
  as another seed would give). Its cost is what the loop charged: prefill, decode, every partial and final reward
  request (each at what it cost when it was computed).

Each prompt's measurements are written to ``efficiency_prompts.jsonl`` as soon as they are done (a rerun resumes and
refuses records measured with other settings). The analysis (``analysis.py``) splits the prompts into a selection
half and a report half, chooses on the first, reports on the second with bootstrap CIs over prompts, and writes
``efficiency.json``, ``efficiency.md`` and ``efficiency.png``. Time is *modelled*: the pool's measured per-step
decode times fitted as ``a + b*rows + c*rows*context`` (``time_model``), plus measured prefill and reward seconds;
``relative_compute_*`` is the paper's memory-bound model (a decode step costs the same at any batch that fits).
Speedups clamped at an end of Best-of-N's curve are flagged as lower or upper bounds, every method is also paired
with fixed alpha 0.5 on the same resamples, and the rows nothing chooses (fixed alpha 0.5, the oracle ceilings) are
also reported over all prompts. A live check runs three policies and Best-of-n, Best-of-2n and the Best-of-N that
matches fixed alpha 0.5 for real on a few report prompts: the same winners and tokens as replayed, and measured
over modelled time per method.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from rodeco.common.budget import Budget, full_length_tokens
from rodeco.common.protocols import Policy
from rodeco.common.state import Compute, RunOutput
from rodeco.common.validation import ConfigError, check_number, check_positive_int, node_dict
from rodeco.compose import option_node
from rodeco.core.contracts import Scorer, identity_of
from rodeco.core.loop import START_BY_POLICY, LoopSettings
from rodeco.core.results import ResultsWriter
from rodeco.experiments import analysis, render
from rodeco.experiments.efficiency_judged import judge_efficiency, judges_of
from rodeco.experiments.live_check import live_check, matched_bon
from rodeco.experiments.metrics import bon_sizes
from rodeco.experiments.record import pool_dir, pool_roles, record
from rodeco.plugins import Plugins
from rodeco.replays.pool import Pool
from rodeco.replays.pool_rewards import PoolReward
from rodeco.replays.pool_session import ReplayGenerator
from rodeco.replays.replay import open_pool, replay_prompt
from rodeco.roles import ORACLE, SAME, Choices, RoleBuilder, choose_roles
from rodeco.runner import loop_settings
from rodeco.tasks import prompts_of

log = logging.getLogger(__name__)

PROMPTS_FILE = "{task}_prompts.jsonl"  # efficiency_prompts.jsonl, perplexity_prompts.jsonl


def parse_args(cfg: DictConfig) -> dict[str, Any]:
    """``experiment_args`` (keys and types checked by ``EfficiencyArgs`` at compose time) with the checks a schema
    cannot express."""
    a = node_dict(cfg.experiment_args)
    for key, example in (("n", 4), ("candidates", 128), ("bon_groups", 4), ("bootstrap", 1000), ("replicates", 2)):
        check_positive_int(f"experiment_args.{key}", a[key], example)
    if a["candidates"] < a["n"]:
        raise ConfigError(
            "experiment_args.candidates",
            a["candidates"],
            f"fewer than Best-of-n's n={a['n']}",
            "record at least n candidates per prompt, e.g. 32 * n",
        )
    if a["replicates"] > a["candidates"]:
        raise ConfigError(
            "experiment_args.replicates",
            a["replicates"],
            f"more than the pool's {a['candidates']} "
            "candidates per prompt: replicates start at offsets r * M / replicates",
            "e.g. experiment_args.replicates=2",
        )
    for x in a["alphas"]:
        check_number("experiment_args.alphas", x, 0.0, 1.0, hi_open=True, fix="rates in [0, 1), e.g. [0.5]")
    for key in ("adaptive_deltas", "calibrated_deltas"):
        for x in a[key]:
            check_number(f"experiment_args.{key}", x, 0.0, 1.0, lo_open=True, hi_open=True, fix="e.g. [0.05]")
    for x in a["starts"]:
        check_positive_int("experiment_args.starts", x, 64)
    if not a["scales"] or any(not isinstance(s, int) or s < 1 for s in a["scales"]) or 1 not in a["scales"]:
        raise ConfigError(
            "experiment_args.scales",
            a["scales"],
            "must be positive integers including 1",
            "e.g. [1, 2]: budgets of Best-of-n and Best-of-2n",
        )
    if 0.5 not in a["alphas"]:
        raise ConfigError(
            "experiment_args.alphas",
            a["alphas"],
            "fixed alpha 0.5 is missing: it is the reference the "
            "headline, gap_closed, the timings and the live check compare every method with",
            f"keep 0.5 among the rates, e.g. experiment_args.alphas={sorted({*a['alphas'], 0.5})}",
        )
    if not (a["alphas"] or a["adaptive_deltas"] or a["policies"]):
        raise ConfigError(
            "experiment_args.alphas",
            a["alphas"],
            "no Speculative Rejection method to run",
            "give alphas, adaptive_deltas or policies",
        )
    for p in a["policies"]:
        policy_start(p)
    if a["live_check"] < 0:
        raise ConfigError("experiment_args.live_check", a["live_check"], "must be >= 0", "e.g. 4, or 0 for none")
    return a


def policy_start(entry: str) -> tuple[str, int | str]:
    """An ``experiment_args.policies`` entry, ``name`` (from n=auto) or ``name@start`` (from that many rows)."""
    name, _, start = entry.partition("@")
    if not start:
        return name, "auto"
    if not (start.isdigit() and int(start) > 0):
        raise ConfigError(
            "experiment_args.policies",
            entry,
            "the start after @ must be a positive number of rows",
            "e.g. particle_filter@16, or particle_filter (from n=auto)",
        )
    return name, int(start)


@dataclass(frozen=True)
class Method:
    label: str
    policy: str
    params: dict[str, Any]
    start: int | str = "auto"  # rows at the start: a number, auto, or calibrated (the calibrated policy's choice)
    partial: str = SAME  # the partial_reward that decides: same, oracle, or a reward option


def methods(a: dict[str, Any]) -> list[Method]:
    """Every Speculative Rejection method the experiment sweeps: each policy with each partial reward (``oracle``
    rows: the ceiling of that policy and schedule), the calibrated policy from ``auto`` and ``calibrated`` starts
    (with the partial reward it was calibrated for), fixed alpha 0.5 from each of ``starts``."""
    out = []
    for part in a["partial_rewards"]:
        sfx = "" if part == SAME else f"_{part}"
        out += [Method(f"fixed_alpha_{x:g}{sfx}", "fixed", {"alpha": float(x)}, partial=part) for x in a["alphas"]]
        out += [
            Method(f"adaptive_delta_{d:g}{sfx}", "adaptive", {"delta": float(d)}, partial=part)
            for d in a["adaptive_deltas"]
        ]
        for p in a["policies"]:
            name, start = policy_start(p)
            out.append(Method(f"{name}{'' if start == 'auto' else f'_start_{start}'}{sfx}", name, {}, start, part))
        if part in (SAME, ORACLE):
            out += [Method(f"fixed_alpha_0.5_start_{k}{sfx}", "fixed", {"alpha": 0.5}, k, part) for k in a["starts"]]
    for d in a["calibrated_deltas"]:
        out += [
            Method(
                f"calibrated_delta_{d:g}" + ("" if st == "auto" else "_start_calibrated"),
                "calibrated",
                {"delta": float(d)},
                st,
            )
            for st in ("auto", "calibrated")
        ]
    return out


class Measurer:
    """Replays one prompt's methods on the pool, as the loop would run them live. Every method's roles are built
    once, by one ``RoleBuilder`` (each distinct reward node once: the methods share the pool's score caches)."""

    def __init__(
        self,
        cfg: DictConfig,
        plugins: Plugins,
        pool: Pool,
        gen: ReplayGenerator,
        builder: RoleBuilder,
        a: dict[str, Any],
    ) -> None:
        self.pool, self.gen, self.a, self.builder = pool, gen, a, builder
        self.choices = choose_roles(cfg, plugins, live=False)
        none = builder.roles(self.choices.with_(plugins, partial={"name": SAME}, policy={"name": "none"}))
        self.scorer, self.none = none.reward, none.policy  # the reward's scorer serves every method
        self.reward = self.scorer.reward  # the pool-served reward (its cache)
        self.reward_name = self.choices.reward.name
        self.base = loop_settings(cfg, gen, "", self.reward_name)
        self.methods: list[Method] = []
        self.skipped: dict[str, str] = {}  # a calibrated policy with a partial reward it has no calibration for
        self.policies: dict[str, Policy] = {}
        self.partials: dict[str, Scorer | None] = {}  # per partial reward: its scorer; None for same
        for m in methods(a):
            try:
                roles = builder.roles(self.method_choices(m, plugins))
            except ConfigError as e:
                if e.key != "policy.calibration" or m.partial == SAME:
                    raise
                log.warning("%s left out: %s", m.label, e)
                self.skipped[m.label] = str(e)
                continue
            self.methods.append(m)
            self.policies[m.label] = roles.policy
            self.partials[m.partial] = roles.partial
        self.method = {m.label: m for m in self.methods}

    def method_choices(self, m: Method, plugins: Plugins) -> Choices:
        """The run's choices with the method's partial reward and policy (their option files' parameters)."""
        part = {"name": m.partial} if m.partial in (SAME, ORACLE) else option_node("reward", m.partial, plugins)
        node = {**option_node("policy", m.policy, plugins), **m.params}  # the option file's registered name
        try:
            plugins.policies.get(node["name"])
        except ConfigError as e:  # the registry speaks of policy.name: the name came from experiment_args
            raise ConfigError("experiment_args.policies", m.policy, e.problem, e.fix) from None
        return self.choices.with_(plugins, partial=part, policy=node)

    def settings(self, policy: str, n: int | str, kv: int | None, partial: str = SAME) -> LoopSettings:
        return dataclasses.replace(
            self.base,
            n=n,
            policy_name=policy,
            all_candidates=False,
            budget=Budget(kv, self.base.budget.min_tokens_per_round),
        )

    def run(
        self, index: int, policy: Policy, name: str, n: int | str, kv: int | None, first: int = 0, partial: str = SAME
    ) -> dict:
        """One replayed run and what it cost (the time model needs the steps' rows and rows x context)."""
        res, c, reward_s = replay_prompt(
            self.pool,
            self.gen,
            self.scorer,
            policy,
            index,
            self.settings(name, n, kv, partial),
            first,
            partial=self.partials.get(partial),
        )
        assert res.best.score is not None  # the winner is a finished candidate: the reward scored it
        return {
            "best": float(res.best.score),
            "best_id": res.best.candidate_id,
            "n_start": res.n_start,
            "partial_flops": c.partial_reward_flops,
            "gen_flops": c.gen_flops,
            "reward_flops": c.reward_flops,
            "flops": c.total_flops,
            "decode_tokens": c.gen_decode_tokens,
            "steps": c.decode_steps,
            "peak_kv_tokens": c.peak_kv_tokens,
            "rows_x_context": rows_x_context(c, self.gen.shape),
            "reward_s": reward_s,
            "rounds": len(res.rounds),
        }

    def finals(self, index: int) -> list[float]:
        """Every candidate's final reward (computed on first use, like any reward request)."""
        return self.reward.score(self.pool.prompt(index).final_requests())

    def measure(self, index: int, settings: dict[str, Any]) -> dict[str, Any]:
        a, M = self.a, self.pool.candidates
        p = self.pool.prompt(index)
        L0 = len(p.prompt_ids)
        final = self.finals(index)
        rec: dict[str, Any] = {
            "prompt_index": index,
            "settings": settings,
            "L0": L0,
            "prefill_s": p.prefill_seconds,
            "budget": {},
            "bon": {},
            "methods": {},
        }
        bon = {}
        for N in bon_sizes(M):
            groups = [self.run(index, self.none, "none", N, None, g * N) for g in range(min(a["bon_groups"], M // N))]
            bon[str(N)] = {k: float(np.mean([g[k] for g in groups])) for k in groups[0] if k != "best_id"}
        rec["bon"] = bon
        rec["final"] = final
        for scale in a["scales"]:
            rec["budget"][str(scale)] = self.bon_budget(scale * a["n"], L0)
        offsets = [r * M // a["replicates"] for r in range(a["replicates"])]
        rec["methods"] = self.methods_from(index, rec["budget"], offsets[0])
        rec["replicates"] = [{"offset": k, "methods": self.methods_from(index, rec["budget"], k)} for k in offsets[1:]]
        return rec

    def bon_budget(self, rows: int, prompt_len: int) -> int:
        """The KV memory Best-of-``rows`` fills at full length, counted in the pool's engine's blocks."""
        return full_length_tokens(rows, prompt_len, self.base.max_new_tokens, self.gen.kv)

    def methods_from(self, index: int, budgets: dict[str, int], offset: int) -> dict[str, dict[str, dict]]:
        """Every method at every budget, its rows drawn from pool candidates ``offset``, ``offset + 1``, ...
        (wrapping round): ``{label: {scale: run}}``."""
        out: dict[str, dict[str, dict]] = {}
        for scale, kv in budgets.items():
            for m in self.methods:
                start = START_BY_POLICY if m.start == "calibrated" else m.start if m.start == "auto" else int(m.start)
                try:
                    r = self.run(index, self.policies[m.label], m.label, start, kv, offset, partial=m.partial)
                except ConfigError as e:  # e.g. a start of 128 rows does not fit Best-of-4's memory
                    if e.key != "n":
                        raise
                    r = {"infeasible": str(e)}
                out.setdefault(m.label, {})[scale] = r
        return out


def rows_x_context(c: Compute, shape) -> float:
    """Sum over decode steps of rows x cached tokens per row (what attention reads), from the FLOPs the loop
    counted: decode FLOPs = 2 * matmul params * tokens + 4 * layers * heads * head_dim * sum(rows x context)."""
    L0 = c.gen_prefill_tokens
    decode_flops = c.gen_flops - L0 * shape.flops_per_token(L0 // 2)
    attn = decode_flops - 2.0 * shape.n_matmul_params * c.gen_decode_tokens
    return float(attn / (4.0 * shape.n_layers * shape.n_heads * shape.head_dim))


def settings_of(cfg: DictConfig, a: dict[str, Any], pool: Pool, measurer: Measurer) -> dict[str, Any]:
    """What a prompt's measurements depend on: a resumed record must have been measured with the same (including
    what the policies and partial rewards were built from: a calibration file's, a learned head's identity)."""
    keep = (
        "n",
        "candidates",
        "alphas",
        "adaptive_deltas",
        "policies",
        "starts",
        "scales",
        "bon_groups",
        "partial_rewards",
        "calibrated_deltas",
        "replicates",
    )
    built = {
        **{k: identity_of(p) for k, p in measurer.policies.items()},
        **{f"partial_{k}": identity_of(r.reward) for k, r in measurer.partials.items() if r is not None},
    }
    return {
        **{k: a[k] for k in keep},
        "pool": pool.settings,
        "identities": {k: v for k, v in built.items() if v is not None},
        "reward": OmegaConf.to_container(cfg.reward, resolve=True),
        "max_new_tokens": cfg.sampling.max_new_tokens,
        "min_tokens_per_round": cfg.budget.min_tokens_per_round,
    }


def check_calibrated(cfg: DictConfig, plugins: Plugins, a: dict[str, Any], builder: RoleBuilder) -> dict[str, Any]:
    """The calibrated policy needs a calibration measured with this pool's generator and this reward: without one,
    the returned arguments drop its methods (``calibrated_skipped`` says why) rather than run them on a wrong
    model. ``a`` itself is left as it is."""
    if not a["calibrated_deltas"]:
        return a
    node = option_node("policy", "calibrated", plugins)
    try:
        builder.roles(choose_roles(cfg, plugins, live=False).with_(plugins, partial={"name": SAME}, policy=node))
    except ConfigError as e:
        log.warning("policy=calibrated left out: %s", e)
        return {**a, "calibrated_skipped": str(e), "calibrated_deltas": []}
    return a


def collect(
    cfg: DictConfig, plugins: Plugins, a: dict[str, Any], out_dir: Path | None, gen=None
) -> tuple[list[dict[str, Any]], Measurer]:
    """The pool (recorded where prompts are missing) and each prompt's measurements, written as they finish; the
    ``Measurer`` that took them (its ``a``: the arguments as run)."""
    from tqdm.auto import tqdm

    prompts = prompts_of(cfg.data)
    path = pool_dir(cfg, out_dir)
    record(cfg, plugins, path, prompts, a["candidates"], gen=gen)
    pool, rgen = open_pool(path)
    builder = pool_roles(cfg, plugins, pool, rgen)
    measurer = Measurer(cfg, plugins, pool, rgen, builder, check_calibrated(cfg, plugins, a, builder))
    settings = settings_of(cfg, measurer.a, pool, measurer)
    name = PROMPTS_FILE.format(task=cfg.task)
    writer = ResultsWriter(out_dir, resume=cfg.output.resume, name=name) if out_dir is not None else None
    done = _resumable(writer, settings)
    out = []
    for p in tqdm(prompts, desc="replays", unit="prompt", disable=not cfg.output.progress):
        if p.index in done:
            out.append(done[p.index])
            continue
        rec = measurer.measure(p.index, settings)
        for r in [measurer.reward, *(s.reward for s in measurer.partials.values() if s is not None)]:
            if isinstance(r, PoolReward):
                r.save()
        if writer is not None:
            writer.write(rec)
        out.append(rec)
    return out, measurer


def _resumable(writer: ResultsWriter | None, settings: dict[str, Any]) -> dict[int, dict[str, Any]]:
    if writer is None:
        return {}
    for rec in writer.records.values():
        if rec.get("settings") != settings:
            raise ConfigError(
                "output.resume",
                True,
                f"{writer.path} holds prompt {rec['prompt_index']} measured with other settings",
                "use a new hydra.run.dir, or output.resume=false to start over",
            )
    if writer.records:
        log.info("resuming: %d prompts already measured in %s", len(writer.records), writer.path)
    return dict(writer.records)


def run(cfg: DictConfig, plugins: Plugins, out_dir: str | Path | None, gen=None) -> RunOutput:
    a = parse_args(cfg)
    out_dir = Path(out_dir) if out_dir is not None else None
    prompts, measurer = collect(cfg, plugins, a, out_dir, gen=gen)
    judges = judges_of(
        cfg.get("judge"), plugins, measurer.builder, measurer.choices.reward, measurer.pool, prompts[0]["prompt_index"]
    )  # a judge that cannot apply stops here
    judged = None
    if judges:
        records = {p["prompt_index"]: p for p in prompts}
        report_half = analysis.split_halves(list(records))[1]
        judged = judge_efficiency(
            measurer.pool,
            judges,
            records,
            report_half,
            [m.label for m in measurer.methods],
            a["n"],
            a["replicates"],
            a["bootstrap"],
            cfg.seed,
        )
    res = report(cfg, plugins, prompts, measurer, out_dir, gen=gen, judged=judged)
    return RunOutput([], Compute(), out_dir, extra=res)


def timings(measurer: Measurer, records: dict[int, dict[str, Any]]) -> dict[str, float]:
    """pool_seconds (recording the prompts) and replay_seconds_per_policy (fixed alpha 0.5 at the budget of
    Best-of-n over the same prompts, its rewards cached)."""
    pool = measurer.pool
    t0 = time.perf_counter()
    for index, rec in records.items():
        measurer.run(index, measurer.policies["fixed_alpha_0.5"], "fixed_alpha_0.5", "auto", rec["budget"]["1"])
    replay_s = time.perf_counter() - t0
    pool_s = sum(pool.prompt(i).record_seconds for i in records)
    return {
        "pool_seconds": pool_s,
        "replay_seconds_per_policy": replay_s,
        "replay_fraction_of_pool": replay_s / max(pool_s, 1e-9),
    }


def report(
    cfg: DictConfig,
    plugins: Plugins,
    prompts: list[dict[str, Any]],
    measurer: Measurer,
    out_dir: Path | None,
    gen=None,
    name: str = "efficiency",
    judged: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Summary (both halves, CIs), timings, the live check, the judges' figures (``judged``: its ``judge_*`` lines
    printed before the headline), table, plot and headline lines (printed last)."""
    a, pool = measurer.a, measurer.pool
    records = {p["prompt_index"]: p for p in prompts}
    tm = analysis.TimeModel.fit(pool, list(records))
    labels = [m.label for m in measurer.methods]
    summary = analysis.summarize(prompts, a, tm, cfg.sampling.max_new_tokens, labels, seed=cfg.seed)
    res: dict[str, Any] = {
        "args": a,
        "reward": measurer.reward_name,
        "pool": str(pool.path),
        "skipped": measurer.skipped,
        "max_new_tokens": cfg.sampling.max_new_tokens,
        **summary,
        **timings(measurer, records),
    }
    if a["live_check"]:
        bon_ns = sorted({*(s * a["n"] for s in a["scales"]), matched_bon(summary, summary["M"])})
        res["live_check"] = live_check(
            cfg, plugins, pool, measurer, records, summary["halves"]["report"][: a["live_check"]], tm, bon_ns, gen
        )
    lines = judged.pop("lines") if judged else []
    if judged:
        res["judged"] = judged
    head = analysis.headline(summary)
    res["headline"] = head
    res["per_prompt"] = prompts
    if out_dir is not None:
        ResultsWriter(out_dir, resume=False).write_json(f"{name}.json", res)
        (out_dir / f"{name}.md").write_text(render.markdown(summary), encoding="utf-8")
        render.plot(
            summary,
            out_dir / f"{name}.png",
            title=f"{len(summary['halves']['report'])} report prompts, "
            f"reward {res['reward']}, {res['max_new_tokens']} new tokens, pool of {summary['M']}",
        )
    print(render.markdown(summary), end="")
    t = summary["time_model"]
    print(
        f"time model (per decode step, fitted to {t['steps']} measured steps): {t['a'] * 1e3:.2f} ms + "
        f"{t['b'] * 1e3:.3f} ms x rows + {t['c'] * 1e6:.4f} us x rows x context (R^2 {t['r2']:.3f})"
    )
    for key in ("pool_seconds", "replay_seconds_per_policy", "replay_fraction_of_pool"):
        print(f"{key}: {res[key]:.4g}")
    if "live_check" in res:
        lc = res["live_check"]
        print(f"live_vs_replay_same_winner: {lc['same_winner']}/{lc['n']}")
        print(f"live_vs_replay_same_decode_tokens: {lc['same_tokens']}/{lc['n']}")
        print(f"live_seconds_over_time_model: {lc['live_over_model_seconds']:.3f}")
        for label, x in lc["live_over_model_seconds_by_method"].items():
            print(f"live_seconds_over_time_model_{label}: {x:.3f}")
    if lines:
        print("\n".join(lines))
    print("\n".join(render.headline_lines(head)))
    return res
