"""``allocate``: cross-prompt allocation of the forced rejections (the idea of AdaBoN, arXiv 2505.12050). With
several prompts in one batch (``data.batch_prompts``) the batch's memory is shared: a decision point must free
``min_reject_total`` rows *in all*, not a fixed share of each prompt.

Each row's chance to be its prompt's eventual best is modelled as by ``calibrated`` (the calibration's rho(L) and
residual sd, the scale fixed at the prompt's first decision point, finished candidates placed by the calibration's
link where it has one: ``rodeco.best_probability``). Each prompt first rejects what ``calibrated`` would on its own
(its least likely rows while the chance that its eventual best is among them stays at most ``delta``). The
rejections the budget still forces are then taken, one row at a time, from the row with the smallest chance in the
whole batch, always keeping one row per prompt. The sum of the rejected rows' chances is the expected number of
prompts that lose their eventual best; taking the smallest chances first makes it as small as the forced count
allows. A prompt whose leader is already clear (its other rows' chances are small) gives up rows; a prompt whose
ranking is still open (every row near 1/k) keeps them. With one prompt per batch it is ``calibrated`` exactly.
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np

from rodeco import BuildContext, PromptView, RoundView, best_probability, keep_best, rejectable
from rodeco_policies.calibrated import CalibratedParams, CalibratedPolicy, build_calibrated, predicted


class AllocatePolicy(CalibratedPolicy):
    def chances(self, pv: PromptView) -> np.ndarray:
        """Each row's modelled chance to be the prompt's eventual best."""
        scale = self.references.scale(pv)
        L = pv.tokens_generated
        return np.asarray(
            best_probability(
                predicted(self.cal.rho(L), scale.z(pv.scores)), self.cal.sd(L), self.finished_best(pv, scale)
            ),
            dtype=np.float64,
        )

    def select(self, view: RoundView) -> list[list[int]]:
        if len(view.prompts) == 1:
            return super().select(view)
        chances = [self.chances(pv) for pv in view.prompts]
        n_rej = [min(pv.k - 1, int(rejectable(p, self.delta))) for pv, p in zip(view.prompts, chances)]
        ranked = [np.sort(p) for p in chances]  # least likely first
        heap = [(float(r[n]), i) for i, (r, n, pv) in enumerate(zip(ranked, n_rej, view.prompts)) if n < pv.k - 1]
        heapq.heapify(heap)
        for _ in range(max(0, view.min_reject_total - sum(n_rej))):  # the forced rest: smallest chances first
            if not heap:
                break
            _, i = heapq.heappop(heap)
            n_rej[i] += 1
            if n_rej[i] < view.prompts[i].k - 1:
                heapq.heappush(heap, (float(ranked[i][n_rej[i]]), i))
        # a row's chance grows with its score: the n lowest scores are the n least likely rows. keep_best, not
        # keep_top: a prompt may reject fewer than its min_reject, since only the batch's total is checked
        return [keep_best(pv, n) for pv, n in zip(view.prompts, n_rej)]


def build_allocate(params: dict[str, Any], ctx: BuildContext) -> AllocatePolicy:
    pol = build_calibrated(params, ctx)
    return AllocatePolicy(pol.cal, pol.delta, pol.simulations)


AllocateParams = CalibratedParams
