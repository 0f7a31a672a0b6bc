"""``scripts/llm_judge_pairs.py``: preference pairs judged by ``llm_judge``'s own prompt and parsing in both orders,
scored against the length-only baseline, through a stub chat-completions endpoint (no server)."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import pytest

from rodeco_rewards.experiments import llm_judge_pairs
from rodeco_rewards.llm_judge import SYSTEM, TEMPLATE


@pytest.fixture(scope="module")
def ljp():
    return llm_judge_pairs


def pair(prompt: str, chosen: str, rejected: str) -> SimpleNamespace:
    return SimpleNamespace(prompt=prompt, chosen=chosen, rejected=rejected, group=prompt)


PAIRS = [
    pair("q0", "a long and helpful chosen answer", "short"),  # chosen longer
    pair("q1", "ok", "a longer rejected answer"),  # chosen shorter
    pair("q2", "chosen, longer one", "rejected"),  # chosen longer
]


class Stub:
    """A chat-completions endpoint: ``decide(instruction, a, b)`` gives the reply text; every body is kept."""

    def __init__(self, decide) -> None:
        self.decide, self.bodies = decide, []

    def __call__(self, body):
        self.bodies.append(body)
        text = body["messages"][-1]["content"]
        instruction = text.split("# Instruction\n")[1].split("\n\n# Answer A")[0]
        a = text.split("# Answer A\n")[1].split("\n\n# Answer B")[0]
        b = text.split("# Answer B\n")[1].split("\n\nReply with")[0]
        return {
            "choices": [{"message": {"content": self.decide(instruction, a, b)}}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 2},
        }


def chosen_of(p):
    return {x.prompt: x.chosen for x in PAIRS}[p]


def test_a_judge_that_finds_the_chosen_answer_in_both_orders_scores_1_with_llm_judges_own_prompt(ljp):
    stub = Stub(lambda q, a, b: "A" if a == chosen_of(q) else "B")
    records, extra = ljp.judge_pairs(PAIRS, [0, 1, 2], stub, "judge-model")
    assert [r["score"] for r in records] == [1.0, 1.0, 1.0]
    assert [r["verdicts"] for r in records] == [["A", "B"]] * 3  # chosen as A first, then as B
    first, second = stub.bodies[:2]
    assert first["messages"] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": TEMPLATE.format(instruction="q0", a=PAIRS[0].chosen, b=PAIRS[0].rejected)},
    ]
    assert second["messages"][1]["content"] == TEMPLATE.format(instruction="q0", a=PAIRS[0].rejected, b=PAIRS[0].chosen)
    assert all(b["temperature"] == 0 and b["model"] == "judge-model" and b["max_tokens"] == 4 for b in stub.bodies)
    assert extra["cost"] | {"seconds": 0} == {
        "requests": 6,
        "prompt_tokens": 600,
        "completion_tokens": 12,
        "seconds": 0,
        "stopped": None,
    }
    s = ljp.summarize(records, resamples=200)
    assert s["accuracy"]["value"] == 1.0 and s["accuracy"]["ci"] == [1.0, 1.0]
    assert s["length_baseline"]["value"] == pytest.approx(2 / 3)  # the second pair's chosen answer is the shorter
    assert s["accuracy_minus_length"]["value"] == pytest.approx(1 / 3)
    assert s["chosen_shorter"]["pairs"] == 1 and s["chosen_shorter"]["accuracy"] == 1.0
    assert (s["verdicts"], s["unparseable"], s["consistent"], s["both_parsed"]) == (6, 0, 3, 3)
    assert s["share_a"] == 0.5


def test_position_bias_ties_and_unparseable_verdicts(ljp):
    always_a = Stub(lambda q, a, b: "A")  # prefers whatever comes first: both orders cancel to 0.5
    records, _ = ljp.judge_pairs(PAIRS, [0, 1, 2], always_a, "m")
    s = ljp.summarize(records, resamples=200)
    assert [r["score"] for r in records] == [0.5] * 3 and s["accuracy"]["value"] == 0.5
    assert s["share_a"] == 1.0 and s["consistent"] == 0 and s["both_parsed"] == 3

    longer = Stub(lambda q, a, b: "A" if len(a) > len(b) else "B")  # the length baseline, both orders agreeing
    records, _ = ljp.judge_pairs(PAIRS, [0, 1, 2], longer, "m")
    s = ljp.summarize(records, resamples=200)
    assert [r["score"] for r in records] == [1.0, 0.0, 1.0]
    assert s["accuracy"]["value"] == s["length_baseline"]["value"] == pytest.approx(2 / 3)
    assert s["accuracy_minus_length"] == {"value": 0.0, "ci": [0.0, 0.0]}
    assert s["chosen_shorter"]["accuracy"] == 0.0

    replies = itertools.cycle(["Answer A", "I think both", "hmm", "??"])  # one parseable verdict, then none
    records, _ = ljp.judge_pairs(PAIRS[:2], [0, 1], Stub(lambda q, a, b: next(replies)), "m")
    assert [r["verdicts"] for r in records] == [["A", None], [None, None]]
    assert [r["score"] for r in records] == [1.0, 0.5]  # the one verdict prefers the chosen; none parses: 0.5
    assert records[0]["replies"] == ["Answer A", "I think both"]
    s = ljp.summarize(records, resamples=200)
    assert (s["verdicts"], s["unparseable"], s["both_parsed"]) == (4, 3, 0)


def test_failures_and_the_time_limit_bound_the_loop(ljp):
    def down(body):
        raise RuntimeError("http://127.0.0.1:9/v1/chat/completions unreachable after 1 tries")

    records, extra = ljp.judge_pairs(PAIRS * 3, range(9), down, "m")
    assert len(records) == ljp.FAILURES and all(r["score"] is None for r in records)
    assert "in a row" in extra["cost"]["stopped"] and "unreachable" in records[0]["error"]
    s = ljp.summarize(records)
    assert s["failed"] == 3 and s["scored"] == 0 and math.isnan(s["accuracy"]["value"])

    ticks = itertools.count(0.0, 10.0)  # 10 s a call of the clock
    records, extra = ljp.judge_pairs(
        PAIRS, [0, 1, 2], Stub(lambda q, a, b: "A"), "m", max_seconds=15, clock=lambda: next(ticks)
    )
    assert len(records) == 1 and "--max-seconds" in extra["cost"]["stopped"]


def test_the_sample_is_seeded_and_a_prefix_of_a_larger_one(ljp):
    assert ljp.sample(1339, 10, 0) == ljp.sample(1339, 100, 0)[:10]
    assert ljp.sample(1339, 10, 0) != ljp.sample(1339, 10, 1)
    assert ljp.length_vote("ab", "a") == 1.0 and ljp.length_vote("a", "b") == 0.5 and ljp.length_vote("", "a") == 0


def test_the_summary_table_ends_with_the_accuracy_line(ljp):
    records, extra = ljp.judge_pairs(PAIRS, [0, 1, 2], Stub(lambda q, a, b: "A" if a == chosen_of(q) else "B"), "m")
    lines = ljp.table(ljp.summarize(records, resamples=100), extra["cost"])
    assert lines[-1] == "llm_judge_accuracy: 1.000 [1.000, 1.000]"
    assert any(line.startswith("length only (prefer the longer)") and "0.667" in line for line in lines)
