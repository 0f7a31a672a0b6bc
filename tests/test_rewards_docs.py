"""The value-function example in docs/rewards.md runs as written (its decoding part, behind ``__main__``, is
exercised with a tiny generator instead of the embedded one)."""

from __future__ import annotations

import contextlib
import io
import re

import pytest
from conftest import REPO

import rodeco


def _example() -> str:
    text = (REPO / "docs" / "rewards.md").read_text(encoding="utf-8")
    section = text.split("## Custom value functions", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_value_function_example_runs(tiny_gen):
    ns: dict = {"__name__": "docs_example"}
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(_example(), "docs/rewards.md", "exec"), ns)  # noqa: S102 - our own documentation
    assert buf.getvalue().strip() == "[1.975]"
    out = rodeco.decode(
        ["Write a haiku about autumn."],
        generator=tiny_gen(),
        n=4,
        plugins=ns["plugins"],
        overrides=[
            "reward=custom",
            "reward.function=keyword",
            "+reward.word=leaves",
            "sampling.max_new_tokens=16",
            "output.all_candidates=true",
        ],
    )
    (res,) = out.results
    for c in (c for c in res.candidates if c.finished):  # the example's formula, with word=leaves from the config
        assert c.score == pytest.approx(c.text.lower().count("leaves") - 0.001 * len(c.text))
    assert res.best.score == max(c.score for c in res.candidates if c.finished)
    lp = ns["plugins"].rewards.get("mean_lp").factory({}, None)
    assert lp.needs_logprobs
    out = rodeco.decode(
        ["Write a haiku about autumn."],
        generator=tiny_gen(),
        n=4,
        plugins=ns["plugins"],
        overrides=["reward=custom", "reward.function=mean_lp", "sampling.max_new_tokens=16"],
    )
    assert -20.0 <= out.results[0].best.score <= 0.0


@pytest.mark.parametrize("function", ["nope", "custom", None])
def test_custom_names_a_registered_reward(function):
    from rodeco.common.validation import ConfigError
    from rodeco.plugins import BuildContext, default_plugins

    with pytest.raises(ConfigError) as e:
        default_plugins().build_reward({"name": "custom", "function": function}, BuildContext())
    assert e.value.key == "reward.function" and "length" in str(e.value)
