"""A judge's Best-of-N gain with the change in length controlled, from a judged search snapshot (the report half's
winners with their texts and judge scores: ``docs/data/search_judged_af100x128.json.gz``)::

    python scripts/length_controlled.py docs/data/search_judged_af100x128.json.gz --judge chrf

Three figures, on the snapshot's prompts (the report half) and both candidate sets:

- **raw gain**: the mean over (prompt, set) of ``judge(Best-of-64) - judge(Best-of-1)``;
- **length-controlled gain**: the intercept of the least-squares line of that difference on the difference in log
  characters (``log len(Best-of-64's text) - log len(Best-of-1's text)``) over the same (prompt, set) pairs: the gain
  the data predict where the winner's length does not change;
- **within-prompt correlation**: Pearson's r between the judge and log characters over every distinct winner text
  (every method, both sets), each taken as its deviation from its prompt's mean.

The CIs are a paired bootstrap over prompts (a drawn prompt brings both its sets; the raw and the controlled gain are
computed on the same draws), 95% percentile intervals. Both sets share a prompt's pool, so the sets are not resampled
here (``results_tables``' judge-curves table also resamples them, which widens its raw CI).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from rodeco.experiments.bootstrap import ci, draws


def load(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def log_chars(text: str) -> float:
    return float(np.log(max(len(text), 1)))


def table(snap: dict[str, Any], method: str, field: Any) -> np.ndarray:
    """``[prompts, sets]`` of ``field(winner)`` for ``method``'s winners (NaN where a winner is missing)."""
    prompts, sets = snap["prompts"], len(snap["firsts"])
    pos = {p: k for k, p in enumerate(prompts)}
    x = np.full((len(prompts), sets), np.nan)
    for w in snap["winners"][method]:
        if w["prompt_index"] in pos:
            v = field(w)
            x[pos[w["prompt_index"]], w["set"]] = np.nan if v is None else float(v)
    return x


def intercepts(dj: np.ndarray, dl: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per bootstrap draw (``counts`` ``[B, P]``: how often each prompt is drawn) the mean of ``dj`` and the
    least-squares intercept and slope of ``dj`` on ``dl`` (both ``[P, S]``) over the drawn (prompt, set) pairs."""
    S = dj.shape[1]
    n = counts.sum(1) * S
    sy, sx = counts @ dj.sum(1), counts @ dl.sum(1)
    sxx, sxy = counts @ (dl**2).sum(1), counts @ (dl * dj).sum(1)
    slope = (sxy - sx * sy / n) / (sxx - sx**2 / n)
    return sy / n, sy / n - slope * sx / n, slope


def within_prompt_r(snap: dict[str, Any], judge: str) -> tuple[float, int]:
    """Pearson's r of the judge with log characters over every distinct non-empty winner text, deviations from
    each prompt's means; and how many texts."""
    texts: dict[tuple[int, str], float] = {}
    keep = set(snap["prompts"])
    for winners in snap["winners"].values():
        for w in winners:
            s = w["judge"].get(judge)
            if w["prompt_index"] in keep and w["text"] and s is not None and np.isfinite(s):
                texts[(w["prompt_index"], w["text"])] = float(s)
    prompt = np.array([k[0] for k in texts])
    j = np.array(list(texts.values()))
    lc = np.array([log_chars(k[1]) for k in texts])
    for p in np.unique(prompt):
        m = prompt == p
        j[m] -= j[m].mean()
        lc[m] -= lc[m].mean()
    return float(np.corrcoef(j, lc)[0, 1]), len(texts)


def analyse(snap: dict[str, Any], judge: str, top: int = 64, resamples: int = 10000, seed: int = 0) -> dict:
    if "winners" not in snap or "prompts" not in snap:
        raise SystemExit(
            "this snapshot holds no winners' texts (prompts, winners): give a judged search snapshot such as "
            "docs/data/search_judged_af100x128.json.gz"
        )
    for m in ("best_of_1", f"best_of_{top}"):
        if m not in snap["winners"]:
            raise SystemExit(f"the snapshot has no {m} winners (it has {sorted(snap['winners'])})")
    score = lambda w: w["judge"].get(judge)  # noqa: E731
    j1, jt = table(snap, "best_of_1", score), table(snap, f"best_of_{top}", score)
    if np.isnan(j1).all():
        names = sorted({k for ws in snap["winners"].values() for w in ws for k in w["judge"]})
        raise SystemExit(f"no {judge} scores in the snapshot (judges: {names})")
    length = lambda w: log_chars(w["text"])  # noqa: E731
    l1, lt = table(snap, "best_of_1", length), table(snap, f"best_of_{top}", length)
    ok = np.isfinite(j1 + jt + l1 + lt).all(1)  # prompts with both winners scored in every set
    dj, dl = (jt - j1)[ok], (lt - l1)[ok]
    P = len(dj)
    idx = draws(P, resamples, seed)
    counts = np.zeros((resamples + 1, P))
    counts[0] = 1  # draw 0: the data itself
    np.add.at(counts, (np.arange(1, resamples + 1)[:, None], idx), 1)
    raw, controlled, slope = intercepts(dj, dl, counts)
    r, texts = within_prompt_r(snap, judge)
    return {
        "judge": judge,
        "top": top,
        "prompts": P,
        "sets": int(dj.shape[1]),
        "all_reported": bool(snap.get("all_reported", False)),
        "resamples": resamples,
        "seed": seed,
        "raw_gain": {"value": float(raw[0]), "ci": ci(raw[1:])},
        "controlled_gain": {"value": float(controlled[0]), "ci": ci(controlled[1:])},
        "slope_per_log_char": {"value": float(slope[0]), "ci": ci(slope[1:])},
        "mean_log_char_change": float(dl.mean()),
        "within_prompt_r": r,
        "within_prompt_texts": texts,
    }


def fmt(x: dict[str, Any], f: str = "+.2f") -> str:
    return f"{x['value']:{f}} [{x['ci'][0]:{f}}, {x['ci'][1]:{f}}]"


def report(out: dict[str, Any]) -> list[str]:
    j, t = out["judge"], out["top"]
    half = "every prompt" if out["all_reported"] else "report half"
    return [
        f"{j}: Best-of-{t} - Best-of-1 on {out['prompts']} prompts ({half}) x {out['sets']} candidate sets; paired "
        f"bootstrap over prompts, {out['resamples']} resamples (seed {out['seed']}), 95% CIs",
        f"raw_gain: {fmt(out['raw_gain'])}",
        f"controlled_gain: {fmt(out['controlled_gain'])} (intercept of the gain on the change in log characters; "
        f"mean change {out['mean_log_char_change']:+.3f}, slope {fmt(out['slope_per_log_char'])} per log character)",
        f"within_prompt_r_log_chars: {out['within_prompt_r']:+.2f} ({out['within_prompt_texts']} distinct winner "
        "texts, deviations from their prompt's means)",
    ]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("snapshot", type=Path, help="a judged search snapshot (.json or .json.gz) with winners' texts")
    ap.add_argument("--judge", default="chrf", help="the judge whose gain is measured (default chrf)")
    ap.add_argument("--top", type=int, default=64, help="the Best-of-N compared with Best-of-1 (default 64)")
    ap.add_argument("--resamples", type=int, default=10000, help="bootstrap resamples (default 10000)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if not a.snapshot.is_file():
        raise SystemExit(f"no such snapshot: {a.snapshot}")
    out = analyse(load(a.snapshot), a.judge, a.top, a.resamples, a.seed)
    print("\n".join(report(out)))
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
