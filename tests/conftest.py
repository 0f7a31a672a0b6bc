"""Shared fixtures: a tiny random Llama with a small byte-level tokenizer, built in memory (no downloads)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch

if TYPE_CHECKING:
    from transformers import LlamaConfig

    from rodeco.common.protocols import Generator

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "write a haiku about autumn leaves",
    "explain why the sky is blue in two sentences",
    "give three tips for staying healthy",
    "numbers 0 1 2 3 4 5 6 7 8 9 and punctuation , . ! ?",
]


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<pad>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


TINY_SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)  # a tiny decoder's shape, in the keywords of transformers' Llama-family configs
TINY_LLAMA = {**TINY_SHAPE, "bos_token_id": None, "eos_token_id": 1, "pad_token_id": 0, "tie_word_embeddings": False}


def tiny_llama_config(vocab_size: int, **kw: Any) -> LlamaConfig:
    """``TINY_LLAMA``'s config over ``vocab_size`` tokens, with ``kw`` in place of (or beside) its settings."""
    from transformers import LlamaConfig

    return LlamaConfig(**{**TINY_LLAMA, "vocab_size": vocab_size, **kw})


def make_tiny_llama(vocab_size: int, seed: int = 0, **kw) -> torch.nn.Module:
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_llama_config(vocab_size, attn_implementation="sdpa", **kw)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # sharper distributions than the default init: fewer near-ties in greedy decoding
        model.lm_head.weight.mul_(8.0)
    return model


@pytest.fixture(scope="session")
def tiny_model(tiny_tokenizer):
    return make_tiny_llama(len(tiny_tokenizer))


@pytest.fixture()
def tiny_gen(tiny_model, tiny_tokenizer):
    from rodeco.core.generator import TorchGenerator

    def build(engine: str = "auto", chat_template: bool = True) -> Generator:
        return TorchGenerator(tiny_model, tiny_tokenizer, engine=engine, chat_template=chat_template, name="tiny")

    return build


@pytest.fixture(scope="session")
def smollm2():
    """The embedded default generator (SmolLM2-135M-Instruct), loaded once per test session."""
    from rodeco.core.generator import TorchGenerator
    from rodeco.core.loading import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer("smollm2", dtype="float32", device="cpu")
    return TorchGenerator(model, tok, name="smollm2")


@pytest.fixture(scope="session")
def smollm2_bf16():
    """The embedded generator in bfloat16 (the GPU default) on CPU: ``build(engine)`` gives a ``Generator`` that
    drives it with that engine (the weights are loaded once per test session)."""
    from rodeco.core.generator import TorchGenerator
    from rodeco.core.loading import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer("smollm2", dtype="bfloat16", device="cpu")

    def build(engine: str) -> Generator:
        return TorchGenerator(model, tok, engine=engine, name="smollm2")

    return build


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with a word-level tokenizer (words w0..w60) saved to disk, for the CLI to load."""
    from test_hooks import one_thread, tiny_generator

    with one_thread():
        gen = tiny_generator()
    path = tmp_path_factory.mktemp("tiny-llama")
    gen.model.save_pretrained(path)
    gen.tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def installed_example(tmp_path_factory: pytest.TempPathFactory) -> None:
    """``pip install ./plugins/rodeco_example`` into this venv (left installed), built from a copy so the checkout
    stays clean. No test depends on it being absent: they build their managers from explicit plugin lists."""
    import importlib
    import importlib.util
    import shutil
    import subprocess
    import sys

    src = tmp_path_factory.mktemp("src") / "rodeco_example"
    shutil.copytree(
        REPO / "plugins" / "rodeco_example", src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    # Offline and fast when this venv has setuptools (the build backend); otherwise pip fetches it to build.
    offline = ["--no-build-isolation", "--no-index"] if importlib.util.find_spec("setuptools") else []
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            *offline,
            "--disable-pip-version-check",
            "--quiet",
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    importlib.invalidate_caches()


@pytest.fixture(scope="module")
def inductor_cache(tmp_path_factory):
    """A temporary inductor cache for a module's compiled steps (``pytestmark``'s ``usefixtures``)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("inductor")))
        yield
