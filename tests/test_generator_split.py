"""A generator is two things: what the model is (``LanguageModel``: facts, tokenizer, cost) and what makes its
sessions (``SessionMaker``: the engine's declaration, its KV layout, its memory report, ``open_session``). What an
engine can do (hidden states, its own KV pool) is a field of its ``EngineInfo``, not a member of its own."""

from __future__ import annotations

import dataclasses

from rodeco.common.protocols import EngineInfo, Generator, LanguageModel, SessionMaker
from rodeco.engines.base import ModelGenerator


def members(proto: type) -> set[str]:
    """The members a protocol declares itself (not those it inherits)."""
    own = set(vars(proto).get("__annotations__", {}))
    return own | {
        k for k, v in vars(proto).items() if not k.startswith("_") and (callable(v) or isinstance(v, property))
    }


def test_the_two_sides_are_disjoint_and_make_up_the_generator():
    model, maker = members(LanguageModel), members(SessionMaker)
    assert model and maker and not model & maker
    assert members(Generator) == set()  # nothing of its own: the union of its two sides
    assert {"encode", "tokenizer", "shape", "flops_per_token"} <= model
    assert {"info", "kv", "open_session"} <= maker


def test_capabilities_are_engine_info_fields():
    fields = {f.name for f in dataclasses.fields(EngineInfo)}
    assert {"hidden", "kv_pool_tokens", "max_rows"} <= fields
    assert not {"provides_hidden", "kv_pool_tokens"} & (members(LanguageModel) | members(SessionMaker))


def test_a_torch_generator_is_both_and_its_model_side_alone_makes_no_session(tiny_gen):
    tiny_gen = tiny_gen()
    assert isinstance(tiny_gen, LanguageModel) and isinstance(tiny_gen, SessionMaker)
    assert isinstance(tiny_gen, Generator)
    assert tiny_gen.info.hidden and tiny_gen.info.kv_pool_tokens is None
    side = ModelGenerator(tiny_gen.model, tiny_gen.tokenizer)
    assert isinstance(side, LanguageModel) and not isinstance(side, SessionMaker)
    assert side.encode("hi") == tiny_gen.encode("hi")
