"""``logprob``: the mean / sum / perplexity forms, and scoring with a separate LM (re-tokenized from text)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import make_tiny_llama

import rodeco
from rodeco import hookimpl
from rodeco.common.state import ScoreRequest
from rodeco.common.validation import ConfigError
from rodeco.plugins import BuildContext, get_plugin_manager
from rodeco_rewards import value_function
from rodeco_rewards.lm_scorer import LMScorer
from rodeco_rewards.logprob import LogProbReward, aggregate, build_logprob

LPS = (-1.0, -2.0, -0.5)


@pytest.mark.parametrize("form, want", [("mean", -3.5 / 3), ("sum", -3.5), ("perplexity", -math.exp(3.5 / 3))])
def test_forms(form, want):
    r = build_logprob({"form": form}, BuildContext())
    assert r.needs_logprobs
    reqs = [ScoreRequest("p", "abc", (1, 2, 3), True, logprobs=LPS), ScoreRequest("p", "", (), False, logprobs=())]
    assert r.score(reqs) == pytest.approx([want, -1e3])


def test_default_is_the_mean_as_before():
    assert LogProbReward().score([ScoreRequest("p", "ab", (1, 2), True, logprobs=(-1.0, -3.0))]) == [-2.0]


def test_perplexity_stays_finite():
    assert math.isfinite(aggregate([-5000.0], "perplexity", -1e3))


@pytest.mark.parametrize(
    "params, key",
    [
        ({"form": "median"}, "reward.form"),
        ({"beta": 1}, "reward.beta"),
        ({"model": "/no/such/model"}, "reward.model"),
        ({"model": "x", "batch_tokens": 0}, "reward.batch_tokens"),
    ],
)
def test_config_errors(params, key):
    with pytest.raises(ConfigError) as e:
        build_logprob(params, BuildContext())
    assert e.value.key == key


@pytest.fixture(scope="module")
def scoring_lm_dir(tmp_path_factory, tiny_tokenizer):
    path = tmp_path_factory.mktemp("scoring_lm")
    make_tiny_llama(len(tiny_tokenizer), seed=5).save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return str(path)


def test_separate_lm_matches_a_manual_forward_and_ignores_batch(scoring_lm_dir):
    r = build_logprob({"model": scoring_lm_dir, "device": "cpu", "form": "sum", "batch_tokens": 48}, BuildContext())
    assert not r.needs_logprobs  # the loop need not collect the generator's
    lm = r.lm
    reqs = [
        ScoreRequest("give three tips", "sleep and water", (), True),
        ScoreRequest("why is the sky blue", "light scatters in the air, mostly blue light", (), False),
        ScoreRequest("give three tips", "", (), True),
    ]
    scores = r.score(reqs)
    for q, s in zip(reqs[:2], scores):
        p_ids, r_ids = lm.prompt_ids(q.prompt), lm.response_ids(q.response)
        ids = torch.tensor([p_ids + r_ids])
        lp = torch.log_softmax(lm.model(input_ids=ids).logits[0].float(), -1)
        want = sum(lp[len(p_ids) - 1 + t, tok].item() for t, tok in enumerate(r_ids))
        assert s == pytest.approx(want, abs=1e-4)
    assert scores[2] == -1e3
    assert [r.score([q])[0] for q in reqs] == pytest.approx(scores, abs=1e-5)
    assert r.cost.tokens > 0 and r.cost.flops > 0


def test_separate_lm_equal_to_the_generator_reproduces_its_logprobs(tiny_gen, tiny_model, tiny_tokenizer):
    seen: list[ScoreRequest] = []

    def record(requests):
        seen.extend(requests)
        return [0.0] * len(requests)

    class Recorder:
        @hookimpl
        def rodeco_register_rewards(self, register):
            register("record", value_function(record, batched=True, needs_logprobs=True))

    rodeco.decode(
        ["write a haiku about autumn leaves"],
        generator=tiny_gen(engine="hf"),
        n=6,
        policy="none",
        plugins=get_plugin_manager(extra=[Recorder()]),
        overrides=["reward=custom", "reward.function=record", "sampling.max_new_tokens=12", "budget=unlimited"],
    )
    lm = LMScorer(tiny_model, tiny_tokenizer)
    gen = tiny_gen(engine="hf")
    seen = [q for q in seen if q.response_ids]
    assert len(seen) >= 6 and lm.prompt_ids(seen[0].prompt) == gen.encode(seen[0].prompt)
    got = lm.logprobs_ids([(gen.encode(q.prompt), list(q.response_ids)) for q in seen])  # batched, padded
    for q, g in zip(seen, got):
        assert g == pytest.approx(list(q.logprobs), abs=1e-4)


def test_decode_with_perplexity_form(tiny_gen, tiny_model, tiny_tokenizer):
    """Each finished candidate scores -exp(mean negative log-likelihood) of its tokens under the generator
    (recomputed here by teacher forcing), and the best is the one with the lowest perplexity."""
    from rodeco_rewards.lm_scorer import LMScorer

    prompt, gen = "give three tips for staying healthy", tiny_gen(engine="hf")
    out = rodeco.decode(
        [prompt],
        generator=gen,
        n=4,
        policy="fixed",
        overrides=[
            "reward=logprob",
            "reward.form=perplexity",
            "sampling.max_new_tokens=16",
            "output.all_candidates=true",
        ],
    )
    (res,) = out.results
    done = [c for c in res.candidates if c.finished and c.token_ids]
    assert done
    lps = LMScorer(tiny_model, tiny_tokenizer).logprobs_ids([(gen.encode(prompt), c.token_ids) for c in done])
    for c, lp in zip(done, lps):
        assert c.score == pytest.approx(-math.exp(-sum(lp) / len(lp)), rel=1e-3)
    assert res.best.score == max(c.score for c in res.candidates if c.finished) and res.best.score <= -1.0


def test_a_separate_scoring_model_is_part_of_the_identity(tiny_model, tiny_tokenizer):
    """Two logprob rewards scoring with different models mean different things: calibrations and a pool's score
    cache, keyed by identity, must not take one for the other."""
    from rodeco_rewards.logprob import LogProbReward

    a = LogProbReward(lm=LMScorer(tiny_model, tiny_tokenizer, name="org/a"))
    b = LogProbReward(lm=LMScorer(tiny_model, tiny_tokenizer, name="org/b"))
    assert a.identity == "form=mean,model=org/a" and b.identity == "form=mean,model=org/b"
    assert LogProbReward().identity == "form=mean"  # the generator's own log-probs
