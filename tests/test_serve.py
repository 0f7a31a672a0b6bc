"""``rodeco task=serve`` driven by the real ``openai`` client on loopback: chat and completions with ``n`` and
``best_of``, a seeded request equal to the CLI's answer, 16 concurrent clients equal to their solo answers, a
client that disconnects, streaming, stop strings, SIGTERM. Bad input, auth and binding: ``test_serve_errors.py``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2 as httpx
import numpy as np
import pytest
from serve_helpers import SlowGen, client, metric, running, spawn, tiny_model_dir

import rodeco
from rodeco.common.budget import Budget
from rodeco.common.sampling import SamplingParams
from rodeco.common.state import PromptRef
from rodeco.core.contracts import Scorer
from rodeco.core.loop import LoopSettings, decode_batch
from rodeco.plugins import BuildContext, default_plugins

pytestmark = pytest.mark.slow  # servers in subprocesses

PROMPTS = [
    "write a haiku about autumn leaves",
    "give three tips for staying healthy",
    "explain why the sky is blue in two sentences",
    "the quick brown fox jumps over the lazy dog",
]
RODECO = Path(sys.executable).with_name("rodeco")
LONG_BODY = {  # a request that decodes for a while: Best-of-8 up to 100 tokens
    "model": "tiny",
    "messages": [{"role": "user", "content": PROMPTS[0]}],
    "best_of": 8,
    "max_tokens": 100,
    "seed": 3,
    "rodeco": {"policy": "none"},
}


def chat(c, prompt: str, **kw):
    extra = {k: kw.pop(k) for k in ("best_of", "rodeco") if k in kw}
    return c.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": prompt}], extra_body=extra, **kw
    )


def test_chat_and_completions_with_n_and_best_of(tiny_gen):
    with running(tiny_gen("fast")) as (url, state):
        c = client(url)
        r = chat(c, PROMPTS[0], n=3, best_of=8, seed=1, max_tokens=12)
        x = r.model_extra["rodeco"]
        assert len(r.choices) == 3 and [ch.index for ch in r.choices] == [0, 1, 2]
        rewards = [ch["reward"] for ch in x["choices"]]
        assert rewards == sorted(rewards, reverse=True)  # best first
        assert x["candidates_started"] == 8 and x["best_of"] == 8 and x["seed"] == 1
        assert all(ch.finish_reason in ("stop", "length") for ch in r.choices)
        assert r.usage.completion_tokens >= sum(ch["tokens"] for ch in x["choices"])
        assert r.usage.prompt_tokens == len(tiny_gen("fast").encode(PROMPTS[0]))
        assert x["flops"] > 0 and x["bon_flops_modelled"] > 0 and x["decode_tokens"] > 0
        # Speculative Rejection (the server's default policy, fixed alpha 0.5) rejected some, and kept n to the end
        assert x["candidates_rejected"] > 0 and x["rounds"] > 0
        r2 = c.completions.create(
            model="tiny",
            prompt=PROMPTS[1],
            n=2,
            max_tokens=8,
            seed=2,
            extra_body={"best_of": 4, "rodeco": {"policy": "none"}},
        )
        assert len(r2.choices) == 2 and r2.object == "text_completion"
        assert r2.model_extra["rodeco"]["candidates_rejected"] == 0 and r2.model_extra["rodeco"]["rounds"] == 0
        models = c.models.list()
        assert [m.id for m in models.data] == ["tiny"]


@pytest.mark.parametrize("policy", [{"policy": "fixed", "params": {"alpha": 0.5}}, {"policy": "none"}])
def test_a_seeded_request_gives_the_python_apis_answer(tiny_gen, policy):
    """A request alone, with a seed, gives what rodeco.decode (the CLI's code path) gives for the same prompt, seed,
    settings and the budget the request had."""
    gen = tiny_gen("fast")
    with running(gen) as (url, state):
        r = chat(client(url), PROMPTS[2], n=2, best_of=8, seed=7, max_tokens=14, rodeco=policy)
    x = r.model_extra["rodeco"]
    ov = [
        "reward=logprob",
        "sampling.max_new_tokens=14",
        f"budget.kv_tokens={x['kv_tokens']}",
        "output.all_candidates=true",
    ] + ([f"policy.alpha={policy['params']['alpha']}"] if "params" in policy else [])
    out = rodeco.decode([PROMPTS[2]], generator=gen, n=8, policy=policy["policy"], overrides=ov, seed=7).results[0]
    assert r.choices[0].message.content == out.best.text
    assert x["choices"][0]["candidate_id"] == out.best.candidate_id
    assert x["decode_tokens"] == out.compute.gen_decode_tokens and x["rounds"] == len(out.rounds)


def test_a_rejecting_request_starts_what_its_budget_holds_at_the_first_decision_point(tiny_gen):
    """``serve.rejection_start=auto`` (the default): Speculative Rejection's regime, the rows ``n=auto`` starts in the
    request's budget, the Python API's answer for them; ``best_of``: ``best_of`` rows."""
    gen = tiny_gen("fast")
    sr = {"policy": "fixed", "params": {"alpha": 0.5}}
    with running(gen) as (url, state):
        r = chat(client(url), PROMPTS[1], n=1, best_of=4, seed=3, max_tokens=48, rodeco=sr)
    x = r.model_extra["rodeco"]
    assert x["best_of"] == 4 and x["candidates_started"] > 4, x
    ov = ["reward=logprob", "sampling.max_new_tokens=48", f"budget.kv_tokens={x['kv_tokens']}", "policy.alpha=0.5"]
    out = rodeco.decode([PROMPTS[1]], generator=gen, n="auto", policy="fixed", overrides=ov, seed=3).results[0]
    assert out.n_start == x["candidates_started"] and r.choices[0].message.content == out.best.text
    with running(gen, ["serve.rejection_start=best_of"]) as (url, state):
        r = chat(client(url), PROMPTS[1], n=1, best_of=4, seed=3, max_tokens=48, rodeco=sr)
    assert r.model_extra["rodeco"]["candidates_started"] == 4


def test_a_seeded_request_gives_the_clis_answer(tiny_model, tiny_tokenizer, tmp_path):
    """The same with the real ``rodeco`` command and ``rodeco task=serve`` in their own processes, over the tiny model
    saved as a model directory."""
    d = tiny_model_dir(tmp_path, tiny_model, tiny_tokenizer)
    common = [
        "generator=hf",
        f"generator.model={d}",
        "reward=logprob",
        "sampling.max_new_tokens=12",
        "budget.kv_tokens=20000",
    ]
    with spawn(common) as (proc, url):
        r = httpx.post(
            f"{url}/v1/chat/completions",
            timeout=60,
            json={
                "model": str(d),
                "messages": [{"role": "user", "content": PROMPTS[0]}],
                "seed": 11,
                "best_of": 8,
                "max_tokens": 12,
                "rodeco": {"policy": "fixed", "params": {"alpha": 0.5}},
            },
        ).json()
    kv = r["rodeco"]["kv_tokens"]
    cli = subprocess.run(
        [
            str(RODECO),
            *common,
            f"data.prompts=[{PROMPTS[0]}]",
            "n=8",
            "policy=fixed",
            "policy.alpha=0.5",
            f"budget.kv_tokens={kv}",
            "seed=11",
            f"hydra.run.dir={tmp_path / 'cli'}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert cli.returncode == 0, cli.stderr
    rec = json.loads((tmp_path / "cli" / "results.jsonl").read_text().splitlines()[0])
    assert r["choices"][0]["message"]["content"] == rec["best"]["text"]
    assert r["rodeco"]["rounds"] == len(rec["rounds"]) and r["rodeco"]["rounds"] > 0


def test_16_concurrent_clients_get_their_solo_answers(tiny_gen):
    """Best-of-N: batching changes no answer (each request's own seed and streams). Speculative Rejection: every
    request answered within the budget. /metrics adds up."""
    gen = tiny_gen("fast")
    reqs = [dict(prompt=PROMPTS[i % 4] + " " * (i // 4), seed=100 + i) for i in range(16)]
    with running(gen, ["budget.kv_tokens=3000"]) as (url, state):
        c = client(url)

        def ask(q, policy):
            return chat(c, q["prompt"], seed=q["seed"], best_of=6, max_tokens=10, rodeco=policy)

        with ThreadPoolExecutor(16) as pool:
            together = list(pool.map(lambda q: ask(q, {"policy": "none"}), reqs, timeout=120))
            sr = list(pool.map(lambda q: ask(q, {"policy": "fixed"}), reqs, timeout=120))
        alone = [ask(q, {"policy": "none"}) for q in reqs]
        text = httpx.get(f"{url}/metrics").text
    assert [r.choices[0].message.content for r in together] == [r.choices[0].message.content for r in alone]
    assert [r.model_extra["rodeco"]["choices"][0]["candidate_id"] for r in together] == [
        r.model_extra["rodeco"]["choices"][0]["candidate_id"] for r in alone
    ]
    assert max(r.model_extra["rodeco"]["batch_requests"] for r in together) > 1  # they did share batches
    assert max(r.model_extra["rodeco"]["batch_requests"] for r in sr) > 1
    assert all(r.model_extra["rodeco"]["batch_requests"] == 1 for r in alone)
    assert len(sr) == 16 and all(r.choices[0].message.content is not None for r in sr)
    everything = together + sr + alone
    assert metric(text, "rodeco_requests_total", 'endpoint="chat",status="200"') == 48
    assert metric(text, "rodeco_started_candidates_total") == 48 * 6
    assert metric(text, "rodeco_decode_tokens_total") == sum(
        r.model_extra["rodeco"]["decode_tokens"] for r in everything
    )
    assert (
        metric(text, "rodeco_rejected_candidates_total")
        == sum(r.model_extra["rodeco"]["candidates_rejected"] for r in everything)
        > 0
    )
    assert 0 < metric(text, "rodeco_kv_peak_tokens") <= metric(text, "rodeco_kv_budget_tokens") == 3000
    assert metric(text, "rodeco_queue_depth") == 0 and metric(text, "rodeco_batch_rows") == 0


def test_with_the_rewards_off_the_decode_thread_concurrent_requests_get_their_solo_answers(tiny_gen):
    """serve.reward_thread=true: Speculative Rejection's requests, sent together, each hold their rows while their
    scores are computed beside the others' decoding, and get the answers they get alone with the rewards on the
    decode thread."""
    gen = tiny_gen("fast")
    reqs = [dict(prompt=PROMPTS[i % 4] + " " * (i // 4), seed=200 + i) for i in range(8)]

    def ask(c, q):
        return chat(c, q["prompt"], seed=q["seed"], best_of=6, max_tokens=10, rodeco={"policy": "fixed"})

    def answer(r):
        rb = r.model_extra["rodeco"]
        return r.choices[0].message.content, rb["choices"][0]["candidate_id"], rb["rounds"], rb["candidates_rejected"]

    with running(gen, ["budget.kv_tokens=3000", "serve.reward_thread=true"]) as (url, state):
        c = client(url)
        with ThreadPoolExecutor(8) as pool:
            together = list(pool.map(lambda q: ask(c, q), reqs, timeout=120))
    with running(gen, ["budget.kv_tokens=3000"]) as (url, state):
        c = client(url)
        alone = [ask(c, q) for q in reqs]
    assert [answer(r) for r in together] == [answer(r) for r in alone]
    assert max(r.model_extra["rodeco"]["batch_requests"] for r in together) > 1
    assert any(r.model_extra["rodeco"]["rounds"] for r in together)  # decision points were met
    assert sum(r.model_extra["rodeco"]["time_s"].get("held", 0.0) for r in together) > 0  # rows were held


def test_a_client_that_disconnects_frees_its_rows_and_the_batch_goes_on(tiny_gen):
    gen = SlowGen(tiny_gen("fast"), delay=0.05)
    body = LONG_BODY
    with running(gen, ["serve.check_tokens=4"]) as (url, state):
        other = {}
        t = threading.Thread(
            target=lambda: other.update(
                r=httpx.post(
                    f"{url}/v1/chat/completions",
                    timeout=120,
                    json={**body, "seed": 4, "messages": [{"role": "user", "content": PROMPTS[1]}]},
                )
            )
        )
        t.start()
        with pytest.raises(httpx.TimeoutException):  # the client gives up mid-decode and closes its connection
            httpx.post(f"{url}/v1/chat/completions", json=body, timeout=1.0)
        end, text = time.monotonic() + 30, ""
        while time.monotonic() < end:
            text = httpx.get(f"{url}/metrics").text
            if metric(text, "rodeco_cancelled_rows_total") >= 1:
                break
            time.sleep(0.05)
        assert metric(text, "rodeco_cancelled_requests_total") == 1
        assert metric(text, "rodeco_cancelled_rows_total") >= 1  # its rows left the batch (their cache with them)
        rows_after = metric(text, "rodeco_batch_rows")
        t.join(60)
        assert other["r"].status_code == 200  # the batch went on
        assert rows_after <= 8  # only the other request's rows remain
        r = chat(client(url), PROMPTS[2], best_of=2, max_tokens=4, seed=1)  # and the next request is served
        assert r.choices[0].message.content is not None


def test_a_short_request_joins_a_running_long_one_and_is_answered_first(tiny_gen):
    """A 4-token request sent while a 100-token Best-of-8 request decodes joins the running batch (it does not wait
    for it), is answered while the long one still decodes, and gets the answer it gets alone."""
    gen = SlowGen(tiny_gen("fast"), delay=0.05)
    body = LONG_BODY
    with running(gen, ["serve.check_tokens=4"]) as (url, state):
        long: dict = {}
        t = threading.Thread(
            target=lambda: long.update(r=httpx.post(f"{url}/v1/chat/completions", timeout=120, json=body))
        )
        t.start()
        end = time.monotonic() + 30
        while metric(httpx.get(f"{url}/metrics").text, "rodeco_admissions_total") < 1:
            assert time.monotonic() < end, "the long request was not admitted"
            time.sleep(0.02)
        short = chat(client(url), PROMPTS[2], best_of=2, max_tokens=4, seed=1, rodeco={"policy": "none"})
        still_running = t.is_alive()
        t.join(120)
        alone = chat(client(url), PROMPTS[2], best_of=2, max_tokens=4, seed=1, rodeco={"policy": "none"})
        text = httpx.get(f"{url}/metrics").text
    assert still_running and long["r"].status_code == 200
    assert short.model_extra["rodeco"]["batch_requests"] == 2  # it decoded beside the long one
    assert short.choices[0].message.content == alone.choices[0].message.content
    assert metric(text, "rodeco_admissions_total") == 3 and metric(text, "rodeco_batches_total") == 0


def test_a_cancelled_prompt_leaves_within_check_tokens_and_changes_no_other_answer(tiny_gen):
    """Loop level: prompt 0 cancelled at the first check; its rows leave within check_tokens tokens although
    Best-of-N has no decision point, it gets no result (no crash without a finished candidate), and prompt 1's
    answer equals its solo answer."""
    gen = tiny_gen("fast")
    pm = default_plugins()
    scorer = Scorer(pm.build_reward({"name": "logprob"}, BuildContext(generator=gen, plugins=pm)), "logprob")
    policy = pm.build_policy({"name": "none"}, BuildContext(plugins=pm))
    s = LoopSettings(
        n=4,
        sampling=SamplingParams(),
        max_new_tokens=40,
        budget=Budget(None),
        seed=0,
        check_tokens=5,
        all_candidates=True,
    )
    refs = [PromptRef(0, PROMPTS[0], stream=0, seed=1), PromptRef(1, PROMPTS[1], stream=0, seed=2)]
    seen = []

    def cancelled(sess):
        seen.append((sess.t, sess.rows))
        return {0}

    res, _ = decode_batch(gen, scorer, policy, refs, s, cancelled=cancelled)
    solo, _ = decode_batch(gen, scorer, policy, refs[1:], s)
    assert [r.prompt_index for r in res] == [1]
    assert seen[0][0] <= 5 and seen[1][1] <= 4  # after the first check only prompt 1's 4 rows decode
    assert res[0].best.text == solo[0].best.text and res[0].best.candidate_id == solo[0].best.candidate_id


@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_stop_strings_end_a_candidate_as_eos_does(tiny_gen, engine):
    """Each candidate with a stop string is its candidate without one, cut before the first stop string (and
    ended there); finish_reason stop. The CLI's sampling.stop and a request's stop are the same."""
    gen = tiny_gen(engine)
    ov = ["reward=logprob", "sampling.max_new_tokens=24", "output.all_candidates=true", "budget=unlimited"]
    free = rodeco.decode(PROMPTS[:2], generator=gen, n=6, policy="none", overrides=ov).results
    texts = [c.text for r in free for c in r.candidates]
    counts: dict[str, int] = {}
    for t in texts:  # a character some candidates hold and some do not, away from their start
        for ch in set(t[2:]):
            counts[ch] = counts.get(ch, 0) + 1
    stop = max((ch for ch in counts if ch.strip() and ch.isascii()), key=lambda ch: counts[ch])
    cut = rodeco.decode(
        PROMPTS[:2], generator=gen, n=6, policy="none", overrides=[*ov, f"sampling.stop=['{stop}']"]
    ).results
    hits = 0
    for a, b in zip(free, cut):
        for ca, cb in zip(
            sorted(a.candidates, key=lambda c: c.candidate_id), sorted(b.candidates, key=lambda c: c.candidate_id)
        ):
            assert stop not in cb.text
            assert cb.text == ca.text.split(stop)[0]
            if stop in ca.text:
                hits += 1
                assert cb.stop_reason == "stop" and len(cb.token_ids) <= len(ca.token_ids)
    assert hits > 0
    with running(gen) as (url, state):
        r = chat(client(url), PROMPTS[0], n=1, best_of=6, max_tokens=24, seed=0, stop=[stop], rodeco={"policy": "none"})
    assert stop not in r.choices[0].message.content
    assert r.choices[0].message.content == cut[0].best.text


def test_a_conversation_goes_through_the_chat_template_and_the_reward_reads_it(tiny_gen, tiny_tokenizer):
    gen = tiny_gen("fast")
    msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "give three tips"},
        {"role": "assistant", "content": "eat"},
        {"role": "user", "content": "why"},
    ]
    want = tiny_tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    want = want["input_ids"] if not isinstance(want, list) else want
    assert gen.encode(msgs) == list(want)
    with running(gen) as (url, state):
        c = client(url)
        r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, seed=0, extra_body={"best_of": 2})
        assert r.usage.prompt_tokens == len(want)
        job = state.planner.plan(
            __import__("rodeco.serve.schema", fromlist=["x"]).ChatRequest.model_validate(
                {"model": "tiny", "messages": msgs}
            )
        )
        assert all(m["content"] in job.ref.text for m in msgs)  # what the rewards score the response against


def test_streaming_is_parsed_unchanged_by_the_openai_client(tiny_gen):
    gen = SlowGen(tiny_gen("fast"), delay=0.01)
    with running(gen) as (url, state):
        c = client(url)
        plain = chat(c, PROMPTS[0], n=2, best_of=8, max_tokens=16, seed=5)
        chunks = list(
            chat(
                c,
                PROMPTS[0],
                n=2,
                best_of=8,
                max_tokens=16,
                seed=5,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        raw = httpx.post(
            f"{url}/v1/chat/completions",
            timeout=60,
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": PROMPTS[0]}],
                "best_of": 8,
                "max_tokens": 16,
                "seed": 5,
                "stream": True,
            },
        ).text
    text = {0: "", 1: ""}
    for ch in chunks:
        for cc in ch.choices:
            text[cc.index] += cc.delta.content or ""
    assert [text[0], text[1]] == [ch.message.content for ch in plain.choices]
    assert chunks[-1].usage is not None and chunks[-1].model_extra["rodeco"]["rounds"] > 0
    assert ': rodeco {"round": 0' in raw  # round-by-round progress as SSE comments
    assert raw.rstrip().endswith("data: [DONE]")


def test_sigterm_drains_in_flight_requests_and_exits(tiny_model, tiny_tokenizer, tmp_path):
    d = tiny_model_dir(tmp_path, tiny_model, tiny_tokenizer)
    body = {
        "model": str(d),
        "messages": [{"role": "user", "content": PROMPTS[0]}],
        "best_of": 32,
        "max_tokens": 200,
        "seed": 1,
        "rodeco": {"policy": "none"},
    }
    with spawn(
        [
            "generator=hf",
            f"generator.model={d}",
            "generator.engine=hf",
            "serve.drain_timeout_s=60",
            "budget.kv_tokens=200000",
        ]
    ) as (proc, url):
        got = {}
        t = threading.Thread(
            target=lambda: got.update(r=httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120))
        )
        t.start()
        end = time.monotonic() + 30
        while metric(httpx.get(f"{url}/metrics").text, "rodeco_batch_requests") < 1:
            assert time.monotonic() < end
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGTERM)
        late = None
        for _ in range(50):  # a request after SIGTERM: 503 (or refused once the server has closed)
            try:
                late = httpx.post(f"{url}/v1/chat/completions", json={**body, "max_tokens": 2}, timeout=10)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        t.join(120)
        assert proc.wait(60) == 0
    assert got["r"].status_code == 200 and got["r"].json()["choices"][0]["message"]["content"] is not None
    assert late is None or late.status_code == 503
    assert late is None or late.json()["error"]["code"] == "shutting_down"
    assert subprocess.run(["ps", "-o", "pid=", "--ppid", str(proc.pid)], capture_output=True, text=True).stdout == ""


def test_the_curl_and_openai_examples_of_the_docs_work(tiny_gen, capsys):
    """docs/serve.md's curl lines and its openai example, against a server on another port serving "tiny"."""
    import re
    import shlex

    doc = (Path(__file__).resolve().parents[1] / "docs" / "serve.md").read_text(encoding="utf-8")
    curls = [
        line
        for block in re.findall(r"```bash\n(.*?)```", doc, re.S)
        for line in block.splitlines()
        if line.startswith("curl ")
    ]
    code = re.findall(r"```python\n(.*?)```", doc, re.S)
    assert len(curls) >= 4 and len(code) == 1
    with running(tiny_gen("fast"), ["serve.max_tokens=64"]) as (url, state):
        for line in curls:
            line = line.replace("http://127.0.0.1:8000", url).replace('"smollm2"', '"tiny"')
            out = subprocess.run(shlex.split(line), capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, out.stderr
            if "/metrics" not in line:
                assert "error" not in json.loads(out.stdout), out.stdout
        exec(code[0].replace("http://127.0.0.1:8000", url).replace('"smollm2"', '"tiny"'), {})
    printed = capsys.readouterr().out
    assert printed.strip()


def test_a_request_past_its_timeout_gets_504_and_leaves_the_batch(tiny_gen):
    with running(SlowGen(tiny_gen("fast"), 0.05), ["serve.request_timeout_s=0.5", "serve.check_tokens=4"]) as (url, _):
        r = httpx.post(
            f"{url}/v1/chat/completions",
            timeout=60,
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": PROMPTS[0]}],
                "best_of": 4,
                "max_tokens": 100,
                "rodeco": {"policy": "none"},
            },
        )
        assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
        end = time.monotonic() + 30
        text = httpx.get(f"{url}/metrics").text
        while metric(text, "rodeco_batch_requests") != 0 and time.monotonic() < end:  # its batch ends early
            time.sleep(0.05)
            text = httpx.get(f"{url}/metrics").text
        assert metric(text, "rodeco_cancelled_requests_total") == 1 and metric(text, "rodeco_cancelled_rows_total") >= 1


def test_a_decoder_from_a_composed_config_decodes_batches_not_calls(tiny_gen):
    from rodeco.common.validation import ConfigError

    dec = rodeco.Decoder.from_config(
        rodeco.load_config(["reward=logprob", "sampling.max_new_tokens=8"]), generator=tiny_gen("fast")
    )
    res, comp = dec.batch([PromptRef(0, PROMPTS[0])], n=2, policy={"name": "none"})
    assert res[0].best.text is not None and comp.gen_decode_tokens > 0
    with pytest.raises(ConfigError, match="call batch"):
        dec.decode(PROMPTS[0])


def test_a_batch_starts_no_more_rows_than_serve_max_batch_rows(tiny_gen):
    with running(tiny_gen("fast"), ["serve.max_batch_rows=8"]) as (url, _):
        c = client(url)
        with ThreadPoolExecutor(3) as pool:  # three requests of 4 rows, queued together: 8 rows fit one batch
            rs = list(
                pool.map(
                    lambda i: chat(c, PROMPTS[i], best_of=4, max_tokens=6, seed=i, rodeco={"policy": "none"}),
                    range(3),
                    timeout=120,
                )
            )
        with pytest.raises(Exception, match="serve.max_batch_rows"):
            chat(c, PROMPTS[0], best_of=9, max_tokens=4)
    assert max(r.model_extra["rodeco"]["batch_requests"] for r in rs) == 2  # never three at once (12 rows)


def test_search_policies_serve_n_choices_and_their_parameters_are_checked(tiny_gen):
    """particle_filter, beam and dvts behind the server, batched together by policy: each request gets its n
    choices (copies within the budget); a parameter the policy refuses is a 400 naming the request's field."""
    ov = [
        "serve.policies=[{name: particle_filter}, {name: beam, beam_width: [1, 8]}, {name: dvts}]",
    ]
    pols = [{"policy": "particle_filter"}, {"policy": "beam", "params": {"beam_width": 2}}, {"policy": "dvts"}]
    with running(tiny_gen("fast"), ov) as (url, _):
        c = client(url)
        with ThreadPoolExecutor(6) as pool:
            rs = list(
                pool.map(
                    lambda i: chat(c, PROMPTS[i % 4], n=3, best_of=8, max_tokens=24, seed=i, rodeco=pols[i % 3]),
                    range(6),
                    timeout=120,
                )
            )
        r = httpx.post(
            f"{url}/v1/chat/completions",
            timeout=30,
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 4,
                "rodeco": {"policy": "beam", "params": {"beam_width": 2.5}},
            },
        )
    assert all(len(x.choices) == 3 and x.model_extra["rodeco"]["rounds"] > 0 for x in rs)
    assert max(x.model_extra["rodeco"]["batch_requests"] for x in rs) > 1
    assert r.status_code == 400 and r.json()["error"]["param"] == "rodeco.params.beam_width"
    assert "rodeco.params.beam_width" in r.json()["error"]["message"].split("Fix:")[1]


def test_keep_at_least_takes_back_the_best_rejected_rows_within_the_budgets_rows():
    from test_policies import pv, rview

    from rodeco.common.state import Counts, PolicyInfo
    from rodeco.serve.scheduler import KeepAtLeast

    class KeepBest:  # keeps each prompt's best row only
        info = PolicyInfo(decision_tokens=7)

        def select(self, view):
            return [[int(np.argmax(p.scores))] for p in view.prompts]

    view = rview(pv([0.1, 0.9, 0.5, 0.7], prompt_index=10), pv([0.3, 0.2, 0.1], finished=[1.0], prompt_index=11))
    wrapped = KeepAtLeast(KeepBest(), {10: 3, 11: 3})
    assert wrapped.info == PolicyInfo(decision_tokens=7)
    assert wrapped.select(view) == [Counts([0, 1, 1, 1]), Counts([1, 1, 0])]  # best first; finished ones count
    view.max_rows_next = 4  # room for two rows more than the policy kept: the first prompt's take them
    assert wrapped.select(view) == [Counts([0, 1, 1, 1]), Counts([1, 0, 0])]


def test_a_requests_record_reaches_the_rewards(tiny_gen):
    """``rodeco.record`` travels with the prompt: the server's reward reads it as ``ScoreRequest.meta`` (the gold
    reward, which raises on a prompt without a gold answer, scores with it), and a request without the record the
    reward reads gets 400 naming ``rodeco.record``, before anything is decoded."""
    from rodeco.serve.schema import ChatRequest

    with running(tiny_gen("fast"), ["reward=gold"]) as (url, state):
        body = {"model": "tiny", "messages": [{"role": "user", "content": PROMPTS[0]}], "rodeco": {"record": {}}}
        body["rodeco"]["record"] = {"gold_answer": "7", "task": "sums"}
        assert state.planner.plan(ChatRequest.model_validate(body)).ref.meta == {"gold_answer": "7", "task": "sums"}
        c = client(url)
        r = chat(
            c, PROMPTS[0], max_tokens=6, seed=0, best_of=2, rodeco={"policy": "none", "record": {"gold_answer": "7"}}
        )
        assert r.choices[0].message.content is not None
        with pytest.raises(Exception, match="400.*rodeco.record.*gold_answer"):
            chat(c, PROMPTS[0], max_tokens=6, seed=0, best_of=2, rodeco={"policy": "none"})
