"""The judged half of ``scripts/search_bench.py``: every method's winners on the report half, from both candidate
sets, scored by judges the search never saw, analysed against Best-of-N's curve on each judge
(``rodeco.experiments.judged``), with hacking diagnostics and the guide's split into its surface and embedding parts.

Winners: Best-of-N (N = 1, 2, 4 ... up to the set's size, 64 at most: the guide's best of the set's first N pool
candidates), fixed alpha 0.5 (replayed by
the efficiency experiment from the same set's candidates) and each live search method. Judge scores are cached per
judge config and text in the run directory (``judge_cache.json``), so a rerun scores only what is new.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import asdict
from functools import reduce
from pathlib import Path
from typing import Any

import numpy as np

SIZES = [1, 2, 4, 8, 16, 32, 64]


def set_sizes(firsts: list[int], candidates: int) -> list[int]:
    """Best-of-N's sizes in a candidate set: the sets start at ``firsts`` in a pool of ``candidates`` per prompt."""
    size = min(b - a for a, b in zip(firsts, [*firsts[1:], candidates]))
    return [n for n in SIZES if n <= size]


FIXED = "fixed_alpha_0.5"
DIAG_FIELDS = (
    "truncated",
    "ends_sentence",
    "tokens",
    "chars_per_token",
    "distinct_1",
    "distinct_2",
    "repeated_4gram_fraction",
    "non_ascii_fraction",
    "digit_fraction",
    "mean_logprob",
)
LOGPROB = "lm_logprob"  # the diagnostics' mean token log-prob: the text re-scored by the embedded SmolLM2
log = logging.getLogger(__name__)


def _key(prompt: str, text: str) -> str:
    return hashlib.sha256((prompt + "\0" + text).encode()).hexdigest()[:24]


class JudgeCache:
    """Judge scores by judge name and (prompt, text), kept in ``path`` with what scoring them cost (summed over the
    runs that scored them, so a resumed or repeated run reports the whole cost once); a judge whose config changed
    starts empty."""

    def __init__(self, path: Path, judges: Any) -> None:
        self.path, self.judges = path, judges
        old = json.loads(path.read_text()) if path.is_file() else {}
        self.data = {}
        for j in judges.judges:
            spec = json.loads(json.dumps(j.spec, default=str))
            prev = old.get(j.name)
            self.data[j.name] = prev if prev and prev["spec"] == spec else {"spec": spec, "scores": {}}
        self.before = {name: dict(d.get("cost", {})) for name, d in self.data.items()}

    def score(self, items: list[tuple[int, str, str]]) -> None:
        """Score every (prompt index, prompt, text) that lacks a score, prompt by prompt."""
        from tqdm.auto import tqdm

        from rodeco.core.judging import Item
        from rodeco.core.results import atomic_write

        for j in self.judges.judges:
            scores = self.data[j.name]["scores"]
            todo: dict[int, dict[str, tuple[str, str]]] = {}
            for index, prompt, text in items:
                k = _key(prompt, text)
                if k not in scores:
                    todo.setdefault(index, {})[k] = (prompt, text)
            for index, texts in tqdm(sorted(todo.items()), desc=f"judging {j.name}", unit="prompt"):
                keys = list(texts)
                prompt = texts[keys[0]][0]
                got = self.judges.score(
                    prompt, index, [Item(c, texts[k][1], ()) for c, k in enumerate(keys)], only=[j.name]
                )
                for c, k in enumerate(keys):
                    scores[k] = got[c][0].score
                self.data[j.name]["cost"] = self.costs()[j.name]
                atomic_write(self.path, json.dumps(self.data) + "\n")

    def costs(self) -> dict[str, dict[str, float]]:
        """Each judge's cost for the scores in the cache: the cached runs' plus this one's."""
        now = self.judges.costs()
        return {name: {k: self.before[name].get(k, 0) + v for k, v in now[name].items()} for name in self.data}

    def get(self, name: str, prompt: str, text: str) -> float:
        s = self.data[name]["scores"].get(_key(prompt, text))
        return float("nan") if s is None else float(s)


def pool_winner(pp: Any, final: np.ndarray, c: int, flops: float) -> dict:
    """Pool candidate ``c`` of prompt ``pp`` as a winner, its guide reward from ``final``."""
    cand = pp.candidates[c]
    return {
        "source": f"pool:{c}",
        "text": cand.text,
        "token_ids": cand.token_ids,
        "stop_reason": "length" if cand.stop is None else "eos",
        "parent": None,
        "forked_round": None,
        "guide": float(final[c]),
        "flops": float(flops),
    }


def getter(*path: str) -> Callable[[dict], Any]:
    """``w -> w[path[0]][path[1]]...``: one field of a winner."""
    return lambda w: reduce(lambda d, k: d[k], path, w)


def collect(
    records: list[dict],
    done: dict[int, dict],
    prompts: list[int],
    firsts: list[int],
    labels: list[str],
    pool: Any,
    sizes: list[int],
) -> dict[str, dict[tuple[int, int], dict]]:
    """``{method: {(prompt index, set): winner}}``; a winner has its text, token ids, stop reason, lineage, guide
    reward and FLOPs."""
    from rodeco.experiments.judged import best_of_prefix

    by = {r["prompt_index"]: r for r in records}
    out: dict[str, dict[tuple[int, int], dict]] = {}
    for i in prompts:
        rec, pp = by[i], pool.prompt(i)
        final = np.asarray(rec["final"], dtype=np.float64)
        for s, first in enumerate(firsts):
            ids = first + best_of_prefix(final[first : first + max(sizes)], sizes)
            for n, c in zip(sizes, ids):
                out.setdefault(f"best_of_{n}", {})[(i, s)] = pool_winner(pp, final, int(c), rec["bon"][str(n)]["flops"])
            run = (
                rec["methods"][FIXED]["1"]
                if first == 0
                else next(r for r in rec["replicates"] if r["offset"] == first)["methods"][FIXED]["1"]
            )
            out.setdefault(FIXED, {})[(i, s)] = pool_winner(pp, final, int(run["best_id"]), run["flops"])
            assert abs(out[FIXED][(i, s)]["guide"] - run["best"]) < 1e-4, (i, first)
            for label in labels:
                slot = done[i]["methods"] if first == 0 else done[i]["sets"][str(first)]
                r = slot[label]
                w = r["winner"]
                out.setdefault(label, {})[(i, s)] = {
                    "source": "live",
                    "text": w["text"],
                    "token_ids": w["token_ids"],
                    "stop_reason": w["stop_reason"],
                    "parent": w["parent"],
                    "forked_round": w["forked_round"],
                    "guide": float(r["best"]),
                    "flops": float(r["flops"]),
                }
    return out


def complete_prompts(done: dict[int, dict], rep: list[int], firsts: list[int], labels: list[str]) -> list[int]:
    def has(i: int) -> bool:
        d = done.get(i)
        return d is not None and all(
            label in (d["methods"] if f == 0 else d.get("sets", {}).get(str(f), {})) for f in firsts for label in labels
        )

    return [i for i in rep if has(i)]


def judged(
    a: Any, records: list[dict], done: dict[int, dict], rep: list[int], all_reported: bool = False
) -> dict[str, Any]:
    """Judge every method's winners on the prompts ``rep`` (the report half, or ``all_reported``: every prompt),
    analyse, print ``judge_*`` lines and write ``search_judged.json.gz``."""
    from rodeco.core.results import atomic_write
    from rodeco.rejudge import judges_by_name
    from rodeco.replays.pool import Pool

    labels = [m for m in a.methods if complete_prompts(done, rep, a.firsts, [m])]
    prompts = complete_prompts(done, rep, a.firsts, labels)
    pool = Pool(a.pool)
    sizes = set_sizes(a.firsts, len(pool.prompt(prompts[0]).candidates))
    win = collect(records, done, prompts, a.firsts, labels, pool, sizes)
    judges = judges_by_name(a.judges, "minilm_rm", (f"+judge.{LOGPROB}={{name: logprob, model: smollm2}}",))
    cache = JudgeCache(a.run_dir / "judge_cache.json", judges)
    names = [j.name for j in judges.judges if j.name != LOGPROB]
    annotate(win, pool, cache, names)
    grid = Grid(win, prompts, len(a.firsts))
    analyses, refs = judge_analyses(grid, sizes, labels, names, a.bootstrap)
    diag, split = hacking_diagnostics(grid, sizes, labels, a.bootstrap)
    corrs = judge_correlations(win, names)
    out = {
        "prompts": prompts,
        "all_reported": all_reported,
        "firsts": a.firsts,
        "sizes": sizes,
        "methods": [FIXED, *labels],
        "refs": refs,
        "judges": {n: judges.specs()[n] for n in names},
        "judge_cost": cache.costs(),
        "analysis": analyses,
        "diagnostics": diag,
        "guide_split": split,
        "correlations": corrs,
        "winners": {label: [{"prompt_index": i, "set": s, **w} for (i, s), w in m.items()] for label, m in win.items()},
    }
    raw = json.dumps(out, default=float).encode()
    atomic_write(a.run_dir / "search_judged.json.gz", gzip.compress(raw, mtime=0))
    print_judged(out, grid.P, grid.S)
    return out


def annotate(win: dict[str, dict[tuple[int, int], dict]], pool: Any, cache: JudgeCache, names: list[str]) -> None:
    """Each winner's judge scores (the texts the cache lacks scored first), its guide's parts (minilm_rm's
    embedding and surface parts) and its diagnostics (with the mean token log-prob)."""
    from rodeco.common.diagnostics import diagnose
    from rodeco.common.state import ScoreRequest
    from rodeco.plugins import BuildContext, default_plugins

    cache.score([(i, pool.prompt(i).text, w["text"]) for m in win.values() for (i, _), w in m.items()])
    guide: Any = default_plugins().build_reward({"name": "minilm_rm"}, BuildContext())  # its parts
    for m in win.values():
        reqs = [ScoreRequest(pool.prompt(i).text, w["text"], (), partial=False) for (i, _), w in m.items()]
        parts = guide.parts(reqs)
        for k, ((i, _), w) in enumerate(m.items()):
            w["judge"] = {n: cache.get(n, pool.prompt(i).text, w["text"]) for n in names}
            w["guide_parts"] = {p: float(v[k]) for p, v in parts.items()}
            lp = cache.get(LOGPROB, pool.prompt(i).text, w["text"])
            d = diagnose(w["text"], len(w["token_ids"]), w["stop_reason"])
            w["diagnostics"] = {**asdict(d), "mean_logprob": None if np.isnan(lp) else lp}


class Grid:
    """The winners' figures as ``[prompt, set]`` arrays (NaN where a figure is None): ``P`` prompts, ``S`` sets."""

    def __init__(self, win: dict[str, dict[tuple[int, int], dict]], prompts: list[int], sets: int) -> None:
        self.win, self.prompts = win, prompts
        self.P, self.S = len(prompts), sets

    def of(self, label: str, f: Callable[[dict], Any]) -> np.ndarray:
        """``f`` of each of method ``label``'s winners."""
        x = np.full((self.P, self.S), np.nan)
        for (i, s), w in self.win[label].items():
            v = f(w)
            x[self.prompts.index(i), s] = np.nan if v is None else float(v)
        return x


def judge_analyses(
    grid: Grid, sizes: list[int], labels: list[str], names: list[str], bootstrap: int
) -> tuple[dict[str, Any], list[str]]:
    """Each scorer's analysis of fixed alpha 0.5 and the search methods against Best-of-N's curve, and the
    references they are paired with. The guide is analysed like a judge: its own curve on the same prompts and
    sets."""
    from rodeco.experiments.judged import Curve, Winners, analyze

    scorers = ["guide", *names]
    val = {"guide": getter("guide"), **{n: getter("judge", n) for n in names}}
    flops = getter("flops")
    curve = Curve(
        sizes,
        np.stack([grid.of(f"best_of_{n}", val["guide"]) for n in sizes], -1),
        {sc: np.stack([grid.of(f"best_of_{n}", val[sc]) for n in sizes], -1) for sc in scorers},
        np.stack([grid.of(f"best_of_{n}", flops)[:, 0] for n in sizes], -1),
    )
    methods = {
        label: Winners(
            grid.of(label, val["guide"]), {sc: grid.of(label, val[sc]) for sc in scorers}, grid.of(label, flops)
        )
        for label in [FIXED, *labels]
    }
    refs = ["best_of_4", f"best_of_{sizes[-1]}", FIXED]
    return {sc: analyze(curve, methods, sc, refs, bootstrap) for sc in scorers}, refs


def hacking_diagnostics(
    grid: Grid, sizes: list[int], labels: list[str], bootstrap: int
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The winners' diagnostics per method (with the guide's parts), and the guide's split: each method's
    embedding and surface parts over Best-of-1's and the largest Best-of-N's, paired."""
    from rodeco.experiments.judged import diagnostics_table, paired_difference

    top = f"best_of_{sizes[-1]}"
    diag_methods = [*dict.fromkeys(["best_of_1", "best_of_4", "best_of_16", top]), FIXED, *labels]
    parts_of = {
        label: {p: grid.of(label, getter("guide_parts", p)) for p in ("embedding", "surface")} for label in diag_methods
    }
    diag = diagnostics_table(
        {
            label: {
                **{f: grid.of(label, getter("diagnostics", f)) for f in DIAG_FIELDS},
                **{f"guide_{p}": x for p, x in parts_of[label].items()},
            }
            for label in diag_methods
        },
        bootstrap,
    )
    split = {
        label: {
            f"{p}_over_{ref}": paired_difference(parts_of[label][p], parts_of[ref][p], bootstrap)
            for ref in ("best_of_1", top)
            if ref != label
            for p in ("embedding", "surface")
        }
        for label in diag_methods
        if label != "best_of_1"
    }
    return diag, split


def judge_correlations(win: dict[str, dict[tuple[int, int], dict]], names: list[str]) -> dict[str, dict[str, Any]]:
    """Each judge's correlations (with the prompt, the length and the guide) over every distinct winner, and over
    Best-of-1's."""
    distinct = {(i, w["text"]): w for m in win.values() for (i, _), w in m.items() if w["text"]}
    plain = {(i, w["text"]): w for (i, _), w in win["best_of_1"].items() if w["text"]}
    return {n: {"every_winner": _correlations(distinct, n), "best_of_1": _correlations(plain, n)} for n in names}


def _correlations(texts: dict[tuple[int, str], dict], n: str) -> dict[str, Any]:
    from rodeco.experiments.judged import correlations

    col = lambda f: np.array([f(k, w) for k, w in texts.items()], dtype=np.float64)  # noqa: E731
    return correlations(
        col(lambda k, w: k[0]),
        col(lambda k, w: w["judge"][n]),
        col(lambda k, w: len(k[1])),
        col(lambda k, w: w["guide"]),
    )


def print_judged(out: dict, P: int, S: int) -> None:
    from rodeco.experiments.judged import analysis_lines, ci_text

    top = out.get("sizes", SIZES)[-1]
    firsts = ", ".join(f"streams {f}..{f + top - 1}" for f in out["firsts"])
    which = "prompts (all reported)" if out.get("all_reported") else "report-half prompts"
    print(f"judge_prompts: {P} {which} x {S} candidate sets ({firsts}); 95% bootstrap CIs over prompts and sets")
    for name, c in out["judge_cost"].items():
        print(
            f"judge_cost_{name}: {c['calls']} calls, {c['tokens']} tokens, {c['flops'] / 1e12:.3f} TFLOPs, "
            f"{c['seconds']:.1f} s (not charged to any method)"
        )
    print("\n".join(analysis_lines(out["analysis"], out["refs"])))
    for name, by in out.get("correlations", {}).items():
        print(
            f"judge_{name}_correlations: "
            + "; ".join(
                f"{which} ({c['texts']} texts): Pearson r with log characters {c['pearson_log_chars']:+.3f}, "
                f"Spearman rho with the guide {c['spearman_guide']:+.3f}, "
                f"within a prompt {c['spearman_guide_within_prompt']:+.3f} (mean over {c['prompts_within']} prompts)"
                for which, c in by.items()
            )
        )
    for label, d in out.get("guide_split", {}).items():  # minilm_rm = its embedding part + its surface part
        print(f"guide_split_{label}: " + "; ".join(f"{k} {ci_text(v)}" for k, v in d.items()))
    for label, d in out["diagnostics"].items():
        print(
            f"diag_{label}: "
            + "; ".join(f"{k} {v['value']:.3f} [{v['ci'][0]:.3f}, {v['ci'][1]:.3f}]" for k, v in d.items())
        )
