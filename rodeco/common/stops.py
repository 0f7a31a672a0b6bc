"""Stop strings: a candidate whose text comes to contain one of them ends there, as at EOS (``sampling.stop``).

The row keeps the tokens it decoded (they were computed and are charged); its response text, the text the rewards
score and the results and the server return, is cut before the first stop string, as OpenAI's ``stop`` does. Each
engine checks the tail of every active row after each token (``tail_tokens`` tokens decoded), so a row ends at the
token that completes a stop string.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rodeco.common.validation import ConfigError

__all__ = ["StopStrings"]


@dataclass(frozen=True)
class StopStrings:
    strings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for s in self.strings:
            if not isinstance(s, str) or not s:
                raise ConfigError(
                    "sampling.stop",
                    s,
                    "a stop string must be a non-empty string",
                    "give strings such as '\\n\\n', or an empty list for none",
                )

    def __bool__(self) -> bool:
        return bool(self.strings)

    @property
    def tail_tokens(self) -> int:
        """Tokens at the end of a row whose text is searched: enough to hold the longest stop string (a token is at
        least one character but for byte pieces, hence the margin)."""
        return max(map(len, self.strings), default=0) + 8

    def hit(self, text: str) -> bool:
        return any(s in text for s in self.strings)

    def cut(self, text: str) -> str:
        """``text`` up to (not including) the earliest stop string in it."""
        at = min((i for i in (text.find(s) for s in self.strings) if i >= 0), default=-1)
        return text if at < 0 else text[:at]

    def ended(self, tails: Sequence[Sequence[int]], decode: Callable[[list[int]], str]) -> list[bool]:
        """For each row's last ``tail_tokens`` token ids: does its text hold a stop string now?"""
        return [self.hit(decode(list(t))) for t in tails]

    def text(self, decode: Callable[[list[int]], str]) -> Callable[[list[int]], str]:
        """A response's text as the rewards and results see it: decoded, then cut before any stop string."""
        if not self.strings:
            return decode
        return lambda ids: self.cut(decode(ids))
