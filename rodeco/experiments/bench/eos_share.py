"""Where Best-of-N's winners end, at several ``max_new_tokens``, from one pool. A run at ``max_new_tokens=L`` draws
the same tokens as the pool's run at a larger ``M`` up to its cut (each row's sampling does not depend on the
limit), so its candidates are the pool's candidates cut at ``L`` tokens. Each cut is scored by the guide
(``minilm_rm``, the default reward, as a finished response), and for every cut this prints the share of all
candidates that end by EOS and the share of Best-of-N's winners that do (the guide's best of each prompt's first N
candidates), with bootstrap 95% CIs over prompts::

    python scripts/eos_share.py pools/af32x512 --cuts 128 256 512 --n 16
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np


def cut_requests(pool, index: int, cut: int, tokenizer) -> tuple[list, np.ndarray]:
    """Prompt ``index``'s candidates cut at ``cut`` tokens, as finished responses, and whether each ends by EOS."""
    from rodeco.common.state import ScoreRequest

    pp = pool.prompt(index)
    reqs, eos = [], []
    for c in pp.candidates:
        whole = c.stop is not None and len(c.token_ids) <= cut
        ids = c.token_ids if whole else c.token_ids[:cut]
        text = c.text if whole or len(ids) == len(c.token_ids) else tokenizer.decode(ids, skip_special_tokens=True)
        reqs.append(ScoreRequest(pp.text, text, tuple(ids), partial=False, prompt_index=index))
        eos.append(whole)
    return reqs, np.array(eos)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pool", type=Path)
    ap.add_argument("--cuts", nargs="+", type=int, required=True, help="max_new_tokens to look at (<= the pool's)")
    ap.add_argument("--n", nargs="+", type=int, default=[16], help="Best-of-N's N (each prompt's first N candidates)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    a = ap.parse_args(argv)
    from transformers import AutoTokenizer

    from rodeco.experiments.bootstrap import mean_ci as boot  # the same bootstrap over prompts as arith_bench's
    from rodeco.plugins import BuildContext, default_plugins
    from rodeco.replays.pool import Pool

    pool = Pool(a.pool)
    M = int(pool.settings["max_new_tokens"])
    if max(a.cuts) > M:
        ap.error(f"--cuts {max(a.cuts)}: the pool was recorded at max_new_tokens={M}; cut at {M} or less")
    if max(a.n) > pool.candidates:
        ap.error(f"--n {max(a.n)}: the pool holds {pool.candidates} candidates per prompt")
    tok = AutoTokenizer.from_pretrained(a.pool / "tokenizer")
    guide = default_plugins().build_reward({"name": "minilm_rm"}, BuildContext())
    indices = pool.indices()
    out: dict = {"pool": a.pool.name, "prompts": len(indices), "cuts": {}}  # by name: no path of this machine
    print(f"{len(indices)} prompts of {a.pool}; 95% bootstrap CIs over prompts")
    for cut in a.cuts:
        eos_all: list[float] = []
        eos_win: dict[int, list[float]] = {n: [] for n in a.n}
        for i in indices:
            reqs, eos = cut_requests(pool, i, cut, tok)
            score = np.asarray(guide.score(reqs), dtype=np.float64)
            eos_all.append(eos.mean())
            for n in a.n:
                eos_win[n].append(float(eos[int(np.argmax(score[:n]))]))
        row: dict[str, Any] = {"candidates_eos": float(np.mean(eos_all)), "candidates_eos_ci": boot(np.array(eos_all))}
        for n, x in eos_win.items():
            row[f"best_of_{n}_eos"], row[f"best_of_{n}_eos_ci"] = float(np.mean(x)), boot(np.array(x))
        out["cuts"][str(cut)] = row
        print(
            f"eos_share max_new_tokens={cut}: candidates {row['candidates_eos']:.3f} "
            f"[{row['candidates_eos_ci'][0]:.3f}, {row['candidates_eos_ci'][1]:.3f}]; "
            + "; ".join(
                f"Best-of-{n}'s winners {row[f'best_of_{n}_eos']:.3f} "
                f"[{row[f'best_of_{n}_eos_ci'][0]:.3f}, {row[f'best_of_{n}_eos_ci'][1]:.3f}]"
                for n in a.n
            )
        )
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
