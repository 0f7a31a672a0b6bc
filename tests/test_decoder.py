"""``rodeco.Decoder``: a generator and its rewards built once, decoding many calls as ``rodeco.decode`` would."""

from __future__ import annotations

import dataclasses

import pytest

import rodeco
from rodeco.common.validation import ConfigError
from rodeco.plugins import get_plugin_manager

PROMPTS = ["write a haiku about autumn leaves", "give three tips"]
BASE = ["reward=logprob", "sampling.max_new_tokens=16", "output.all_candidates=true", "budget.kv_tokens=900"]


@pytest.fixture()
def counted():
    """The default plugins with the logprob reward's factory counting its calls."""
    pm = get_plugin_manager()
    entry = pm.rewards.get("logprob")
    calls = []

    def factory(params, ctx):
        calls.append(1)
        return entry.factory(params, ctx)

    pm.rewards._entries["logprob"] = dataclasses.replace(entry, factory=factory)
    return pm, calls


def test_a_decoder_builds_its_reward_once_and_decodes_as_rodeco_decode(tiny_gen, counted):
    pm, calls = counted
    gen = tiny_gen("fast")
    dec = rodeco.Decoder(generator=gen, overrides=BASE, plugins=pm)
    assert len(calls) == 1  # built at construction
    a = dec.decode(PROMPTS, n=8, policy="fixed", overrides=["policy.alpha=0.5", "budget.kv_tokens=250"], seed=3)
    b = dec.decode(PROMPTS, n=4, policy="none", overrides=["budget=unlimited", "budget.kv_tokens=null"])
    c = dec.decode(PROMPTS[:1], n=8, policy="particle_filter")
    assert len(calls) == 1  # and never again, whatever the calls change
    assert any(r.rounds for r in a.results) and not any(r.rounds for r in b.results) and c.results
    ref = rodeco.decode(
        PROMPTS,
        generator=gen,
        n=8,
        policy="fixed",
        overrides=[*BASE, "policy.alpha=0.5", "budget.kv_tokens=250"],
        seed=3,
    )
    assert [x.to_dict()["candidates"] for x in a.results] == [x.to_dict()["candidates"] for x in ref.results]


def test_a_call_cannot_change_the_decoders_reward_or_generator(tiny_gen):
    dec = rodeco.Decoder(generator=tiny_gen("fast"), overrides=BASE)
    with pytest.raises(ConfigError, match="reward.*build another rodeco.Decoder"):
        dec.decode(PROMPTS, overrides=["reward.form=perplexity"])
