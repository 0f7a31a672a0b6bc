"""The embedded default RM: its pieces on tiny random encoders (fast), and the committed head on real data
(``integration``: loads all-MiniLM-L6-v2; skipped when ../shared/data is absent)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from conftest import SHARED_DATA
from hypothesis import given, settings
from hypothesis import strategies as st
from test_rewards_preference_rm import WORDS, _bert_tokenizer

from rodeco.common.state import ScoreRequest
from rodeco.common.validation import ConfigError
from rodeco.plugins import BuildContext
from rodeco_rewards.batching import token_batches
from rodeco_rewards.minilm.encoder import SentenceEncoder
from rodeco_rewards.minilm.features import STAT_NAMES, feature_dim, n_embedding, text_stats
from rodeco_rewards.minilm.head import BTHead, HeadShape, load_head, save_head
from rodeco_rewards.minilm.reward import ASSET_STEM, MiniLMReward, build_minilm_rm
from rodeco_rewards.minilm.train import TrainConfig, accuracy, fit_bt

needs_data = pytest.mark.skipif(
    not (SHARED_DATA / "prefs").is_dir(), reason=f"shared preference data not found at {SHARED_DATA} (../shared/data)"
)


@given(st.lists(st.integers(0, 300), max_size=40), st.integers(1, 1000), st.one_of(st.none(), st.integers(1, 8)))
@settings(max_examples=200, deadline=None)
def test_token_batches_cover_every_index_once_within_budget(lengths, budget, max_rows):
    batches = token_batches(lengths, budget, max_rows)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * max(max(lengths[i] for i in b), 1) <= budget
        assert max_rows is None or len(b) <= max_rows


def test_text_stats():
    s = dict(zip(STAT_NAMES, text_stats("Say hi", "# Title\n\n- **one**\n- two\n\nI'm sorry. Done?")))
    assert s["log_headers"] == pytest.approx(np.log1p(1)) and s["log_bold"] == pytest.approx(np.log1p(1))
    assert s["list_line_frac"] == pytest.approx(2 / 4) and s["refusal"] == 1.0 and s["ends_sentence"] == 1.0
    assert s["log_chars"] == pytest.approx(np.log1p(len("# Title\n\n- **one**\n- two\n\nI'm sorry. Done?")))
    assert dict(zip(STAT_NAMES, text_stats("x", "a a a a")))["unique_word_frac"] == 0.25
    assert np.isfinite(text_stats("", "")).all()


@pytest.fixture(scope="module")
def tiny_encoder_dir(tmp_path_factory):
    from transformers import BertConfig, BertModel

    path = tmp_path_factory.mktemp("enc")
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=len(_bert_tokenizer()),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=128,
    )
    BertModel(cfg).save_pretrained(path)
    _bert_tokenizer().save_pretrained(path)
    return path


@pytest.fixture()
def tiny_rm(tiny_encoder_dir, tmp_path):
    torch.manual_seed(1)
    head = BTHead(HeadShape(in_dim=feature_dim(16)))
    torch.nn.init.normal_(head.net.weight)
    save_head(head, tmp_path / "head", {"max_length": 32, "score_stats": {"mean": 0.5, "std": 2.0}})
    return build_minilm_rm(
        {"head": str(tmp_path / "head.json"), "encoder": str(tiny_encoder_dir), "device": "cpu", "batch_tokens": 40},
        BuildContext(),
    )


def _reqs(n, seed=0):
    rng = random.Random(seed)
    return [
        ScoreRequest(
            " ".join(rng.choices(WORDS, k=rng.randint(1, 5))),
            " ".join(rng.choices(WORDS, k=k)),
            (),
            partial=bool(k % 2),
        )
        for k in (rng.randint(0, 50) for _ in range(n))
    ]


def test_encoder_matches_unbatched_mean_pooling(tiny_encoder_dir):
    enc = SentenceEncoder(tiny_encoder_dir, max_length=32, batch_tokens=40)
    texts = ["the sky is blue", "hello", "water " * 60, "the sky is blue"]
    out = enc.encode(texts)
    for t, e in zip(texts, out):
        ids = enc.tokenizer(t, truncation=True, max_length=32, return_tensors="pt")
        h = enc.model(**ids).last_hidden_state[0].mean(0)
        assert e == pytest.approx(torch.nn.functional.normalize(h, dim=0).detach().numpy(), abs=1e-5)
    assert enc.tokens == sum(len(enc.token_ids([t])[0]) for t in dict.fromkeys(texts))  # duplicates encoded once


def test_minilm_score_is_independent_of_batch_and_prompt_cache(tiny_rm):
    reqs = _reqs(10)
    alone = [tiny_rm.score([r])[0] for r in reqs]
    tiny_rm._prompts.clear()
    batch = tiny_rm.score(reqs[::-1])[::-1]
    assert batch == pytest.approx(alone, abs=1e-5)
    assert len(set(np.round(alone, 5))) > 1
    assert tiny_rm.score_stats == (0.5, 2.0)
    assert tiny_rm.cost.tokens > 0
    assert tiny_rm.cost.flops == pytest.approx(2 * tiny_rm.encoder.n_matmul_params * tiny_rm.cost.tokens)


def test_minilm_parts_sum_to_the_score_and_split_surface_from_embedding(tiny_rm):
    reqs = _reqs(6)
    parts = tiny_rm.parts(reqs)
    total = np.array(parts["embedding"]) + np.array(parts["surface"]) + np.array(parts["bias"])
    assert total == pytest.approx(tiny_rm.score(reqs), abs=1e-4)
    with torch.no_grad():  # no surface weights: the surface part is zero and the embedding part is the score's
        tiny_rm.head.net.weight[0, -len(STAT_NAMES) :] = 0.0
    assert tiny_rm.parts(reqs)["surface"] == pytest.approx([0.0] * 6)
    assert np.abs(tiny_rm.parts(reqs)["embedding"]).max() > 0


def test_head_roundtrip_and_training_learns(tmp_path):
    rng = np.random.default_rng(0)
    xc, xr = rng.normal(size=(400, 6)).astype(np.float32), rng.normal(size=(400, 6)).astype(np.float32)
    xc[:, 2] += 1.0  # feature 2 decides the preference
    cfg = TrainConfig(l2=1e-4, l2_embedding=1e-2, steps=200)
    head = fit_bt(xc, xr, cfg, n_embedding=2)
    assert accuracy(head, xc, xr) > 0.7
    again = fit_bt(xc, xr, cfg, n_embedding=2)
    assert torch.equal(head.net.weight, again.net.weight)  # deterministic
    save_head(head, tmp_path / "h", {"max_length": 8})
    loaded, meta = load_head(tmp_path / "h")
    x = torch.from_numpy(xc[:5])
    assert torch.allclose(loaded(x), head(x)) and meta["shape"] == {"in_dim": 6, "hidden": 0}


def test_an_embedding_only_head_holds_the_statistics_at_zero():
    """``surface=False``: the columns after ``n_embedding`` (the surface statistics) get no weight, so a preference
    carried by a statistic alone is not learned, and one carried by an embedding column still is."""
    rng = np.random.default_rng(1)
    xc, xr = rng.normal(size=(400, 6)).astype(np.float32), rng.normal(size=(400, 6)).astype(np.float32)
    xc[:, 4] += 1.0  # a "statistic" decides the preference
    full = fit_bt(xc, xr, TrainConfig(steps=200), n_embedding=2)
    emb = fit_bt(xc, xr, TrainConfig(steps=200, surface=False), n_embedding=2)
    assert accuracy(full, xc, xr) > 0.7 and accuracy(emb, xc, xr) < 0.6
    assert torch.count_nonzero(emb.net.weight[:, 2:]) == 0 and torch.count_nonzero(emb.net.weight[:, :2]) > 0
    xc[:, 0] += 1.0  # an embedding column decides it too
    assert accuracy(fit_bt(xc, xr, TrainConfig(steps=200, surface=False), n_embedding=2), xc, xr) > 0.7


@pytest.mark.parametrize(
    "params, key",
    [
        ({"head": "/no/such/head"}, "reward.head"),
        ({"encoder": "/no/such/dir"}, "reward.encoder"),
        ({"batch_tokens": 0}, "reward.batch_tokens"),
        ({"max_length": 8}, "reward.max_length"),
    ],
)
def test_minilm_config_errors(params, key):
    with pytest.raises(ConfigError) as e:
        build_minilm_rm(params, BuildContext())
    assert e.value.key == key


def test_head_of_wrong_width_is_refused(tiny_encoder_dir, tmp_path):
    save_head(BTHead(HeadShape(in_dim=7)), tmp_path / "h", {"max_length": 32})
    with pytest.raises(ConfigError, match="retrain"):
        build_minilm_rm({"head": str(tmp_path / "h"), "encoder": str(tiny_encoder_dir)}, BuildContext())


def test_committed_head_metadata():
    meta = json.loads(ASSET_STEM.with_suffix(".json").read_text())
    assert meta["shape"]["in_dim"] == feature_dim(384) and n_embedding(384) < meta["shape"]["in_dim"]
    assert meta["trained_with"].startswith("rodeco experiment=rm_train")
    assert len(meta["train"]["sha256"]) == 64 and meta["train"]["pairs"] > 1000
    assert ASSET_STEM.with_suffix(".safetensors").stat().st_size < 100_000  # the head only, not the encoder


def test_default_reward_is_the_embedded_rm():
    from rodeco.api import load_config

    assert load_config([]).reward.name == "minilm_rm"


@pytest.mark.integration
@needs_data
def test_committed_head_beats_length_on_300_heldout_alpaca_pairs():
    from rodeco_rewards.minilm.evaluate import accuracy as pair_accuracy
    from rodeco_rewards.minilm.evaluate import sample_pairs, score_pairs
    from rodeco_rewards.prefs import load_pairs

    pairs = sample_pairs(load_pairs("alpaca_test", SHARED_DATA), 300, seed=0)
    reward = build_minilm_rm({"device": "cpu"}, BuildContext())
    assert isinstance(reward, MiniLMReward)
    acc = pair_accuracy(pairs, score_pairs(reward, pairs, chunk=len(pairs) * 2))  # one call: shared texts once
    assert acc.n == 300
    assert acc.rm > acc.length_baseline, acc
