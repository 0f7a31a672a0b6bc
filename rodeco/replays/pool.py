"""A pool: M candidates per prompt, decoded once with the same counter-based random streams as a live run, stored
in a directory so that any rejection policy can be replayed over them (``rodeco.replays.replay``).

    DIR/pool.json                 settings (generator, sampling, seed, M, max_new_tokens, model shape, engine)
    DIR/tokenizer/                the generator's tokenizer (replay decodes partial responses with it)
    DIR/prompts/<index>.json      one prompt: its token ids, its data record beyond its text (``meta``: a task's
                                  gold answer), each candidate's tokens, text, log-probs (and, where the pool
                                  records them, the ``top_logprobs`` k most likely tokens' at each position) and stop
                                  token, the measured prefill and per-step decode costs
    DIR/hidden/<index>.npy        the generator's final-layer hidden states [M, max_new_tokens, hidden] (float16):
                                  [c, t] sampled candidate c's token t (what a reward that needs hidden states
                                  gets at a decision point after t + 1 tokens)
    DIR/scores/<reward>/<index>.json  rewards of (candidate, length, partial) computed so far, with their cost
    DIR/continuations/<index>.json  copies' continuations, decoded on demand when a replay forks a row
                                  (``rodeco.replays.pool_session.ReplayGenerator.continuations``): copy stream ->
                                  its parent's stream, the step of the fork, the tokens from there, their log-probs,
                                  stop token
    DIR/step_costs.json           decode step times at batch sizes 1, 2, 4, ..., M, measured once the pool is
                                  complete (the time model of the efficiency experiment is fitted to them);
                                  pools recorded before the name changed hold it as calibration.json

Every file is written atomically as soon as it is complete; a pool is extended prompt by prompt, and refuses to
be extended with other settings.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rodeco.common.shape import ModelShape
from rodeco.common.state import ScoreRequest
from rodeco.common.validation import ConfigError
from rodeco.core.results import atomic_write

SETTINGS = "pool.json"


@dataclass
class PoolCandidate:
    token_ids: list[int]  # the response (a stop token excluded)
    text: str
    logprobs: list[float]  # the generator's log-probability of each response token
    stop: int | None  # the EOS token that ended it, None if it reached max_new_tokens
    top_logprobs: list[list[float]] = field(default_factory=list)  # [tokens][k] (pools that record them)


@dataclass
class PoolPrompt:
    index: int  # the prompt's position in its source (results are keyed by it)
    text: str
    prompt_ids: list[int]
    candidates: list[PoolCandidate]
    prefill_seconds: float
    steps: dict[str, list[float]] = field(default_factory=dict)  # rows, context, seconds of each decode step
    record_seconds: float = 0.0  # wall time of recording this prompt (prefill, decode, final rewards)
    meta: dict[str, Any] = field(default_factory=dict)  # the data record beyond its text (a task's gold answer)
    batch_prompts: int = 1  # prompts recorded together in one session (its costs shared among them)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PoolPrompt:
        return cls(**{**d, "candidates": [PoolCandidate(**c) for c in d["candidates"]]})

    def request(
        self, i: int, length: int | None = None, text: str | None = None, hidden: np.ndarray | None = None
    ) -> ScoreRequest:
        """Candidate ``i`` as a reward request: its finished response, or (``length``) its first ``length`` tokens
        as a partial one, ``text`` being their decoding (``hidden``: the state that sampled the last of them)."""
        c = self.candidates[i]
        ids = c.token_ids if length is None else c.token_ids[:length]
        return ScoreRequest(
            self.text,
            c.text if length is None else str(text),
            tuple(ids),
            partial=length is not None,
            prompt_index=self.index,
            candidate_id=i,
            logprobs=tuple(c.logprobs[: len(ids)]),
            hidden_state=hidden,
            top_logprobs=tuple(map(tuple, c.top_logprobs[: len(ids)])) if c.top_logprobs else None,
            meta=self.meta,
        )

    def final_requests(self) -> list[ScoreRequest]:
        return [self.request(i) for i in range(len(self.candidates))]


TOP_DIGITS = 4  # decimals a pool keeps of the top-k log-probs


def rounded_top(top: list[list[float]] | None) -> list[list[float]]:
    """Top-k log-probs as a pool stores them (``TOP_DIGITS`` decimals; empty where none were recorded)."""
    return [[round(x, TOP_DIGITS) for x in row] for row in top or []]


def top_k_of(settings: Mapping[str, Any]) -> int:
    """How many of the most likely tokens' log-probs a pool records at each position (0: none)."""
    return int(settings.get("top_logprobs", 0))


def check_top_k(pool: Pool, k: int) -> int:
    """The pool's top-k (``top_k_of``), which must be at least the ``k`` a reward reads: else a ``ConfigError`` on
    ``reward`` (it would be scored on fewer columns, or none, unnoticed)."""
    have = top_k_of(pool.settings)
    if k > have:
        raise ConfigError(
            "reward",
            f"needs_top_logprobs={k}",
            f"the pool at {pool.path} records the {have} most likely tokens' log-probs at each position",
            f"use a reward that reads at most {have} (e.g. reward.top_k={have}), or record a pool with "
            f"experiment_args.top_logprobs={k}",
        )
    return have


STEP_COSTS, OLD_STEP_COSTS = "step_costs.json", "calibration.json"  # the second: pools recorded before the rename


def reward_key(node: dict[str, Any], identity: str | None = None) -> str:
    """A directory name for one reward's cached scores: its name and a hash of its config (and identity, e.g. the
    hash of a trained head's weights, so retraining a head does not serve stale scores)."""
    blob = json.dumps({"node": node, "identity": identity}, sort_keys=True, default=str)
    return f"{node.get('name', 'reward')}-{hashlib.sha256(blob.encode()).hexdigest()[:10]}"


# the engine as pools recorded it before engines had a stable id (their class names): read as the id
RECORDED_ENGINES = {"HFEngine": "hf", "FastLlamaEngine": "fast", "VLLMEngine": "vllm"}


def _read_settings(f: Path) -> dict[str, Any]:
    """A pool's settings as recorded, with its engine named by its stable id (``EngineInfo.name``)."""
    s: dict[str, Any] = json.loads(f.read_text(encoding="utf-8"))
    if "engine" in s:
        s["engine"] = RECORDED_ENGINES.get(s["engine"], s["engine"])
    return s


class Pool:
    """A pool directory: its settings, its prompts (loaded on demand) and its score caches."""

    def __init__(self, path: str | Path, key: str = "pool") -> None:
        self.path, self.key = Path(path), key
        f = self.path / SETTINGS
        if not f.is_file():
            raise ConfigError(
                key, str(path), "no pool there (no pool.json)", f"record one first: rodeco experiment=pool {key}={path}"
            )
        self.settings = _read_settings(f)
        self._prompts: dict[int, PoolPrompt] = {}
        self._hidden: dict[int, np.ndarray] = {}

    @staticmethod
    def create(path: str | Path, settings: dict[str, Any], key: str = "pool") -> Pool:
        """Open the pool at ``path``, creating it with ``settings``; an existing pool must have the same ones."""
        path = Path(path)
        f = path / SETTINGS
        if f.is_file():
            old = _read_settings(f)
            diff = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
            if diff:
                raise ConfigError(
                    key,
                    str(path),
                    f"the pool there was recorded with other settings ({diff})",
                    "give a new pool directory, or the settings it was recorded with",
                )
        else:
            atomic_write(f, json.dumps(settings, indent=2) + "\n")
        return Pool(path, key)

    @property
    def candidates(self) -> int:
        return int(self.settings["candidates"])

    @property
    def shape(self) -> ModelShape:
        return ModelShape(**self.settings["shape"])

    def indices(self) -> list[int]:
        return sorted(int(p.stem) for p in (self.path / "prompts").glob("*.json"))

    def has(self, index: int) -> bool:
        return (self.path / "prompts" / f"{index}.json").is_file()

    def prompt(self, index: int) -> PoolPrompt:
        if index not in self._prompts:
            f = self.path / "prompts" / f"{index}.json"
            if not f.is_file():
                raise ConfigError(
                    self.key,
                    str(self.path),
                    f"prompt {index} is not in the pool",
                    "record it first (rodeco experiment=pool with the same data)",
                )
            self._prompts[index] = PoolPrompt.from_dict(json.loads(f.read_text(encoding="utf-8")))
        return self._prompts[index]

    def hidden(self, index: int) -> np.ndarray:
        """Prompt ``index``'s hidden states ``[M, max_new_tokens, hidden]`` (memory-mapped)."""
        if index not in self._hidden:
            f = self.path / "hidden" / f"{index}.npy"
            if not f.is_file():
                raise ConfigError(
                    self.key,
                    str(self.path),
                    f"prompt {index} has no hidden states (pools recorded "
                    "through vLLM, or before rodeco stored them, lack them)",
                    "record the prompt again into a new pool: rodeco experiment=pool pool=NEW_DIR",
                )
            self._hidden[index] = np.load(f, mmap_mode="r")
        return self._hidden[index]

    def write_hidden(self, index: int, hidden: np.ndarray) -> None:
        buf = io.BytesIO()
        np.save(buf, hidden)
        atomic_write(self.path / "hidden" / f"{index}.npy", buf.getvalue())
        self._hidden.pop(index, None)

    def write_prompt(self, p: PoolPrompt) -> None:
        atomic_write(self.path / "prompts" / f"{p.index}.json", json.dumps(asdict(p)) + "\n")
        self._prompts[p.index] = p

    @property
    def step_costs(self) -> dict[str, list[float]] | None:
        """The measured decode step times (``rows``, ``context``, ``seconds``), or None before they are measured."""
        for name in (STEP_COSTS, OLD_STEP_COSTS):
            f = self.path / name
            if f.is_file():
                return json.loads(f.read_text(encoding="utf-8"))
        return None

    def write_step_costs(self, steps: dict[str, Any]) -> None:
        atomic_write(self.path / STEP_COSTS, json.dumps(steps) + "\n")

    def scores(self, key: str, index: int) -> dict[str, list[float]]:
        """``"candidate:length:partial" -> [score, tokens, flops, seconds]`` of one reward on one prompt."""
        f = self.path / "scores" / key / f"{index}.json"
        return json.loads(f.read_text(encoding="utf-8")) if f.is_file() else {}

    def write_scores(self, key: str, index: int, entries: dict[str, list[float]]) -> None:
        atomic_write(self.path / "scores" / key / f"{index}.json", json.dumps(entries) + "\n")

    def continuations(self, index: int) -> dict[str, dict[str, Any]]:
        """``str(copy stream) -> {parent, step, tokens, logprobs, stop, seconds}`` of the copies decoded so far."""
        f = self.path / "continuations" / f"{index}.json"
        return json.loads(f.read_text(encoding="utf-8")) if f.is_file() else {}

    def write_continuations(self, index: int, entries: dict[str, dict[str, Any]]) -> None:
        atomic_write(self.path / "continuations" / f"{index}.json", json.dumps(entries) + "\n")
