"""``llm_judge``: an LLM behind any OpenAI-compatible chat API compares each response with AlpacaEval's GPT-4-Turbo
reference answer for its prompt, AlpacaEval-style.

Each response is judged twice at temperature 0, once as answer A and once as answer B (the reference in the other
place), so the judge's preference for a position cancels. A verdict is the first letter A or B of the reply; any
other reply is unparseable and counted. The score of a response is the share of its parseable verdicts that prefer
it: 1, 0.5 or 0 (0.5 also when neither verdict parses). The mean score over the winners is their win rate against
the reference. ``report()`` gives it with the length-controlled win rate: as AlpacaEval's, a logistic model of each
verdict on an intercept and ``tanh`` of the standardised length difference (response minus reference, in characters),
read at a difference of 0, so a judge that likes longer answers does not raise it.

The key is read from the environment variable ``api_key_env`` names (never from the config, and never logged); an
empty one sends no ``Authorization`` header (a local server). Requests are bounded: ``timeout`` seconds each,
``retries`` more tries on a connection error or a 429/5xx, then the judge fails on that prompt (the decoded result
is kept without the score).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from rodeco import BuildContext, ConfigError, RewardCost, ScoreRequest, take_params
from rodeco_rewards.reference import DEFAULT_PROMPTS, DEFAULT_REFERENCES, References

log = logging.getLogger(__name__)

NODE = "judge.llm_judge"
SYSTEM = "You compare two answers to the same instruction and say which is better."
TEMPLATE = """Which answer follows the instruction better: more helpful, more correct, clearer? A longer answer is \
not better for its length.

# Instruction
{instruction}

# Answer A
{a}

# Answer B
{b}

Reply with one letter, A or B."""
VERDICT = re.compile(r"^[\s*#(\[\"'`]*(?:answer\s*)?([AB])\b", re.IGNORECASE)

Post = Callable[[dict[str, Any]], dict[str, Any]]  # a chat-completions request body -> the response body


def parse_verdict(reply: str) -> str | None:
    """``"A"`` or ``"B"`` when the reply starts with that letter (after markdown, quotes or the word "Answer"),
    else None."""
    m = VERDICT.match(reply or "")
    return m.group(1).upper() if m else None


def length_controlled_win_rate(wins: Sequence[float], length_diff: Sequence[float], l2: float = 1e-3) -> float:
    """P(win) at a length difference of 0 under ``logit P(win) = a + b tanh(diff / sd(diff))``, fitted by Newton's
    method (a small L2 penalty on ``b`` keeps a separable fit finite); NaN without verdicts."""
    y = np.asarray(wins, dtype=np.float64)
    if len(y) == 0:
        return math.nan
    d = np.asarray(length_diff, dtype=np.float64)
    sd = float(d.std()) or 1.0
    x = np.stack([np.ones_like(d), np.tanh(d / sd)], 1)
    w = np.zeros(2)
    pen = np.diag([l2, l2 + 1e-2])
    for _ in range(100):
        p = 1 / (1 + np.exp(-(x @ w)))
        grad = x.T @ (p - y) + pen @ w
        hess = (x * (p * (1 - p))[:, None]).T @ x + pen
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-10:
            break
    return float(1 / (1 + math.exp(-w[0])))


def http_post(base_url: str, api_key_env: str, timeout: float, retries: int) -> Post:
    """A chat-completions POST to ``base_url``, bounded in time and tries."""
    url = base_url.rstrip("/") + "/chat/completions"

    def post(body: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(api_key_env, "")
        if key:
            headers["Authorization"] = "Bearer " + key
        data = json.dumps(body).encode()
        for attempt in range(retries + 1):
            try:
                with urllib.request.urlopen(urllib.request.Request(url, data, headers), timeout=timeout) as r:
                    return json.loads(r.read())
            except urllib.error.HTTPError as e:  # the status only: the body may echo the request
                if attempt == retries or not (e.code == 429 or e.code >= 500):
                    raise RuntimeError(f"{url} answered HTTP {e.code}") from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                if attempt == retries:
                    raise RuntimeError(f"{url} unreachable after {retries + 1} tries: {e}") from None
            time.sleep(min(2.0**attempt, 10.0))
        raise AssertionError("unreachable")

    return post


class LLMJudge:
    """``llm_judge`` (module docstring)."""

    def __init__(
        self,
        refs: References,
        post: Post,
        model: str,
        max_tokens: int,
        base_url: str,
        system: str = SYSTEM,
        template: str = TEMPLATE,
    ) -> None:
        self.refs, self.post, self.model, self.max_tokens = refs, post, model, max_tokens
        self.system, self.template = system, template
        self.cost = RewardCost()  # tokens as the server counts them; FLOPs unknown behind an API
        digest = hashlib.sha256((system + "\0" + template).encode()).hexdigest()[:12]
        self.identity = f"model={model},base_url={base_url},template={digest},references={refs.identity}"
        self.verdicts = self.unparseable = 0
        self.wins: list[float] = []  # per parseable verdict: 1 if it preferred the response
        self.diffs: list[float] = []  # its length difference, response minus reference (characters)
        self.scores: list[float] = []

    def _ask(self, instruction: str, a: str, b: str) -> str | None:
        body = {
            "model": self.model,
            "temperature": 0,
            "max_tokens": self.max_tokens,
            "messages": [
                *([{"role": "system", "content": self.system}] if self.system else []),
                {"role": "user", "content": self.template.format(instruction=instruction, a=a, b=b)},
            ],
        }
        out = self.post(body)
        usage = out.get("usage") or {}
        self.cost.tokens += int(usage.get("prompt_tokens", 0)) + int(usage.get("completion_tokens", 0))
        try:
            reply = out["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError):
            reply = ""
        self.verdicts += 1
        v = parse_verdict(reply)
        if v is None:
            self.unparseable += 1
            log.debug("llm_judge: unparseable verdict %r", reply[:80])
        return v

    def score(self, requests: Sequence[ScoreRequest]) -> list[float]:
        self.cost.calls += 1
        out = []
        for r in requests:
            ref = self.refs.answer(r.prompt)
            first = self._ask(r.prompt, r.response, ref)  # the response as A
            second = self._ask(r.prompt, ref, r.response)  # the response as B
            won = [v for v in ((first == "A") if first else None, (second == "B") if second else None) if v is not None]
            for v in won:
                self.wins.append(float(v))
                self.diffs.append(float(len(r.response) - len(ref)))
            s = sum(won) / len(won) if won else 0.5
            self.scores.append(s)
            out.append(s)
        return out

    def report(self) -> dict[str, float]:
        """What this judge saw in this process: verdicts asked and unparseable, the responses' win rate against the
        reference and the length-controlled one."""
        return {
            "verdicts": self.verdicts,
            "unparseable": self.unparseable,
            "win_rate": float(np.mean(self.scores)) if self.scores else math.nan,
            "lc_win_rate": length_controlled_win_rate(self.wins, self.diffs),
        }


@dataclass
class LLMJudgeParams:
    base_url: str = field(
        default="https://api.openai.com/v1",
        metadata={"help": "an OpenAI-compatible API's base URL (its /chat/completions is called)"},
    )
    model: str = field(default="gpt-4o-mini", metadata={"help": "the judging model's name at that API"})
    api_key_env: str = field(
        default="OPENAI_API_KEY",
        metadata={"help": "the environment variable holding the API key (empty or unset: no key is sent)"},
    )
    max_tokens: int = field(default=4, metadata={"help": "tokens of the verdict the judge may write"})
    timeout: float = field(default=60.0, metadata={"help": "seconds per request"})
    retries: int = field(default=2, metadata={"help": "more tries after a connection error, 429 or 5xx"})
    system: Optional[str] = field(
        default=None, metadata={"help": "the system message (null: the built-in; empty: none)"}
    )
    template: Optional[str] = field(
        default=None,
        metadata={
            "help": "the user message, with {instruction}, {a} and {b} (null: the built-in); the verdict is the "
            "reply's first A or B"
        },
    )
    references: str = field(
        default=DEFAULT_REFERENCES,
        metadata={
            "help": "AlpacaEval's reference outputs (JSON list of {instruction, output}); relative: to the current dir"
        },
    )
    prompts: Optional[str] = field(
        default=DEFAULT_PROMPTS,
        metadata={
            "help": "alpaca_eval_805.jsonl, in the references' order; null: match the references' instructions only"
        },
    )


def build_llm_judge(params: dict[str, Any], ctx: BuildContext, post: Post | None = None) -> LLMJudge:
    p = take_params(NODE, params, LLMJudgeParams)
    for key in ("max_tokens", "timeout"):
        if not p[key] > 0:
            raise ConfigError(f"{NODE}.{key}", p[key], "must be positive", f"set {NODE}.{key} to e.g. 4")
    if int(p["retries"]) < 0:
        raise ConfigError(f"{NODE}.retries", p["retries"], "must be 0 or more", f"set {NODE}.retries=2")
    template = TEMPLATE if p["template"] is None else str(p["template"])
    try:
        template.format(instruction="", a="", b="")
    except (KeyError, IndexError, ValueError) as e:
        raise ConfigError(
            f"{NODE}.template",
            template[:60],
            f"is not a format string of {{instruction}}, {{a}} and {{b}} ({type(e).__name__}: {e})",
            "use those three fields; write other braces as {{ }}",
        ) from None
    if not all(f"{{{k}}}" in template for k in ("instruction", "a", "b")):
        raise ConfigError(
            f"{NODE}.template",
            template[:60],
            "must show the judge {instruction}, {a} and {b}",
            "put all three fields in it",
        )
    refs = References.load(str(p["references"]), p["prompts"], NODE)
    post = post or http_post(str(p["base_url"]), str(p["api_key_env"]), float(p["timeout"]), int(p["retries"]))
    system = SYSTEM if p["system"] is None else str(p["system"])
    return LLMJudge(refs, post, str(p["model"]), int(p["max_tokens"]), str(p["base_url"]), system, template)


build_llm_judge.needs_network = True  # type: ignore[attr-defined]  # its default endpoint is a hosted API
