"""Decision-time scorers: the ``partial_reward`` role (its default ``same`` changes nothing; another scorer decides
while ``reward`` picks the winner; each role's cost is reported), and hidden states for rewards that ask."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from rodeco.common.budget import Budget, full_length_tokens
from rodeco.common.sampling import SamplingParams
from rodeco.common.state import PolicyInfo
from rodeco.common.validation import ConfigError
from rodeco.core.contracts import Scorer
from rodeco.core.loop import LoopSettings, decode_batch
from rodeco.plugins import BuildContext, default_plugins

PROMPTS = [(0, "write a haiku about autumn leaves"), (1, "give three tips")]


class HiddenProbe:
    """A partial reward that records the hidden states it is given, and scores by their first coordinate."""

    needs_hidden_states = True

    def __init__(self) -> None:
        self.seen: list = []

    def score(self, requests):
        self.seen += list(requests)
        return [float(r.hidden_state[0]) for r in requests]


def settings(gen, n: int = 6) -> LoopSettings:
    """A budget that forces decision points after about 4 and 8 tokens (in blocks: after the first block)."""
    lens = [len(gen.encode(t)) for _, t in PROMPTS]
    P, rows = max(lens), len(PROMPTS) * n
    kv = full_length_tokens(n, lens, 4, gen.kv) if gen.kv.shares_prefix else rows * (P + 4)
    new = 12 if gen.kv.block == 1 else 3 * gen.kv.block
    return LoopSettings(
        n=n, sampling=SamplingParams(1.0, 0, 1.0), max_new_tokens=new, budget=Budget(kv, 2), seed=3, all_candidates=True
    )


def reward(ctx_gen):
    return default_plugins().build_reward({"name": "logprob", "form": "mean"}, BuildContext(generator=ctx_gen))


def fixed(alpha: float = 0.5):
    return default_plugins().build_policy({"name": "fixed", "alpha": alpha}, BuildContext())


@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_hidden_state_equals_a_fresh_forward_pass(tiny_gen, engine):
    """At every decision point (rows pruned in between), a partial request's hidden state is the final-layer state a
    fresh forward pass over the prompt and all response tokens but the last gives at its last position."""
    gen = tiny_gen(engine)
    probe = HiddenProbe()
    decode_batch(
        gen,
        Scorer(reward(gen), "logprob"),
        fixed(0.2),
        PROMPTS,
        settings(gen),
        partial=Scorer(probe, "probe", "partial_reward"),
    )
    lengths = {len(r.response_ids) for r in probe.seen}
    assert len(lengths) >= 2, "want several decision points, with pruning between them"
    model = gen.model
    for r in probe.seen:
        ids = gen.encode(r.prompt) + list(r.response_ids[:-1])
        with torch.no_grad():
            ref = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1]
        assert r.hidden_state is not None and r.hidden_state.shape == ref.shape
        np.testing.assert_allclose(r.hidden_state, ref.numpy(), atol=2e-4, rtol=1e-3)


@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_a_finished_response_carries_its_last_steps_state(tiny_gen, engine):
    """A hidden-state reward picking the winner gets each finished response's last step's state: after reading the
    whole response where it ended by EOS, after all of it but its last token where it was cut at its length, as a
    fresh forward pass gives it, though finished rows wait in the batch (stepped on padding) until they leave."""
    gen = tiny_gen(engine)
    probe = HiddenProbe()
    s = dataclasses.replace(settings(gen, n=16), max_new_tokens=64, budget=Budget(None, 2))
    results, _ = decode_batch(gen, Scorer(probe, "probe"), fixed(0.0), PROMPTS, s)
    reason = {(r.prompt_index, c.candidate_id): c.stop_reason for r in results for c in r.candidates}
    finals = [r for r in probe.seen if not r.partial]
    assert {reason[r.prompt_index, r.candidate_id] for r in finals} >= {"eos", "length"}
    model = gen.model
    for r in finals:
        read = list(r.response_ids) if reason[r.prompt_index, r.candidate_id] == "eos" else list(r.response_ids[:-1])
        with torch.no_grad():
            ref = model.model(input_ids=torch.tensor([gen.encode(r.prompt) + read])).last_hidden_state[0, -1]
        np.testing.assert_allclose(r.hidden_state, ref.numpy(), atol=2e-4, rtol=1e-3)


def test_same_is_the_reward_deciding(tiny_gen):
    """partial=None and partial=the same scorer are one run: same winners, candidates, rounds and compute."""
    gen = tiny_gen()
    r = Scorer(reward(gen), "logprob")
    a, ca = decode_batch(gen, r, fixed(), PROMPTS, settings(gen))
    b, cb = decode_batch(gen, r, fixed(), PROMPTS, settings(gen), partial=r)
    assert _same_but_time(a, b)
    assert (ca.gen_flops, ca.reward_flops, ca.reward_calls) == (cb.gen_flops, cb.reward_flops, cb.reward_calls)
    assert 0 < ca.partial_reward_calls < ca.reward_calls


def _same_but_time(a, b) -> bool:
    def strip(x):
        d = x.to_dict()
        d["compute"].pop("time_s")
        return d

    return [strip(x) for x in a] == [strip(x) for x in b]


class Length:
    def score(self, requests):
        return [float(len(r.response_ids)) for r in requests]


def test_another_scorer_decides_and_each_role_is_charged(tiny_gen):
    """The partial scorer alone decides who survives; the reward alone scores finished rows; the compute report
    splits their requests."""
    gen = tiny_gen()
    final = Scorer(reward(gen), "logprob")
    probe = HiddenProbe()
    res, comp = decode_batch(
        gen, final, fixed(), PROMPTS, settings(gen), partial=Scorer(probe, "probe", "partial_reward")
    )
    assert probe.seen and all(r.partial for r in probe.seen)
    rejected = [c for p in res for c in p.candidates if c.stop_reason == "rejected"]
    assert rejected
    for p in res:  # each round's survivors are the probe's top scores
        for rnd in p.rounds:
            if rnd.rejected_ids:
                assert min(rnd.scores[c] for c in rnd.kept_ids) >= max(rnd.scores[c] for c in rnd.rejected_ids)
    finals = {c.candidate_id: c.score for p in res for c in p.candidates if c.finished}
    assert finals and all(s <= 0 for s in finals.values())  # mean log-probs, not the probe's hidden coordinates
    assert comp.partial_reward_calls >= 1 and comp.reward_calls > comp.partial_reward_calls
    assert "partial_score" in comp.time_s and "score" in comp.time_s


# --- calibration and the calibrated policy -------------------------------------------------------------------------


def calibration(rho: float, sd: float, **ident):
    from rodeco import Calibration

    return Calibration(
        generator=ident.get("generator", "g"),
        partial_reward=ident.get("partial_reward", "r"),
        reward=ident.get("reward", "r"),
        lengths=[4, 64],
        slope=[rho, rho],
        resid_sd=[sd, sd],
    )


def calibrated(cal, delta: float = 0.05):
    from rodeco_policies.calibrated import CalibratedPolicy

    return CalibratedPolicy(cal, delta, simulations=50)


def view(scores, min_reject: int, length: int = 16):
    from rodeco import PromptView, RoundView

    k = len(scores)
    pv = PromptView(
        prompt_index=0,
        candidate_ids=list(range(k)),
        scores=np.asarray(scores, dtype=float),
        history=np.zeros((k, 0)),
        finished_scores=[],
        tokens_generated=length,
        min_reject=min_reject,
    )
    return RoundView(round=0, prompts=[pv], max_rows_next=k - min_reject, max_new_tokens=128)


@pytest.mark.parametrize("min_reject", [0, 3])
def test_calibrated_with_rho_one_keeps_only_the_top_row(min_reject):
    scores = [0.3, 2.0, -1.0, 0.9, 1.1, 0.2, -0.4, 1.7]
    assert calibrated(calibration(1.0, 0.0)).select(view(scores, min_reject)) == [[1]]


@pytest.mark.parametrize("min_reject", [0, 1, 5])
def test_calibrated_with_rho_zero_rejects_exactly_the_forced_minimum(min_reject):
    scores = [0.3, 2.0, -1.0, 0.9, 1.1, 0.2, -0.4, 1.7]
    keep = calibrated(calibration(0.0, 1.0)).select(view(scores, min_reject))[0]
    assert len(keep) == len(scores) - min_reject
    assert sorted(keep) == sorted(np.argsort(scores)[::-1][: len(keep)].tolist())  # the top rows


def test_calibrated_rejects_more_where_partial_scores_predict_more():
    scores = np.random.default_rng(0).standard_normal(32)
    cal = calibration(0.0, 1.0)
    cal.lengths, cal.slope, cal.resid_sd = [8, 64], [0.1, 0.9], [0.99, 0.44]
    pol = calibrated(cal)
    assert len(pol.select(view(scores, 0, 64))[0]) < len(pol.select(view(scores, 0, 8))[0]) <= 32


def test_a_calibration_of_another_generator_or_reward_is_refused(tmp_path):
    from rodeco_policies.calibrated import build_calibrated

    f = tmp_path / "cal.json"
    calibration(0.5, 0.8, generator="smollm2", reward="minilm_rm:abc", partial_reward="minilm_rm:abc").save(f)
    ok = {"generator": "smollm2", "reward": "minilm_rm:abc", "partial_reward": "minilm_rm:abc"}
    build_calibrated({"calibration": str(f)}, BuildContext(identities=ok))
    for key, other in (("generator", "llama-8b"), ("reward", "logprob")):
        run = {**ok, key: other}
        with pytest.raises(ConfigError) as e:
            build_calibrated({"calibration": str(f)}, BuildContext(identities=run))
        msg = str(e.value)
        assert ok[key] in msg and other in msg and key in msg


def test_the_committed_calibration_is_the_embedded_pairs():
    from rodeco import Calibration
    from rodeco_policies.calibrated import DEFAULT

    cal = Calibration.load(DEFAULT)
    assert cal.generator == "smollm2" and cal.reward.startswith("minilm_rm:") and cal.partial_reward == cal.reward
    assert len(cal.source["prompts"]) >= 150 and cal.source["candidates"] >= 32
    assert all(0 <= cal.rho(L) <= 1 for L in (1, 8, 64, 1000))
    # measured with the final link, so that the calibrated policy places finished candidates (rule 2)
    assert all(cal.final_link(L) is not None and cal.final_link(L)[1] > 0 for L in (4, 16, 96))


def test_n_calibrated_asks_the_policy_for_its_start(tiny_gen):
    gen = tiny_gen()
    r = Scorer(reward(gen), "logprob")
    s = settings(gen, n=6)
    starts = []

    class Chooser:
        info = PolicyInfo(chooses_start=True)

        def select(self, view):
            return [list(range(pv.k - pv.min_reject)) for pv in view.prompts]

        def choose_start(self, sv):
            starts.append(sv)
            return 3

    import dataclasses

    res, _ = decode_batch(gen, r, Chooser(), PROMPTS, dataclasses.replace(s, n="policy", policy_name="chooser"))
    assert starts and all(p.n_start == 3 for p in res) and starts[0].max_rows >= 3
    with pytest.raises(ConfigError, match="does not choose a start"):
        decode_batch(gen, r, fixed(), PROMPTS, dataclasses.replace(s, n="policy", policy_name="fixed"))
    with pytest.raises(ConfigError, match="finite budget"):
        decode_batch(gen, r, Chooser(), PROMPTS, dataclasses.replace(s, n="policy", budget=Budget(None, 2)))


def test_the_calibrated_start_follows_predictiveness():
    """Under a predictive calibration the modelled speedup favours a large start; under an unpredictive one, the
    rows that fit at full length (Best-of-N: rejecting blind wastes the tokens)."""
    from rodeco import StartView

    sv = StartView(kv_tokens=4 * 128, base=0, max_rows=64, max_new_tokens=128, min_tokens_per_round=8)
    assert calibrated(calibration(0.0, 1.0)).choose_start(sv) == 4
    assert calibrated(calibration(0.95, 0.3)).choose_start(sv) > 4


def test_a_live_run_with_policy_calibrated_and_n_calibrated(tmp_path, tiny_gen):
    """Through the config: the run's identities reach the policy (a calibration of this generator and reward is
    accepted, the committed one of another is refused), and n=policy starts where the policy says."""
    from helpers import run_tiny

    gen = tiny_gen()
    f = tmp_path / "cal.json"
    cal = calibration(0.9, 0.4, generator="tiny", reward="logprob:form=mean", partial_reward="logprob:form=mean")
    cal.save(f)
    ov = ["budget.kv_tokens=600", "sampling.max_new_tokens=24", f"policy.calibration={f}"]
    from rodeco_policies.calibrated import CalibratedPolicy

    chosen = []  # (the view the loop gave the policy, the start it chose)
    choose = CalibratedPolicy.choose_start

    def spy(self, view):
        chosen.append((view, choose(self, view)))
        return chosen[-1][1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(CalibratedPolicy, "choose_start", spy)
        out = run_tiny(gen, [p for _, p in PROMPTS], n="policy", policy="calibrated", overrides=ov)
    assert len(chosen) == 1  # one batch of both prompts: one start
    view, start = chosen[0]
    assert view.max_rows > 1 and 1 <= start <= view.max_rows
    assert [r.n_start for r in out.results] == [start, start]  # every prompt starts where the policy said
    assert [len(r.candidates) for r in out.results] == [start, start]  # output.all_candidates: every row started
    assert all(r.best.score is not None for r in out.results)
    with pytest.raises(ConfigError, match="the run's 'tiny'"):
        run_tiny(gen, [PROMPTS[0][1]], n="policy", policy="calibrated", overrides=ov[:2])


def test_composite_works_in_either_role(tiny_gen):
    """A composite partial reward decides exactly as its component would (here one logprob form); as the reward it
    scores finished rows while another scorer decides."""
    gen = tiny_gen()
    plugins, ctx = default_plugins(), BuildContext(generator=gen)
    comp = {"name": "composite", "components": {"lp": {"name": "logprob", "form": "mean"}}, "weights": {"lp": 1.0}}
    final = Scorer(plugins.build_reward({"name": "logprob", "form": "sum"}, ctx), "logprob")
    as_partial = Scorer(plugins.build_reward(comp, ctx), "composite", "partial_reward")
    direct = Scorer(reward(gen), "logprob", "partial_reward")
    a, _ = decode_batch(gen, final, fixed(), PROMPTS, settings(gen), partial=as_partial)
    b, _ = decode_batch(gen, final, fixed(), PROMPTS, settings(gen), partial=direct)
    assert [[r.scores for r in p.rounds] for p in a] == [[r.scores for r in p.rounds] for p in b]
    assert sum(len(p.rounds) for p in a) > 0
    c, cc = decode_batch(
        gen,
        Scorer(plugins.build_reward(comp, ctx), "composite"),
        fixed(),
        PROMPTS,
        settings(gen),
        partial=Scorer(HiddenProbe(), "probe", "partial_reward"),
    )
    assert all(x.score <= 0 for p in c for x in p.candidates if x.finished) and cc.partial_reward_calls > 0


def test_nothing_shipped_was_fit_on_an_evaluation_prompt():
    """The committed calibrations and learned heads were measured and trained on training prompts only: none of
    their prompts is one of the evaluation sets' (AlpacaFarm/HH subsets, the demo), by position and by text."""
    import json

    from conftest import REPO, SHARED_DATA

    import rodeco
    from rodeco.core.data import prompts_of

    held: set[str] = set()
    for name in ("alpacafarm100", "specrej100", "demo"):
        cfg = rodeco.load_config([f"data={name}", "data.limit=null", f"data.root={SHARED_DATA}"])
        held |= {p.text.strip() for p in prompts_of(cfg.data)}
    hh = json.loads((SHARED_DATA / "prompts" / "specrej_hh_rlhf_100.json").read_text())
    held |= {r["prompt"].strip() for r in hh}
    texts = [
        json.loads(line)["prompt"].strip()
        for line in (SHARED_DATA / "prompts" / "alpaca_eval_805.jsonl").read_text().splitlines()
    ]
    used = {}
    for f in (REPO / "plugins" / "rodeco_policies" / "calibrations").glob("*.json"):
        used[f.name] = json.loads(f.read_text())["source"]["prompts"]
    for kind in ("value_head", "text_value", "minilm_prefix_head"):
        meta = json.loads((REPO / "plugins" / "rodeco_rewards" / "assets" / f"{kind}.json").read_text())
        # every prompt list a head records: train/validation (older heads) or fit/choose/verdict
        used[kind] = [i for key, idx in meta.items() if key.endswith("_prompts") for i in idx]
        assert len(used[kind]) >= 150 and ("train_prompts" in meta or "fit_prompts" in meta)
    # the prefix head's preference pairs: the evaluation prompts' instructions were held out, as rm_train's
    prefix = json.loads((REPO / "plugins" / "rodeco_rewards" / "assets" / "minilm_prefix_head.json").read_text())
    assert prefix["held_out"]["files"] == ["prompts/specrej_alpaca_farm_100.json", "prompts/specrej_hh_rlhf_100.json"]
    assert prefix["pairs"]["evaluation_pairs_removed"] > 0
    assert len(used) >= 5
    for what, idx in used.items():
        clash = [i for i in idx if texts[i] in held]
        assert not clash, f"{what} was fit on evaluation prompts {clash[:5]}"
