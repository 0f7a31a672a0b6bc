"""Gold accuracy against FLOPs on reasoning-gym tasks: every method replayed over one recorded pool per task, each
winner checked by the task's own checker (``judge=gold``), which no method sees.

Five steps, each resumable (results are written per problem as they finish)::

    python scripts/gold_bench.py select --out runs/gold        # candidate tasks on selection seeds: which to keep
    python scripts/gold_bench.py record --out runs/gold        # the report pools: 150 problems x 32 candidates a task
    python scripts/gold_bench.py run --out runs/gold           # every method x guide replayed over the pools
    python scripts/gold_bench.py search --out runs/gold --limit 24  # beam, dvts, particle filter, live
    python scripts/gold_bench.py report --out runs/gold --snapshot docs/data/gold_rg.json.gz

**Selection.** Each candidate task (``CANDIDATES``: easy settings) is recorded on a selection seed (``SELECT_SEED``,
the report problems held out). A task is eligible when a sample's mean gold accuracy is above 0 and at most 0.5 and
any-of-16 at least twice it (room for a guide to help, a right answer often among the samples); the ``--tasks``
eligible tasks with the highest any-of-16 are kept. Nothing else is chosen: every method runs at its defaults.

**Methods** (``methods``), each with each guide (``GUIDES``: the generator's mean log-prob, its token confidence,
the default reward model) as the reward and the partial reward, and each winner picked three ways among its finished
candidates (the guide's argmax, a majority vote over the extracted answers, a guide-weighted vote):

- ``bon_N``: Best-of-N for N in ``BON``, averaged over the pool's disjoint groups of N candidates;
- ``sr_fixed_16`` / ``sr_fixed_auto``: Speculative Rejection (``fixed``, alpha 0.5) from 16 rows / as many as the
  first round fits; ``sr_adaptive_16`` / ``sr_adaptive_auto`` the same with ``adaptive``;
- ``beam_16``, ``dvts_16``, ``pf_16``: search from 16 rows, a decision every 8 tokens. These run live (``search``
  step, ``Live``) on the first ``--limit`` problems of each pool, with the pool's generator and sampling: a copy's
  continuation decoded from a pool costs more than the live copy (every copy decodes to the end by itself). Their
  samples are their own, not the pool's; the report compares them on their problems only.

Every method but Best-of-N runs at Best-of-4's memory (the KV cache Best-of-4 fills at full length). FLOPs are what
the loop charges a method: prefill, every row's decode, copies, every guide call (the judge is never charged).

**Figures** (``report``), per task and pooled, with 95% CIs from a paired bootstrap over problems: gold accuracy
and FLOPs per method; the Best-of-N curve (at each N the better of the guide's argmax and majority vote, per guide,
and the best over guides); each method's FLOPs speedup at matched gold accuracy against that curve (the FLOPs the
curve needs, interpolated in log N, over the method's); any-of-N, the ceiling; each guide's Best-of-16 against
any-of-16.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rodeco.experiments.bench import REPO
from rodeco.experiments.bootstrap import ci as bootstrap_ci
from rodeco.experiments.bootstrap import draws
from rodeco.experiments.speedup import matched_speedup

if TYPE_CHECKING:
    from rodeco.common.state import Candidate

REPORT_SEED, SELECT_SEED = 7, 1000  # far apart: reasoning-gym's problem i of seed s is problem i - 1 of seed s + 1
MAX_NEW = 64
TOP_K = 5
# task -> reasoning-gym settings tried on the selection seed (easy: a 135M model gets some right)
CANDIDATES: dict[str, dict[str, Any]] = {
    "chain_sum": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1},
    "basic_arithmetic": {
        "min_terms": 2,
        "max_terms": 2,
        "min_digits": 1,
        "max_digits": 2,
        "operators": ["+", "-"],
        "allow_parentheses": False,
        "allow_negation": False,
    },
    "leg_counting": {"min_animals": 1, "max_animals": 2, "min_instances": 1, "max_instances": 3},
    "letter_counting": {"min_words": 3, "max_words": 5},
}
GUIDES = ("logprob", "confidence", "minilm_rm")
RULES = ("reward", "majority", "weighted")
BON = (1, 2, 4, 8, 16, 32)
SEARCH = {"beam": "beam", "dvts": "dvts", "pf": "particle_filter"}


def task_config(cfg: dict[str, Any]) -> str:
    """The override that sets ``data.task_config`` to ``cfg``, in Hydra's grammar (bare keys, quoted strings)."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return "'" + v.replace("'", "\\'") + "'"
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(map(value, v)) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k}: {value(x)}" for k, x in v.items()) + "}"
        return json.dumps(v)

    return "data.task_config=" + value(cfg)


def record_pool(task: str, cfg: dict[str, Any], path: Path, size: int, seed: int, candidates: int, held: int) -> None:
    """``rodeco experiment=pool`` of one task (resumable: a rerun records the problems missing)."""
    cmd = [
        str(Path(sys.executable).parent / "rodeco"),
        "experiment=pool",
        "data=reasoning_gym",
        f"data.task={task}",
        task_config(cfg),
        f"data.size={size}",
        f"data.seed={seed}",
        "reward=logprob",
        f"sampling.max_new_tokens={MAX_NEW}",
        f"experiment_args.candidates={candidates}",
        f"experiment_args.top_logprobs={TOP_K}",
        "experiment_args.batch_prompts=4",
        "experiment_args.hidden_states=false",
        f"pool={path}",
        f"hydra.run.dir={path.parent / ('run_' + path.name)}",
        "output.progress=false",
    ]
    if seed != REPORT_SEED:
        cmd += [f"data.holdout_seed={REPORT_SEED}", f"data.holdout_size={held}"]
    subprocess.run(cmd, check=True, cwd=REPO)


class Gold:
    """The ``gold`` judge over a pool's texts, each (problem, text) checked once."""

    def __init__(self) -> None:
        import rodeco

        self.plugins = rodeco.get_plugin_manager()
        self.judge = self.plugins.build_reward({"name": "gold"}, rodeco.BuildContext(plugins=self.plugins))
        self.cache: dict[tuple[int, str], float] = {}

    def __call__(self, p: Any, text: str) -> float:
        from rodeco import ScoreRequest

        key = (p.index, text)
        if key not in self.cache:
            req = ScoreRequest(p.text, text, (), partial=False, prompt_index=p.index, meta=p.meta)
            self.cache[key] = self.judge.score([req])[0]
        return self.cache[key]


def pool_gold(pool: Any, gold: Gold) -> dict[int, list[float]]:
    """Every pool candidate's gold score, per problem: the any-of-N ceiling."""
    return {i: [gold(pool.prompt(i), c.text) for c in pool.prompt(i).candidates] for i in pool.indices()}


# --- select ---------------------------------------------------------------------------------------------------------


def select(a: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    gold = Gold()
    from rodeco.replays.pool import Pool

    for task, cfg in CANDIDATES.items():
        path = a.out / "select" / task
        if a.record:
            record_pool(task, cfg, path, a.select_problems, SELECT_SEED, 16, a.problems)
        pool = Pool(path)
        g = np.array([v[:16] for v in pool_gold(pool, gold).values()])
        acc, any16 = float(g.mean()), float(g.max(axis=1).mean())
        ok = 0 < acc <= 0.5 and any16 >= 2 * acc
        out[task] = {"config": cfg, "problems": len(g), "sample_accuracy": acc, "any_of_16": any16, "eligible": ok}
    eligible = sorted((t for t in out if out[t]["eligible"]), key=lambda t: -out[t]["any_of_16"])
    for task, v in out.items():  # the TASKS eligible tasks with the most room (any-of-16) are kept
        v["kept"] = task in eligible[: a.tasks]
        print(
            f"{task:18s} sample accuracy {v['sample_accuracy']:.3f}  any-of-16 {v['any_of_16']:.3f}  "
            f"{'kept' if v['kept'] else 'eligible, not kept' if v['eligible'] else 'not eligible'}"
        )
    (a.out / "select.json").write_text(json.dumps(out, indent=2) + "\n")
    return out


def chosen(a: argparse.Namespace) -> dict[str, dict[str, Any]]:
    f = a.out / "select.json"
    if not f.is_file():
        raise SystemExit(f"no {f}: run `python scripts/gold_bench.py select --out {a.out}` first")
    sel = json.loads(f.read_text())
    return {t: v["config"] for t, v in sel.items() if v["kept"]}


def record(a: argparse.Namespace) -> None:
    for task, cfg in chosen(a).items():
        record_pool(task, cfg, a.out / "pools" / task, a.problems, REPORT_SEED, a.candidates, a.problems)


# --- run ------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Method:
    label: str
    policy: dict[str, Any]
    n: int | str
    groups: int = 1  # Best-of-N: disjoint groups of N candidates averaged


def methods(candidates: int) -> list[Method]:
    """What the ``run`` step replays over a pool: Best-of-N and Speculative Rejection."""
    out = [Method(f"bon_{n}", {"name": "none"}, n, candidates // n) for n in BON if n <= candidates]
    for kind in ("fixed", "adaptive"):
        node = {"name": kind, **({"alpha": 0.5} if kind == "fixed" else {})}
        out += [Method(f"sr_{kind}_16", node, 16), Method(f"sr_{kind}_auto", node, "auto")]
    return out


def search_methods() -> list[Method]:
    """What the ``search`` step runs live: the copying policies from 16 rows, a decision every 8 tokens."""
    return [Method(f"{k}_16", {"name": v, "decision_tokens": 8}, 16) for k, v in SEARCH.items()]


def memory(prompt_tokens: int, kv: Any) -> int:
    """Best-of-4's memory: the KV cache four rows of this prompt fill at full length."""
    from rodeco.common.budget import full_length_tokens

    return full_length_tokens(4, [prompt_tokens], MAX_NEW, kv)


def finished(cands: list[Candidate] | None) -> list[tuple[int, float, str]]:
    """The finished candidates as (id, final reward, text): the reward scored every finished candidate."""
    out: list[tuple[int, float, str]] = []
    for x in cands or []:
        if x.finished:
            if x.score is None:
                raise ValueError(f"candidate {x.candidate_id} finished without a final reward")
            out.append((x.candidate_id, float(x.score), x.text))
    return out


class Replayer:
    """One task's pool, one guide: every method replayed through the real loop
    (``rodeco.replays.replay.replay_batch``)."""

    def __init__(self, pool_path: Path, guide: str) -> None:
        from rodeco.compose import load_config
        from rodeco.experiments.record import pool_roles
        from rodeco.plugins import default_plugins
        from rodeco.replays.replay import open_pool
        from rodeco.roles import choose_roles
        from rodeco.runner import loop_settings

        self.plugins = default_plugins()
        cfg = load_config(
            [f"reward={guide}", "partial_reward=same", f"sampling.max_new_tokens={MAX_NEW}", "budget=unlimited"],
            self.plugins,
        )
        self.cfg = cfg
        self.pool, self.gen = open_pool(pool_path)
        self.builder = pool_roles(cfg, self.plugins, self.pool, self.gen)
        self.choices = choose_roles(cfg, self.plugins, live=False)
        self.base = dataclasses.replace(loop_settings(cfg, self.gen, "", guide), all_candidates=True)
        self.roles: dict[str, Any] = {}

    def policy_roles(self, node: dict[str, Any]) -> Any:
        key = json.dumps(node, sort_keys=True)
        if key not in self.roles:
            self.roles[key] = self.builder.roles(self.choices.with_(self.plugins, policy=node))
        return self.roles[key]

    def run(self, m: Method, index: int, first: int) -> dict[str, Any]:
        from rodeco.common.budget import Budget
        from rodeco.replays.replay import replay_batch

        roles = self.policy_roles(m.policy)
        p = self.pool.prompt(index)
        kv = None if m.policy["name"] == "none" else memory(len(p.prompt_ids), self.gen.kv)
        s = dataclasses.replace(
            self.base, n=m.n, policy_name=m.policy["name"], budget=Budget(kv, self.base.budget.min_tokens_per_round)
        )
        (res,), c, _ = replay_batch(
            self.pool, self.gen, roles.reward, roles.policy, [index], s, first, None, roles.partial
        )
        return {
            "flops": c.total_flops,
            "gen_flops": c.gen_flops,
            "n_start": res.n_start,
            "cands": finished(res.candidates),
        }

    def save(self) -> None:
        from rodeco.replays.replay import pool_served

        for r in self.roles.values():
            for served in pool_served(r.reward, r.partial):
                served.save()


class Live:
    """One task's pool, one guide: a live decoder with the pool's generator and sampling, for the search policies.

    Several problems decode together in the open loop (``Decoder.serve_open``), each its own request with its own
    budget (Best-of-4's memory) and clock, so each gets the decisions it gets alone, about three times faster on
    2 cores than one problem a batch. What each is charged is its own rows' steps, and the batch's: a finished row
    stays in the batch, and is stepped, until a quarter of the batch has finished (``compact_fraction``), so a
    problem decoded beside others is charged a few percent more than alone (2-7% on 4 chain_sum problems)."""

    def __init__(self, pool_path: Path, guide: str) -> None:
        import rodeco
        from rodeco.replays.pool_session import live_generator
        from rodeco.replays.replay import open_pool

        self.pool, _ = open_pool(pool_path)
        self.gen = live_generator(self.pool)
        sampling = [f"sampling.{k}={v}" for k, v in self.pool.settings["sampling"].items()]
        self.decoder = rodeco.Decoder(
            generator=self.gen,
            overrides=[f"reward={guide}", "partial_reward=same", f"sampling.max_new_tokens={MAX_NEW}", *sampling],
        )

    def run(self, m: Method, indices: list[int]) -> dict[int, dict[str, Any]]:
        """Method ``m`` on problems ``indices``, decoded together: per problem, its FLOPs, rows started and finished
        candidates (id, guide score, text)."""
        from rodeco.common.state import PromptRef, PromptResult
        from rodeco.experiments.bench.open_vs_closed import Arrivals

        got: dict[int, PromptResult] = {}
        reqs = []
        for index in indices:
            p = self.pool.prompt(index)
            ids = self.gen.encode(p.text)
            if ids != list(p.prompt_ids):
                raise SystemExit(f"problem {index}: the live generator encodes its prompt unlike the pool")
            reqs.append(
                self.decoder.request(
                    [PromptRef(p.index, p.text, meta=p.meta)],
                    n=int(m.n),
                    policy=m.policy,
                    kv_tokens=memory(len(ids), self.gen.kv),
                    on_done=partial(got.__setitem__, index),
                )
            )
        self.decoder.serve_open(Arrivals(reqs, one_at_a_time=False), kv_tokens=None)
        return {
            i: {
                "flops": r.compute.total_flops,
                "gen_flops": r.compute.gen_flops,
                "n_start": r.n_start,
                "cands": finished(r.candidates),
            }
            for i, r in got.items()
        }


def winners(cands: list[tuple[int, float, str]], gold_of: Any, extractor: str) -> dict[str, float]:
    """The gold score of the winner under each rule (0 when no candidate finished)."""
    from rodeco import Candidate, WinnerRule

    if not cands:
        return dict.fromkeys(RULES, 0.0)
    cs = [Candidate(i, [], t, s, True) for i, s, t in cands]
    out = {}
    for rule in RULES:
        best = WinnerRule(rule=rule, extractor=extractor).choose(cs).best
        out[rule] = gold_of(best.text)
    return out


def run(a: argparse.Namespace) -> None:
    from tqdm import tqdm

    gold = Gold()
    for task in chosen(a):
        path = a.out / "pools" / task
        if a.only and task not in a.only or not (path / "pool.json").is_file():
            continue  # another task asked for, or its pool not recorded yet
        for guide in a.guides:
            rep = Replayer(path, guide)
            src = gold.plugins.source("reasoning_gym")
            extractor = src.extractor(task)
            out_f = a.out / "runs" / task / f"{guide}.jsonl"
            out_f.parent.mkdir(parents=True, exist_ok=True)
            done = {json.loads(line)["index"] for line in out_f.open()} if out_f.is_file() else set()
            todo = [i for i in rep.pool.indices()[: a.limit] if i not in done]  # the first --limit problems
            for index in tqdm(todo, desc=f"{task} {guide}", unit="problem"):
                p = rep.pool.prompt(index)
                rec: dict[str, Any] = {"index": index, "methods": {}}
                t0 = time.perf_counter()
                for m in methods(rep.pool.candidates):
                    runs = [rep.run(m, index, g * int(m.n) if m.groups > 1 else 0) for g in range(m.groups)]
                    rec["methods"][m.label] = [scored(r, lambda t, p=p: gold(p, t), extractor) for r in runs]
                rec["seconds"] = time.perf_counter() - t0
                with out_f.open("a") as f:
                    f.write(json.dumps(rec) + "\n")
                rep.save()


def scored(r: dict[str, Any], gold_of: Any, extractor: str) -> dict[str, Any]:
    """One run of a method as a record keeps it: FLOPs, rows started, each rule's gold score, the guide's best text."""
    return {
        "flops": r["flops"],
        "n_start": r["n_start"],
        **winners(r["cands"], gold_of, extractor),
        "best": max(r["cands"], key=lambda c: c[1])[2] if r["cands"] else "",
    }


def search(a: argparse.Namespace) -> None:
    """The search policies, live, on the first ``--limit`` problems of each pool (``<guide>.search.jsonl``)."""
    from tqdm import tqdm

    gold = Gold()
    for task in chosen(a):
        path = a.out / "pools" / task
        if a.only and task not in a.only or not (path / "pool.json").is_file():
            continue
        extractor = gold.plugins.source("reasoning_gym").extractor(task)
        for guide in a.guides:
            live = Live(path, guide)
            out_f = a.out / "runs" / task / f"{guide}.search.jsonl"
            out_f.parent.mkdir(parents=True, exist_ok=True)
            done = {json.loads(line)["index"] for line in out_f.open()} if out_f.is_file() else set()
            todo = [i for i in live.pool.indices()[: a.limit] if i not in done]
            bar = tqdm(total=len(todo), desc=f"{task} {guide} search", unit="problem")
            for k in range(0, len(todo), a.search_batch):
                some = todo[k : k + a.search_batch]
                recs: dict[int, dict[str, Any]] = {i: {"index": i, "methods": {}} for i in some}
                t0 = time.perf_counter()
                for m in search_methods():
                    for i, r in live.run(m, some).items():
                        p = live.pool.prompt(i)
                        recs[i]["methods"][m.label] = [scored(r, lambda t, p=p: gold(p, t), extractor)]
                with out_f.open("a") as f:
                    for rec in recs.values():  # the batch's seconds, shared
                        f.write(json.dumps({**rec, "seconds": (time.perf_counter() - t0) / len(some)}) + "\n")
                bar.update(len(some))


# --- report ---------------------------------------------------------------------------------------------------------


def load_runs(a: argparse.Namespace) -> tuple[dict, dict, dict]:
    """{task: {guide: {index: record}}} of the replayed methods; the same with the live search methods added, on the
    problems that have both; {task: {index: [gold of every pool candidate]}}."""
    from rodeco.replays.pool import Pool

    gold = Gold()
    runs: dict[str, dict[str, dict[int, dict]]] = {}
    both: dict[str, dict[str, dict[int, dict]]] = {}
    ceiling: dict[str, dict[int, list[float]]] = {}

    def read(f: Path) -> dict[int, dict]:
        return {r["index"]: r for r in map(json.loads, f.open())} if f.is_file() else {}

    for task in chosen(a):
        if not (a.out / "pools" / task / "pool.json").is_file():
            continue
        ceiling[task] = pool_gold(Pool(a.out / "pools" / task), gold)
        for guide in GUIDES:
            replayed = read(a.out / "runs" / task / f"{guide}.jsonl")
            if replayed:
                runs.setdefault(task, {})[guide] = replayed
            live = read(a.out / "runs" / task / f"{guide}.search.jsonl")
            if live:
                both.setdefault(task, {})[guide] = merged(replayed, live)
    return runs, both, ceiling


def merged(replayed: dict[int, dict], live: dict[int, dict]) -> dict[int, dict]:
    """Each problem that ran both: its record with the replayed methods and the live ones."""
    return {i: {**r, "methods": {**replayed[i]["methods"], **r["methods"]}} for i, r in live.items() if i in replayed}


def table(
    runs: dict, ceiling: dict, tasks: list[str], resamples: int, guides: list[str], seed: int = 0
) -> dict[str, Any]:
    """Per (guide, method, rule): accuracy and FLOPs (means over the problems every guide ran, with bootstrap CIs);
    the best Best-of-N curve over these guides and each method's speedup at matched accuracy against it, paired over
    the same resampled problems."""
    guides = [g for g in guides if all(g in runs.get(t, {}) for t in tasks)]
    # problems every guide has, per task
    keys = [(t, i) for t in tasks for i in sorted(set.intersection(*(set(runs[t][g]) for g in guides)))]
    P = len(keys)
    labels = list(next(iter(runs[keys[0][0]][guides[0]].values()))["methods"]) if P else []
    acc: dict[tuple[str, str, str], np.ndarray] = {}
    flops: dict[tuple[str, str], np.ndarray] = {}
    for g in guides:
        for m in labels:
            recs = [runs[t][g][i]["methods"][m] for t, i in keys]
            flops[g, m] = np.array([np.mean([r["flops"] for r in rs]) for rs in recs])
            for rule in RULES:
                acc[g, m, rule] = np.array([np.mean([r[rule] for r in rs]) for rs in recs])
    anyof = {n: np.array([_any_of(ceiling[t][i], n) for t, i in keys]) for n in BON}
    boots = draws(P, resamples, seed)

    def ci(f):
        return [f(np.arange(P)), *bootstrap_ci([f(b) for b in boots])]

    bon = [f"bon_{n}" for n in BON if f"bon_{n}" in labels]

    def curve(idx):  # the best Best-of-N curve: at each N the best guide x (argmax, majority)
        pts = []
        for m in bon:
            best = max(acc[g, m, r][idx].mean() for g in guides for r in ("reward", "majority"))
            pts.append((float(np.mean([flops[g, m][idx].mean() for g in guides])), best))
        return pts

    def bon16_flops(idx):  # Best-of-16's FLOPs (the same for every guide but the reward's own cost: their mean)
        return float(np.mean([flops[g, "bon_16"][idx].mean() for g in guides])) if "bon_16" in bon else math.nan

    def speedup(g, m, rule, idx):
        pts = curve(idx)
        if not pts:
            return math.nan
        f, a = np.array(pts).T
        return matched_speedup(acc[g, m, rule][idx].mean(), flops[g, m][idx].mean(), a, f)[0]

    out: dict[str, Any] = {"problems": P, "tasks": tasks, "guides": guides, "rows": {}}
    for g in guides:
        for m in labels:
            for rule in RULES:
                out["rows"][f"{g}/{m}/{rule}"] = {
                    "accuracy": ci(lambda b, k=(g, m, rule): acc[k][b].mean()),
                    "gflops": ci(lambda b, k=(g, m): flops[k][b].mean() / 1e9),
                    "speedup_at_matched_accuracy": ci(lambda b, g=g, m=m, r=rule: speedup(g, m, r, b)),
                    "bon16_flops_ratio": ci(lambda b, k=(g, m): bon16_flops(b) / flops[k][b].mean()),
                }
    out["any_of"] = {str(n): ci(lambda b, n=n: anyof[n][b].mean()) for n in BON}
    out["bon_curve"] = curve(np.arange(P))
    target = max(out["bon_curve"][bon.index("bon_16")][1], 0.0) if "bon_16" in bon else math.nan
    out["best_bon16_accuracy"] = target
    out["goal"] = goal(out)
    return out


def _any_of(g: list[float], n: int) -> float:
    """Any of N right, averaged over the pool's disjoint groups of N candidates."""
    groups = [g[k : k + n] for k in range(0, len(g) - n + 1, n)]
    return float(np.mean([max(x) for x in groups]))


def report(a: argparse.Namespace) -> None:
    runs, both, ceiling = load_runs(a)
    tasks = [t for t in runs if runs[t]]
    own = [g for g in GUIDES if g != "minilm_rm"]  # the generator's own guides: every problem
    out = {"pooled": table(runs, ceiling, tasks, a.resamples, own)}
    for t in tasks:
        out[t] = table(runs, ceiling, [t], a.resamples, own)
    out["pooled_with_minilm_rm"] = table(runs, ceiling, tasks, a.resamples, list(GUIDES))  # its problems only
    searched = [t for t in tasks if both.get(t)]
    if searched:  # the live search methods beside the replayed ones, on the problems they ran
        guides = [g for g in GUIDES if all(g in both[t] for t in searched)]
        out["pooled_with_search"] = table(both, ceiling, searched, a.resamples, guides)
        for t in searched:
            out[f"{t}_with_search"] = table(both, ceiling, [t], a.resamples, guides)
    out["selection"] = json.loads((a.out / "select.json").read_text())
    for name, tab in out.items():
        if name == "selection":
            continue
        print_table(name, tab)
    if a.snapshot:
        texts = {t: {g: dict(both.get(t, {}).get(g, {})) for g in gs} for t, gs in runs.items()}
        for t, gs in runs.items():
            for g, rs in gs.items():
                texts[t][g] = {**rs, **texts[t][g]}  # a searched problem's record holds every method
        winners_texts = {
            t: {
                g: {i: {m: r["methods"][m][0].get("best", "") for m in r["methods"]} for i, r in rs.items()}
                for g, rs in gs.items()
            }
            for t, gs in texts.items()
        }
        blob = json.dumps({"figures": out, "winners": winners_texts, "command": " ".join(sys.argv)})
        with gzip.open(a.snapshot, "wt") as f:
            f.write(blob)
        print(f"snapshot: {a.snapshot}")


def fmt(x: list[float], d: int = 3) -> str:
    v, lo, hi = x
    if not math.isfinite(v):
        return "–"
    return f"{v:.{d}f} [{lo:.{d}f}, {hi:.{d}f}]" if math.isfinite(lo) else f"{v:.{d}f}"


def print_table(name: str, tab: dict[str, Any]) -> None:
    """A compact view: per guide and method, FLOPs, the three rules' accuracies, and the speedup at matched accuracy
    of its best rule; then the goal's check."""
    print(f"\n## {name}: {tab['problems']} problems ({', '.join(tab['tasks'])})")
    print(f"best Best-of-16 gold accuracy (any guide, argmax or vote): {tab['best_bon16_accuracy']:.3f}")
    print("any-of-N (the ceiling): " + ", ".join(f"{n}: {fmt(v)}" for n, v in tab["any_of"].items()))
    rows = tab["rows"]
    print("| guide | method | GFLOPs/problem | argmax | majority | weighted | speedup at matched accuracy (its rule) |")
    print("|---|---|---|---|---|---|---|")
    for key in [k for k in rows if k.endswith("/reward")]:
        g, m, _ = key.split("/")
        accs = {r: rows[f"{g}/{m}/{r}"] for r in RULES}
        best = max(RULES, key=lambda r: accs[r]["accuracy"][0])
        print(
            f"| {g} | {m} | {fmt(rows[key]['gflops'], 1)} | "
            + " | ".join(fmt(accs[r]["accuracy"]) for r in RULES)
            + f" | {fmt(accs[best]['speedup_at_matched_accuracy'], 2)} ({best}) |"
        )
    for g in tab["guides"]:
        b16 = rows.get(f"{g}/bon_16/reward")
        if b16 is not None:
            print(f"{g}: Best-of-16 argmax {fmt(b16['accuracy'])} against any-of-16 {fmt(tab['any_of']['16'])}")
    goal = tab["goal"]
    print(f"methods reaching the best Best-of-16 accuracy ({goal['target']:.3f}), Best-of-16's FLOPs over theirs:")
    for k, r in sorted(goal["reached"].items(), key=lambda kv: -kv[1][0]):
        print(f"  {k}: {fmt(r, 2)}")
    print(f"gold_goal_ratio: {goal['label']} {fmt(goal['ratio'], 2)}  (goal: >= 3, its CI's low end >= 2)")


def goal(tab: dict[str, Any]) -> dict[str, Any]:
    """The issue's yardstick: the methods (not Best-of-N) whose gold accuracy reaches the best Best-of-16's, each
    with Best-of-16's FLOPs over its own (paired CI); the best of them, or none where no method reaches it."""
    target, reached = tab["best_bon16_accuracy"], {}
    for key, row in tab["rows"].items():
        if "/bon_" not in key and row["accuracy"][0] >= target:
            reached[key] = row["bon16_flops_ratio"]
    best = max(reached, key=lambda k: reached[k][0], default=None)
    return {"target": target, "reached": reached, "label": best, "ratio": reached.get(best, [math.nan] * 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("step", choices=["select", "record", "run", "search", "report"])
    ap.add_argument("--out", type=Path, default=Path("runs/gold"))
    ap.add_argument("--problems", type=int, default=150, help="report problems a task")
    ap.add_argument("--select-problems", type=int, default=30, help="selection problems a candidate task")
    ap.add_argument("--tasks", type=int, default=4, help="select: keep this many eligible tasks (most any-of-16)")
    ap.add_argument("--candidates", type=int, default=32, help="pool candidates a report problem")
    ap.add_argument("--guides", nargs="+", default=list(GUIDES))
    ap.add_argument(
        "--record", action=argparse.BooleanOptionalAction, default=True, help="select: record what the pools lack"
    )
    ap.add_argument(
        "--limit", type=int, default=None, help="run, search: the first this many problems a task and guide"
    )
    ap.add_argument("--search-batch", type=int, default=4, help="search: problems decoded together")
    ap.add_argument("--only", nargs="+", default=None, help="run: only these tasks")
    ap.add_argument("--resamples", type=int, default=1000)
    ap.add_argument("--snapshot", type=Path, default=None)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    {"select": select, "record": record, "run": run, "search": search, "report": report}[a.step](a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
