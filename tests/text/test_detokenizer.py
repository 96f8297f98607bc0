"""Streaming detokenization: deltas join to the full decode and never hold a broken character."""

from __future__ import annotations

import pytest

import anatomy

TEXTS = [
    "机器学习是人工智能的一个分支。你好，世界！",
    "Emoji 😀👍🏽 family 👨‍👩‍👧‍👦 flag 🇫🇷 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 done",
    "mixed: naïve café, 日本語, \u0645\u0631\u062d\u0628\u0627, code `x += 1`\n\n  end",
]


def _stream(tokenizer, ids, **kwargs) -> list[str]:
    decoder = tokenizer.decode_stream(**kwargs)
    return [decoder.push(i) for i in ids] + [decoder.flush()]


@pytest.mark.parametrize("text", TEXTS)
def test_smollm2_deltas_join_to_full_text(smollm2_tokenizer, text):
    ids = smollm2_tokenizer.encode(text)
    deltas = _stream(smollm2_tokenizer, ids)
    assert "".join(deltas) == smollm2_tokenizer.decode(ids) == text
    assert not any("\ufffd" in d for d in deltas)
    assert "" in deltas[:-1]  # some tokens end inside a character: their text was held back


def test_special_tokens_streamed_or_skipped(smollm2_tokenizer):
    tok = smollm2_tokenizer
    ids = tok.encode("<|im_start|>assistant\n你好 😀<|im_end|>")
    assert "".join(_stream(tok, ids)) == tok.decode(ids)
    assert "".join(_stream(tok, ids, skip_special_tokens=True)) == "assistant\n你好 😀"


def test_wordpiece_continuations_glue_to_the_previous_token():
    tok = anatomy.load_tokenizer("all-minilm-l6-v2")
    ids = tok.encode("Unbelievable tokenization, is it? 京都!", add_special_tokens=False)
    assert "##ization" in [tok.id_to_token(i) for i in ids]
    assert "".join(_stream(tok, ids)) == tok.decode(ids) == "unbelievable tokenization, is it? 京 都!"


def test_flush_returns_an_unfinished_character(smollm2_tokenizer):
    ids = smollm2_tokenizer.encode("ok 😀")
    decoder = smollm2_tokenizer.decode_stream()
    deltas = [decoder.push(i) for i in ids[:-1]]
    assert "".join(deltas) == "ok"
    assert decoder.flush() == smollm2_tokenizer.decode(ids[:-1])[2:]
    assert decoder.flush() == ""
