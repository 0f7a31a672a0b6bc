"""``llm_judge``: an OpenAI-compatible chat model compares each response with the prompt's reference answer in both
orders at temperature 0, counts unparseable verdicts and reports a win rate and a length-controlled one; against
rodeco's own server on the tiny model (loopback, a key from the environment that is sent and never logged)."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest
from serve_helpers import running

import rodeco
from rodeco.common.state import ScoreRequest
from rodeco.common.validation import ConfigError
from rodeco.plugins import BuildContext
from rodeco_rewards.llm_judge import build_llm_judge, length_controlled_win_rate, parse_verdict

SHORT = "{instruction}|{a}|{b}"  # a template that fits the tiny model's 256 positions


@pytest.fixture
def refs(tmp_path):
    """Three prompts with their reference answers, matched by instruction."""
    path = tmp_path / "refs.json"
    path.write_text(json.dumps([{"instruction": f"task {i}", "output": "ref " * (i + 2)} for i in range(3)]))
    return str(path)


class FakeAPI:
    """A chat-completions endpoint in-process: ``decide(a, b)`` gives the reply; every request body is kept."""

    def __init__(self, decide) -> None:
        self.decide, self.bodies = decide, []

    def __call__(self, body):
        self.bodies.append(body)
        _, a, b = body["messages"][-1]["content"].split("|")
        return {
            "choices": [{"message": {"content": self.decide(a, b)}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 1},
        }


def judge_with(api, refs, **params):
    return build_llm_judge(
        {"references": refs, "prompts": None, "template": SHORT, "system": "", **params}, BuildContext(), post=api
    )


def req(i: int, response: str) -> ScoreRequest:
    return ScoreRequest(f"task {i}", response, (), partial=False)


@pytest.mark.parametrize(
    "reply, verdict",
    [
        ("A", "A"),
        ("b", "B"),
        ("**B**", "B"),
        ("Answer A.", "A"),
        ("(A) is better", "A"),
        ("Both", None),
        ("", None),
        ("ABBA", None),
    ],
)
def test_a_verdict_is_the_replys_first_letter(reply, verdict):
    assert parse_verdict(reply) == verdict


def test_both_orders_at_temperature_0_cancel_a_judge_that_always_says_a(refs):
    api = FakeAPI(lambda a, b: "A")
    j = judge_with(api, refs)
    assert j.score([req(0, "mine"), req(1, "other")]) == [0.5, 0.5]
    assert len(api.bodies) == 4 and all(b["temperature"] == 0 for b in api.bodies)
    contents = [b["messages"][-1]["content"] for b in api.bodies]
    assert contents[0] == "task 0|mine|ref ref " and contents[1] == "task 0|ref ref |mine"
    assert j.report()["verdicts"] == 4 and j.report()["unparseable"] == 0
    assert j.cost.tokens == 44 and j.cost.calls == 1


def test_a_judge_that_prefers_the_reference_gives_0_and_unparseable_verdicts_are_counted(refs):
    j = judge_with(FakeAPI(lambda a, b: "A" if a.startswith("ref") else "B"), refs)
    assert j.score([req(0, "x")]) == [0.0]
    k = judge_with(FakeAPI(lambda a, b: "I cannot decide"), refs)
    assert k.score([req(0, "x"), req(2, "y")]) == [0.5, 0.5]
    assert k.report()["unparseable"] == 4 and math.isnan(k.report()["lc_win_rate"])


def test_the_length_controlled_win_rate_discounts_a_judge_that_likes_length(refs):
    rng = np.random.default_rng(0)
    j = judge_with(FakeAPI(lambda a, b: "A" if len(a) > len(b) else "B"), refs)
    lengths = [int(x) for x in rng.integers(1, 40, 60)]
    j.score([req(i % 3, "w" * n) for i, n in enumerate(lengths)])
    r = j.report()
    assert r["win_rate"] > 0.6  # most responses are longer than their reference
    assert abs(r["lc_win_rate"] - 0.5) < 0.15  # with length taken out, about even
    even = length_controlled_win_rate([1, 0] * 20, list(rng.normal(size=40)))
    assert even == pytest.approx(0.5, abs=0.1)


def test_a_bad_template_or_limit_names_its_key(refs):
    with pytest.raises(ConfigError, match=r"judge\.llm_judge\.template"):
        judge_with(FakeAPI(lambda a, b: "A"), refs, template="{instruction} {a}")
    with pytest.raises(ConfigError, match=r"judge\.llm_judge\.timeout"):
        judge_with(FakeAPI(lambda a, b: "A"), refs, timeout=0)


def test_against_rodeco_serve_on_loopback_with_a_key_that_is_sent_and_never_logged(tiny_gen, refs, monkeypatch, caplog):
    secret = "sk-test-9f3a1c"
    monkeypatch.setenv("RODECO_API_KEY", secret)  # the server refuses a request without it
    monkeypatch.setenv("JUDGE_KEY", secret)
    gen = tiny_gen("fast")
    caplog.set_level(logging.DEBUG)
    with running(gen, ["sampling.max_new_tokens=4"]) as (url, _):
        judge = [
            "judge=llm_judge",
            f"judge.llm_judge.base_url={url}/v1",
            "judge.llm_judge.model=tiny",
            "judge.llm_judge.api_key_env=JUDGE_KEY",
            f"judge.llm_judge.references={refs}",
            "judge.llm_judge.prompts=null",
            f"judge.llm_judge.template='{SHORT}'",
            "judge.llm_judge.system=''",
            "judge.llm_judge.timeout=30",
            "judge.llm_judge.retries=0",
        ]
        out = rodeco.decode(
            ["task 0", "task 1"],
            generator=gen,
            n=2,
            policy="none",
            overrides=["reward=logprob", "sampling.max_new_tokens=6", *judge],
        )
        monkeypatch.setenv("JUDGE_KEY", "wrong")
        bad = rodeco.decode(
            ["task 2"],
            generator=gen,
            n=2,
            policy="none",
            overrides=["reward=logprob", "sampling.max_new_tokens=6", *judge],
        )
    report = out.extra["judge"]["llm_judge"]["report"]
    assert report["verdicts"] == 4 and 0 <= report["unparseable"] <= 4  # each winner in both orders
    for r in out.results:
        (entry,) = r.judge
        assert entry.name == "llm_judge" and entry.error is None and entry.score in (0.0, 0.5, 1.0)
    (entry,) = bad.results[0].judge  # the server refused the wrong key: the result is kept, the failure named
    assert entry.score is None and "HTTP 401" in entry.error
    assert secret not in caplog.text and "wrong" not in (entry.error or "")
    assert secret not in json.dumps([r.to_dict() for r in out.results])
