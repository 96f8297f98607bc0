"""anatomy.generate / anatomy.stream on the real SmolLM2-135M-Instruct, against HF transformers,
and the API's handling of prompts, stop strings, context limits and bad input."""

from __future__ import annotations

import time
import warnings

import pytest
import torch

import anatomy
from anatomy.errors import InputError
from anatomy.text.stops import StopStringFilter, TextRow

from .conftest import llama_tiny, seq2seq_tiny

QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "List three prime numbers."]


def chat(question: str) -> list[dict]:
    return [{"role": "user", "content": question}]


@pytest.mark.slow
def test_greedy_equals_hf_transformers_token_for_token(smollm2, smollm2_tokenizer, hf_smollm2):
    """64 new tokens on three chat prompts: anatomy's engine and HF `generate(do_sample=False)`
    on the same weights pick the same tokens (HF stops at EOS; so do we, EOS excluded)."""
    for question in QUESTIONS:
        ours = anatomy.generate(smollm2, chat(question), tokenizer=smollm2_tokenizer, max_new_tokens=64)
        prompt = smollm2_tokenizer.encode(smollm2_tokenizer.apply_chat_template(chat(question)),
                                          add_special_tokens=False)
        with torch.no_grad():
            out = hf_smollm2.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                      max_new_tokens=64, do_sample=False, eos_token_id=sorted(smollm2_tokenizer.eos_ids),
                                      pad_token_id=smollm2_tokenizer.pad_id)
        theirs = out[0, len(prompt):].tolist()
        if theirs and theirs[-1] in smollm2_tokenizer.eos_ids:
            theirs = theirs[:-1]
        assert ours.token_ids == theirs, question


@pytest.mark.slow
def test_batched_real_prompts_equal_each_alone(smollm2, smollm2_tokenizer):
    prompts = [chat(QUESTIONS[1]), "Once upon a time"]  # 36 and 4 tokens: heavily padded
    batched = anatomy.generate(smollm2, prompts, tokenizer=smollm2_tokenizer, max_new_tokens=12)
    alone = [anatomy.generate(smollm2, p, tokenizer=smollm2_tokenizer, max_new_tokens=12) for p in prompts]
    assert [r.token_ids for r in batched] == [r.token_ids for r in alone]
    assert [r.text for r in batched] == [r.text for r in alone]


@pytest.mark.slow
def test_stop_string_cuts_exactly_and_stream_joins_to_the_text(smollm2, smollm2_tokenizer):
    full = anatomy.generate(smollm2, chat(QUESTIONS[1]), tokenizer=smollm2_tokenizer, max_new_tokens=40,
                            ignore_eos=True)
    stop = full.text[12:16]  # somewhere in the middle, likely across a token boundary
    cut = anatomy.generate(smollm2, chat(QUESTIONS[1]), tokenizer=smollm2_tokenizer, max_new_tokens=40, stop=[stop])
    assert cut.text == full.text[:full.text.index(stop)] and cut.finish_reason == "stop"
    deltas = list(anatomy.stream(smollm2, chat(QUESTIONS[1]), tokenizer=smollm2_tokenizer, max_new_tokens=40,
                                 stop=[stop]))
    assert "".join(deltas) == cut.text and all(stop not in d for d in deltas)


def test_stream_deltas_of_chinese_and_emoji_join_to_the_text(smollm2_tokenizer):
    """Byte-level tokens split 😀 and Chinese characters: no delta holds a broken character, the
    deltas join to the decoded text, and the stop string (in Chinese) is cut exactly."""
    text = "你好，世界！😀 Hello 🌍🚀 naïve café 結束 never shown"
    ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
    row = TextRow(smollm2_tokenizer.decode_stream(skip_special_tokens=True), StopStringFilter(("結束",)))
    deltas = [row.add(token, frozenset()) for token in ids]
    assert len(ids) > len(text.split())  # the characters really are split over tokens
    assert "".join(deltas) == smollm2_tokenizer.decode(ids).split("結束")[0] == text.split("結束")[0]
    assert all("\ufffd" not in d for d in deltas) and row.finish_reason == "stop"


def test_prompt_kinds_and_metrics(smollm2, smollm2_tokenizer):
    messages = chat(QUESTIONS[0])
    ids = smollm2_tokenizer.encode(smollm2_tokenizer.apply_chat_template(messages), add_special_tokens=False)
    by_messages = anatomy.generate(smollm2, messages, tokenizer=smollm2_tokenizer, max_new_tokens=8)
    by_ids = anatomy.generate(smollm2, ids, tokenizer=smollm2_tokenizer, max_new_tokens=8)
    assert by_messages.token_ids == by_ids.token_ids and "Paris" in by_messages.text
    assert by_ids.prompt_tokens == len(ids)
    start = time.perf_counter()
    two = anatomy.generate(smollm2, [ids, ids], tokenizer=smollm2_tokenizer, max_new_tokens=8, ignore_eos=True)
    wall = time.perf_counter() - start  # this test's own clock around the call
    first = two[0]
    assert [len(r.token_ids) for r in two] == [8, 8] and 0 < first.ttft_s and 0 < first.tpot_s
    assert first.ttft_s + 7 * first.tpot_s <= wall  # the first token's wait and 7 decode steps, inside the call
    assert first.tokens_per_s == pytest.approx(2 / first.tpot_s)  # both rows' tokens per decode step


def test_ignore_eos_runs_to_max_new_tokens(smollm2, smollm2_tokenizer):
    result = anatomy.generate(smollm2, chat(QUESTIONS[0]), tokenizer=smollm2_tokenizer, max_new_tokens=24,
                              ignore_eos=True)
    assert len(result.token_ids) == 24 and result.finish_reason == "length"


def test_context_limits_on_a_tiny_model():
    model = llama_tiny()  # max_seq_len 64
    with pytest.raises(InputError, match="context holds 64"):
        anatomy.generate(model, list(range(1, 70)), max_new_tokens=2)
    with pytest.warns(UserWarning, match="clamped to 1"):
        kept = anatomy.generate(model, list(range(1, 70)), max_new_tokens=2, truncate=True)
    assert kept.prompt_tokens == 63 and len(kept.token_ids) == 1  # one slot left: clamped
    with pytest.warns(UserWarning, match="clamped to 54"):
        result = anatomy.generate(model, list(range(1, 11)), max_new_tokens=100, ignore_eos=True)
    assert len(result.token_ids) == 54


@pytest.mark.parametrize("prompt, kwargs, match", [
    ("", {}, "empty"),
    ("   ", {}, "empty"),
    ([], {}, "empty"),
    ("hi", {"temperature": -1}, "temperature"),
    ("hi", {"top_p": 0}, "top_p"),
    ("hi", {"top_k": -2}, "top_k"),
    ("hi", {"warmth": 2}, "unknown generation option"),
    ([1, 2, 10 ** 9], {}, "token id"),
])
def test_bad_input_is_a_value_error(smollm2, smollm2_tokenizer, prompt, kwargs, match):
    with pytest.raises(ValueError, match=match):
        anatomy.generate(smollm2, prompt, tokenizer=smollm2_tokenizer, max_new_tokens=2, **kwargs)


def test_unknown_model_name_is_a_value_error():
    with pytest.raises(ValueError, match="smollm2-135m-instruct"):
        anatomy.generate("smollm2-135m-instrukt", "hi")


def test_text_prompt_without_tokenizer_is_an_error():
    with pytest.raises(InputError, match="tokenizer"):
        anatomy.generate(llama_tiny(), "hello")
    with pytest.raises(InputError, match="tokenizer must be an anatomy Tokenizer .*got str"):
        anatomy.generate(llama_tiny(), "hello", tokenizer="gpt2")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(anatomy.generate(llama_tiny(), [1, 2, 3], max_new_tokens=3, ignore_eos=True).token_ids) == 3


@pytest.mark.parametrize("make", [llama_tiny, seq2seq_tiny], ids=["decoder", "encoder-decoder"])
def test_generate_leaves_the_callers_model_as_it_was(make):
    """The engine works on its own view: the caller's module classes, training flag, parameter
    objects and values are what they were before the call (a model left in training mode too)."""
    model = make().train()
    classes = [(name, type(m)) for name, m in model.named_modules()]
    params = dict(model.named_parameters())
    values = {name: p.detach().clone() for name, p in params.items()}
    first = anatomy.generate(model, [5, 6, 7], max_new_tokens=6)
    assert anatomy.generate(model, [5, 6, 7], max_new_tokens=6).token_ids == first.token_ids
    assert model.training and all(m.training for m in model.modules())
    assert [(name, type(m)) for name, m in model.named_modules()] == classes
    assert all(p is params[name] and torch.equal(p, values[name]) for name, p in model.named_parameters())
