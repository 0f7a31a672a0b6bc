"""Gold accuracy against FLOPs on reasoning-gym tasks: every method replayed over one recorded pool per task, each
winner checked by the task's own checker (``judge=gold``), which no method sees.

Steps, each resumable (results are written per problem as they finish)::

    python scripts/gold_bench.py select --out runs/gold        # candidate tasks on selection seeds: which to keep
    python scripts/gold_bench.py record --out runs/gold        # the report pools: 150 problems x 64 candidates a task
    python scripts/gold_bench.py record --out runs/gold --split select  # the selection pools: 30 x 64 a task
    python scripts/gold_bench.py run --out runs/gold --split select  # every method x guide on the selection pools
    python scripts/gold_bench.py run --out runs/gold           # ... and on the report pools
    python scripts/gold_bench.py search --out runs/gold --limit 24  # beam, dvts, particle filter, live
    python scripts/gold_bench.py report --out runs/gold --snapshot docs/data/gold_rg.json.gz
    python scripts/gold_bench.py matched --snapshot docs/data/gold_rg.json.gz --row logprob/sr_fixed_auto/reward

**Selection.** Each candidate task (``CANDIDATES``: easy settings) is recorded on a selection seed (``SELECT_SEED``,
the report problems held out). A task is eligible when a sample's mean gold accuracy is above 0 and at most 0.5 and
any-of-16 at least twice it (room for a guide to help, a right answer often among the samples); the ``--tasks``
eligible tasks with the highest any-of-16 are kept. ``matched`` reads a report snapshot for the server load test's
vLLM ``n``: the smallest N whose Best-of-N (same guide and rule) is within 0.02 of a method's gold accuracy. Every
method runs at its defaults; the one thing chosen on the
selection problems is the headline row (``rodeco.experiments.bench.gold_report``).

**Methods** (``methods``), each with each guide (``GUIDES``: the generator's mean log-prob, its token confidence,
the trained ``verifier``, the default reward model) as the reward and the partial reward, and each winner picked
four ways among its finished candidates (``RULES``: the guide's argmax, a majority vote over the extracted answers,
the guide-weighted vote, the confidence-weighted vote):

- ``bon_N``: Best-of-N for N in ``BON``, averaged over the pool's disjoint groups of N candidates;
- ``sr_fixed_16`` / ``sr_fixed_auto``: Speculative Rejection (``fixed``, alpha 0.5) from 16 rows / as many as the
  first round fits; ``sr_adaptive_16`` / ``sr_adaptive_auto`` the same with ``adaptive``;
- ``deepconf_N``: DeepConf online (``policy=deepconf``) from N rows, no memory limit;
- ``vote_stop_N``: Best-of-N whose vote stops when Adaptive-Consistency's test settles it (``winner.stop=beta``),
  no memory limit; the rows it stops are charged as decoded;
- ``beam_16``, ``dvts_16``, ``pf_16``: search from 16 rows, a decision every 8 tokens. These run live (``search``
  step, ``Live``) on the first ``--limit`` problems of each pool, with the pool's generator and sampling: a copy's
  continuation decoded from a pool costs more than the live copy (every copy decodes to the end by itself). Their
  samples are their own, not the pool's; the report compares them on their problems only.

Speculative Rejection and the search policies run at Best-of-4's memory (the KV cache Best-of-4 fills at full
length). FLOPs are what the loop charges a method: prefill, every row's decode, copies, every guide call (the judge is
never charged). Pools record hidden states (the ``verifier`` reads them) and top-5 log-probs (``confidence``,
``deepconf``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rodeco.experiments.bench import REPO
from rodeco.experiments.bench.gold_tasks import (
    BON,
    CANDIDATES,
    GUIDES,
    MAX_NEW,
    REPORT_SEED,
    RULES,
    SEARCH,
    SELECT_SEED,
    TOP_K,
    Gold,
    chosen,
    pool_gold,
    pools_of,
    records,
    runs_of,
)

if TYPE_CHECKING:
    from rodeco import WinnerRule
    from rodeco.common.state import Candidate


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
        "experiment_args.batch_prompts=1",  # hidden states are recorded one prompt at a time
        "experiment_args.hidden_states=true",
        f"pool={path}",
        f"hydra.run.dir={path.parent / ('run_' + path.name)}",
        "output.progress=false",
    ]
    if seed != REPORT_SEED:
        cmd += [f"data.holdout_seed={REPORT_SEED}", f"data.holdout_size={held}"]
    subprocess.run(cmd, check=True, cwd=REPO)


# --- select ---------------------------------------------------------------------------------------------------------


def select(a: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    gold = Gold()
    from rodeco.replays.pool import Pool

    for task, cfg in CANDIDATES.items():
        path = a.out / "select" / task
        if a.record:
            record_pool(task, cfg, path, a.select_problems, SELECT_SEED, a.candidates, a.problems)
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


def record(a: argparse.Namespace) -> None:
    """The chosen tasks' pools of a split: the report problems, or (``--split select``) the selection problems, with
    ``--candidates`` each."""
    size, seed = (a.problems, REPORT_SEED) if a.split == "report" else (a.select_problems, SELECT_SEED)
    for task, cfg in chosen(a).items():
        record_pool(task, cfg, pools_of(a.out, a.split) / task, size, seed, a.candidates, a.problems)


# --- run ------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Method:
    label: str
    policy: dict[str, Any]
    n: int | str
    groups: int = 1  # Best-of-N: disjoint groups of N candidates averaged
    memory: bool = True  # at Best-of-4's memory; False: no limit (a method that saves tokens, not memory)
    winner: tuple[tuple[str, Any], ...] = ()  # winner fields the method sets (a vote's stopping test)


STOP_VOTE = (("stop", "beta"),)  # Adaptive-Consistency's test: votes counted one a candidate, whatever the weights


def methods(candidates: int) -> list[Method]:
    """What the ``run`` step replays over a pool: Best-of-N, Speculative Rejection, DeepConf online and votes that
    stop when decided."""
    out = [Method(f"bon_{n}", {"name": "none"}, n, candidates // n, False) for n in BON if n <= candidates]
    for kind in ("fixed", "adaptive"):
        node = {"name": kind, **({"alpha": 0.5} if kind == "fixed" else {})}
        out += [Method(f"sr_{kind}_16", node, 16), Method(f"sr_{kind}_auto", node, "auto")]
    for n in (16, 32, 64):
        if n <= candidates:
            out.append(Method(f"deepconf_{n}", {"name": "deepconf"}, n, candidates // n, False))
            out.append(Method(f"vote_stop_{n}", {"name": "none"}, n, candidates // n, False, STOP_VOTE))
    return out


def search_methods() -> list[Method]:
    """What the ``search`` step runs live: the copying policies from 16 rows, a decision every 8 tokens."""
    return [Method(f"{k}_16", {"name": v, "decision_tokens": 8}, 16) for k, v in SEARCH.items()]


def memory(prompt_tokens: int, kv: Any) -> int:
    """Best-of-4's memory: the KV cache four rows of this prompt fill at full length."""
    from rodeco.common.budget import full_length_tokens

    return full_length_tokens(4, [prompt_tokens], MAX_NEW, kv)


Finished = tuple[int, float, str, "float | None"]  # (id, final reward, text, trace confidence)


def finished(cands: list[Candidate] | None) -> list[Finished]:
    """The finished candidates as (id, final reward, text, confidence): the reward scored every finished candidate,
    and the run's winner rule (a confidence-weighted vote) gave each its trace's confidence."""
    out: list[Finished] = []
    for x in cands or []:
        if x.finished:
            if x.score is None:
                raise ValueError(f"candidate {x.candidate_id} finished without a final reward")
            out.append((x.candidate_id, float(x.score), x.text, x.confidence))
    return out


def base_winner(extractor: str) -> WinnerRule:
    """The winner rule every method runs with: the confidence-weighted vote, so that every finished candidate carries
    its trace's confidence (the four rules are applied afterwards, ``winners``)."""
    from rodeco import WinnerRule

    return WinnerRule(rule="weighted", weight="confidence", extractor=extractor)


class Replayer:
    """One task's pool, one guide: every method replayed through the real loop
    (``rodeco.replays.replay.replay_batch``)."""

    def __init__(self, pool_path: Path, guide: str, extractor: str) -> None:
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
        self.base = dataclasses.replace(
            loop_settings(cfg, self.gen, "", guide), all_candidates=True, winner=base_winner(extractor)
        )
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
        kv = memory(len(p.prompt_ids), self.gen.kv) if m.memory else None
        s = dataclasses.replace(
            self.base,
            n=m.n,
            policy_name=m.policy["name"],
            budget=Budget(kv, self.base.budget.min_tokens_per_round),
            winner=dataclasses.replace(self.base.winner, **dict(m.winner)),
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

    def __init__(self, pool_path: Path, guide: str, extractor: str) -> None:
        import rodeco
        from rodeco.replays.pool_session import live_generator
        from rodeco.replays.replay import open_pool

        self.pool, _ = open_pool(pool_path)
        self.gen = live_generator(self.pool)
        sampling = [f"sampling.{k}={v}" for k, v in self.pool.settings["sampling"].items()]
        w = base_winner(extractor)
        self.decoder = rodeco.Decoder(
            generator=self.gen,
            overrides=[
                f"reward={guide}",
                "partial_reward=same",
                f"sampling.max_new_tokens={MAX_NEW}",
                *sampling,
                f"winner.rule={w.rule}",
                f"winner.weight={w.weight}",
                f"winner.extractor={w.extractor}",
            ],
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


def winners(cands: list[Finished], gold_of: Any, extractor: str) -> dict[str, float]:
    """The gold score of the winner under each rule (0 when no candidate finished): the guide's argmax, the majority
    vote, the guide-weighted vote and the confidence-weighted vote (DeepConf's)."""
    from rodeco import Candidate, WinnerRule

    if not cands:
        return dict.fromkeys(RULES, 0.0)
    cs = [Candidate(i, [], t, s, True, confidence=c) for i, s, t, c in cands]
    out = {}
    for rule in RULES:
        vote = ("weighted", "confidence") if rule == "confidence" else (rule, "reward")
        best = WinnerRule(rule=vote[0], weight=vote[1], extractor=extractor).choose(cs).best
        out[rule] = gold_of(best.text)
    return out


def run(a: argparse.Namespace) -> None:
    from tqdm import tqdm

    gold = Gold()
    for task in chosen(a):
        path = pools_of(a.out, a.split) / task
        if a.only and task not in a.only or not (path / "pool.json").is_file():
            continue  # another task asked for, or its pool not recorded yet
        for guide in a.guides:
            extractor = gold.plugins.source("reasoning_gym").extractor(task)
            rep = Replayer(path, guide, extractor)
            out_f = runs_of(a.out, a.split) / task / f"{guide}.jsonl"
            out_f.parent.mkdir(parents=True, exist_ok=True)
            done = {r["index"] for r in records(out_f, repair=True)}
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
        path = pools_of(a.out, a.split) / task
        if a.only and task not in a.only or not (path / "pool.json").is_file():
            continue
        extractor = gold.plugins.source("reasoning_gym").extractor(task)
        for guide in a.guides:
            live = Live(path, guide, extractor)
            out_f = runs_of(a.out, a.split) / task / f"{guide}.search.jsonl"
            out_f.parent.mkdir(parents=True, exist_ok=True)
            done = {r["index"] for r in records(out_f, repair=True)}
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("step", choices=["select", "record", "run", "search", "report", "matched"])
    ap.add_argument("--out", type=Path, default=Path("runs/gold"))
    ap.add_argument("--problems", type=int, default=150, help="report problems a task")
    ap.add_argument("--select-problems", type=int, default=30, help="selection problems a candidate task")
    ap.add_argument("--tasks", type=int, default=4, help="select: keep this many eligible tasks (most any-of-16)")
    ap.add_argument("--candidates", type=int, default=64, help="pool candidates a problem")
    ap.add_argument(
        "--split",
        choices=["report", "select"],
        default="report",
        help="record, run, search: the report problems' pools, or the selection problems' (the headline's choice)",
    )
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
    ap.add_argument("--row", default="logprob/sr_fixed_auto/reward", help="matched: a method's report row")
    a = ap.parse_args()
    if a.step == "matched":  # the load test's vLLM n: read from a snapshot, nothing run
        import gzip

        from rodeco.experiments.bench.gold_report import matched_best_of

        if a.snapshot is None:
            ap.error("matched: give the report's --snapshot (e.g. docs/data/gold_rg64.json.gz)")
        with gzip.open(a.snapshot, "rt", encoding="utf-8") as f:
            doc = json.load(f)
        m = matched_best_of(doc["figures"], a.row)
        print(
            f"{m['row']}: gold accuracy {m['accuracy']:.3f}; the smallest Best-of-N within {m['tolerance']} under the "
            f"same guide and rule: N = {m['best_of']} (gold accuracy {m['best_of_accuracy']})"
        )
        return 0
    a.out.mkdir(parents=True, exist_ok=True)
    if a.step == "report":
        from rodeco.experiments.bench.gold_report import report

        report(a)
    else:
        {"select": select, "record": record, "run": run, "search": search}[a.step](a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
