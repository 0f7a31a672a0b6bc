"""``preference_rm`` on tiny random sequence classifiers built here (BERT-style and Llama-style), each with a
tokenizer that is not the generator's."""

from __future__ import annotations

import random

import pytest
import torch

from rodeco.common.state import ScoreRequest
from rodeco.common.validation import ConfigError
from rodeco.plugins import BuildContext
from rodeco_rewards.preference_rm import build_preference_rm
from rodeco_rewards.rm_format import FALLBACK_TEMPLATE

WORDS = (
    "the a sky is blue because light scatters haiku autumn leaves fall tips healthy sleep water walk "
    "explain why two sentences write give three hello world answer question"
).split()
LLAMA_TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}<eot>{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)


def _bert_tokenizer():
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tokens = dict.fromkeys(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *WORDS, *"abcdefghijklmnopqrstuvwxyz", *".,!?:"])
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation()])
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]"
    )


def _llama_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "<eot>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([" ".join(WORDS)] * 3, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="<eot>")  # no pad token
    fast.chat_template = LLAMA_TEMPLATE
    return fast


@pytest.fixture(scope="module")
def rm_dirs(tmp_path_factory):
    """Two tiny random reward models saved like hub checkpoints: {"bert": dir, "llama": dir}."""
    from transformers import BertConfig, BertForSequenceClassification, LlamaConfig, LlamaForSequenceClassification

    root = tmp_path_factory.mktemp("rms")
    torch.manual_seed(0)
    bt = _bert_tokenizer()
    bert = BertForSequenceClassification(
        BertConfig(
            vocab_size=len(bt),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=256,
            num_labels=1,
        )
    ).eval()
    lt = _llama_tokenizer()
    llama = LlamaForSequenceClassification(
        LlamaConfig(
            vocab_size=len(lt),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            num_labels=1,
            pad_token_id=None,
        )
    ).eval()
    out = {}
    for name, model, tok in (("bert", bert, bt), ("llama", llama, lt)):
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
        out[name] = str(root / name)
    return out


def _build(path: str, **params):
    return build_preference_rm({"model": path, "device": "cpu", **params}, BuildContext())


def _requests(gen_tok, n: int = 10, seed: int = 0) -> list[ScoreRequest]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = " ".join(rng.choices(WORDS, k=rng.randint(2, 8)))
        response = " ".join(rng.choices(WORDS, k=rng.randint(0, 40)))  # lengths differ a lot: padding matters
        ids = tuple(gen_tok(response, add_special_tokens=False)["input_ids"])  # the generator's ids, not the RM's
        out.append(ScoreRequest(prompt, response, ids, partial=bool(i % 2), prompt_index=i % 3, candidate_id=i))
    return out


@pytest.mark.parametrize("kind", ["bert", "llama"])
def test_scores_match_a_plain_forward_of_the_rm_own_tokens(kind, rm_dirs, tiny_tokenizer):
    rm = _build(rm_dirs[kind])
    assert rm.tokenizer.get_vocab() != tiny_tokenizer.get_vocab()  # the generator's ids mean nothing to the RM
    reqs = _requests(tiny_tokenizer, 6)
    scores = rm.score(reqs)
    assert len(scores) == 6 and all(isinstance(s, float) for s in scores)
    for r, s in zip(reqs, scores):
        ids = rm.token_ids([r])[0]  # re-tokenized from the text by the RM's own tokenizer
        ref = rm.model(input_ids=torch.tensor([ids])).logits[0, 0].item()  # one unpadded row
        assert s == pytest.approx(ref, abs=1e-5)
    assert rm.cost.tokens == sum(len(x) for x in rm.token_ids(reqs))
    assert rm.n_matmul_params == rm.n_params - rm.model.get_input_embeddings().weight.numel()
    assert rm.cost.flops == pytest.approx(2.0 * rm.n_matmul_params * rm.cost.tokens)


@pytest.mark.parametrize("kind", ["bert", "llama"])
def test_score_does_not_depend_on_batch_neighbours_or_order(kind, rm_dirs, tiny_tokenizer):
    reqs = _requests(tiny_tokenizer, 12, seed=1)
    big = _build(rm_dirs[kind])
    small = _build(rm_dirs[kind], batch_tokens=64, max_batch_size=3)  # many small, differently padded batches
    alone = [big.score([r])[0] for r in reqs]
    together = big.score(reqs)
    perm = list(range(len(reqs)))
    random.Random(3).shuffle(perm)
    shuffled = small.score([reqs[i] for i in perm])
    assert together == pytest.approx(alone, abs=1e-5)
    assert [shuffled[perm.index(i)] for i in range(len(reqs))] == pytest.approx(alone, abs=1e-5)
    assert len(set(round(s, 6) for s in alone)) > 1  # the scores do depend on the text


def test_partial_and_finished_responses_are_scored_alike(rm_dirs):
    rm = _build(rm_dirs["llama"])
    a = ScoreRequest("why is the sky blue", "because light scatters", (), partial=True)
    b = ScoreRequest("why is the sky blue", "because light scatters", (), partial=False)
    assert rm.score([a]) == rm.score([b])


def test_chat_template_path(rm_dirs):
    rm = _build(rm_dirs["llama"])
    assert rm.fmt.use_chat_template
    tok = rm.tokenizer
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "world"}], tokenize=False
    )
    assert text == "[user]hello<eot>[assistant]world<eot>"
    assert (
        rm.token_ids([ScoreRequest("hello", "world", (), False)])[0] == tok(text, add_special_tokens=False)["input_ids"]
    )
    off = _build(rm_dirs["llama"], chat_template=False)
    want = tok(FALLBACK_TEMPLATE.format(prompt="hello", response="world"))["input_ids"]
    assert off.token_ids([ScoreRequest("hello", "world", (), False)])[0] == want
    assert rm.score([ScoreRequest("hello", "world", (), False)]) != off.score(
        [ScoreRequest("hello", "world", (), False)]
    )


def test_fallback_template_and_pair_encoding(rm_dirs):
    rm = _build(rm_dirs["bert"])  # a BERT tokenizer has no chat template: the documented fallback applies
    assert not rm.fmt.use_chat_template and rm.fmt.template == FALLBACK_TEMPLATE
    tok, req = rm.tokenizer, ScoreRequest("why is the sky blue", "light scatters", (), False)
    assert rm.token_ids([req])[0] == tok("\n\nHuman: why is the sky blue\n\nAssistant: light scatters")["input_ids"]
    pair = _build(rm_dirs["bert"], template="pair")
    assert pair.token_ids([req])[0] == tok("why is the sky blue", "light scatters")["input_ids"]
    custom = _build(rm_dirs["bert"], template="Q: {prompt} A: {response}")
    assert custom.token_ids([req])[0] == tok("Q: why is the sky blue A: light scatters")["input_ids"]


def test_long_inputs_are_truncated_to_max_length(rm_dirs):
    rm = _build(rm_dirs["bert"], max_length=16)
    req = ScoreRequest("hello", " ".join(["water"] * 100), (), False)
    assert len(rm.token_ids([req])[0]) == 16
    left = _build(rm_dirs["bert"], max_length=16, truncation_side="left")
    assert left.token_ids([req])[0][-1] == rm.tokenizer.sep_token_id


@pytest.mark.parametrize(
    "params, key",
    [
        ({"model": None}, "reward.model"),
        ({"model": "/no/such/dir"}, "reward.model"),
        ({"colour": "red"}, "reward.colour"),
        ({"chat_template": True}, "reward.chat_template"),  # the BERT tokenizer has none
        ({"chat_template": "sometimes"}, "reward.chat_template"),
        ({"template": "{prompt} only"}, "reward.template"),
        ({"template": "{prompt} {response} {oops}"}, "reward.template"),
        ({"truncation_side": "middle"}, "reward.truncation_side"),
        ({"max_length": 2}, "reward.max_length"),
        ({"batch_tokens": 0}, "reward.batch_tokens"),
        ({"max_batch_size": -1}, "reward.max_batch_size"),
        ({"dtype": "float8"}, "reward.dtype"),
        ({"device": "cuda:7"}, "reward.device"),
        ({"trust_remote_code": "yes"}, "reward.trust_remote_code"),
        ({"label": 3}, "reward.label"),
    ],
)
def test_config_errors_name_the_key(params, key, rm_dirs):
    if key == "reward.device" and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(ConfigError) as e:
        build_preference_rm({"model": rm_dirs["bert"], "device": "cpu", **params}, BuildContext())
    assert e.value.key == key and "Fix:" in str(e.value)


def test_multi_logit_model_needs_an_explicit_label(tmp_path, rm_dirs):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    BertForSequenceClassification(
        BertConfig(
            vocab_size=len(_bert_tokenizer()),
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=4,
            intermediate_size=64,
            num_labels=3,
        )
    ).save_pretrained(tmp_path)
    _bert_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="reward.label"):
        _build(str(tmp_path))
    rm = _build(str(tmp_path), label=2)
    req = ScoreRequest("hello", "world", (), False)
    ref = rm.model(input_ids=torch.tensor([rm.token_ids([req])[0]])).logits[0, 2].item()
    assert rm.score([req])[0] == pytest.approx(ref, abs=1e-5)


def test_decoding_end_to_end_with_a_preference_rm(rm_dirs, tiny_gen):
    import rodeco

    out = rodeco.decode(
        ["explain why the sky is blue"],
        generator=tiny_gen(),
        n=4,
        policy="fixed",
        overrides=[
            "reward=preference_rm",
            f"reward.model={rm_dirs['llama']}",
            "reward.device=cpu",
            "sampling.max_new_tokens=24",
            "budget=unlimited",
        ],
    )
    (res,) = out.results
    rescored = _build(rm_dirs["llama"]).score(
        [ScoreRequest("explain why the sky is blue", res.best.text, (), partial=False)]
    )
    assert res.best.score == pytest.approx(rescored[0], abs=1e-4)  # the winner's score is the RM's, recomputed
    assert out.compute.reward_tokens > 0 and out.compute.reward_flops > 0


def test_a_hub_sequence_classifier_judges_the_winners_and_changes_nothing(rm_dirs, tiny_gen):
    """Any Hugging Face sequence classifier judges as it rewards (``judge=preference_rm``, the model by
    ``judge.preference_rm.model``): each winner gets the score the reward gives it, and the decode is the same."""
    import rodeco

    prompts = ["write a haiku about rain", "give three tips"]
    base = ["reward=logprob", "sampling.max_new_tokens=12", "budget.kv_tokens=300"]
    args = dict(generator=tiny_gen(), n=4, policy="fixed")
    plain = rodeco.decode(prompts, overrides=base, **args)
    judge = ["judge=preference_rm", f"judge.preference_rm.model={rm_dirs['llama']}", "judge.preference_rm.device=cpu"]
    judged = rodeco.decode(prompts, overrides=[*base, *judge], **args)
    assert [(r.best.candidate_id, r.best.text) for r in judged.results] == [
        (r.best.candidate_id, r.best.text) for r in plain.results
    ]
    rm = _build(rm_dirs["llama"])
    for r in judged.results:
        (entry,) = r.judge
        want = rm.score([ScoreRequest(r.prompt, r.best.text, tuple(r.best.token_ids), partial=False)])[0]
        assert entry.name == "preference_rm" and entry.score == pytest.approx(float(want), abs=1e-5)
