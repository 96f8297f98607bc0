"""`anatomy generate` and `anatomy chat` with --speculative, in process (main: the loaded models
are shared): the same text as without it, the stats line, and one-line errors for bad options."""

from __future__ import annotations

import io
import sys

import pytest

from anatomy.cli import main
from benchmarks.speculative_prompts import GROUNDED

COPY = GROUNDED["copy-edit"][0]["content"].replace("\n\n", " ")  # a rewrite that copies: guesses get verified
FP32 = ["--weights", "f32", "--max-new-tokens", "24"]  # fp32: the identity with plain greedy is exact


def generate(capsys, *args: str) -> tuple[str, str]:
    assert main(["generate", COPY, *FP32, *args]) == 0
    return capsys.readouterr()


@pytest.mark.slow
def test_ngram_and_layer_draft_print_the_plain_text_and_their_stats(capsys):
    plain, _ = generate(capsys)
    ngram, ngram_err = generate(capsys, "--speculative", "ngram", "--stats")
    draft, draft_err = generate(capsys, "--speculative", "draft", "--draft-layers", "4", "--num-speculative-tokens",
                                "3", "--stats")
    assert ngram == plain and draft == plain
    assert "speculative ngram (k <= 5):" in ngram_err and "tokens per target forward" in ngram_err
    assert "(0 verifications" not in ngram_err and "(0 verifications" not in draft_err
    assert "speculative draft (k <= 3):" in draft_err and "draft forwards" in draft_err


@pytest.mark.slow
def test_chat_speculates_every_reply(monkeypatch, capsys):
    def chat(*args: str) -> str:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(f"{COPY}\n".encode())))
        assert main(["chat", *FP32, *args]) == 0
        return capsys.readouterr().out

    assert chat("--speculative", "ngram") == chat()


@pytest.mark.slow
def test_a_draft_with_another_vocabulary_is_refused(capsys):
    assert main(["generate", "hi", *FP32, "--speculative", "draft", "--draft-model", "all-minilm-l6-v2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has another tokenizer vocabulary than the target's" in err


@pytest.mark.parametrize("args, message", [
    (["--speculative", "ngram", "--num-speculative-tokens", "0"], "--num-speculative-tokens 0 must be an integer >= 1"),
    (["--num-speculative-tokens", "3"], "--num-speculative-tokens needs --speculative ngram or draft"),
    (["--draft-model", "smollm2-135m"], "--draft-model needs --speculative draft"),
    (["--speculative", "ngram", "--draft-layers", "2"], "--draft-layers needs --speculative draft"),
    (["--speculative", "draft"], "--speculative draft needs a draft: --draft-model NAME, --draft-layers N"),
    (["--speculative", "draft", "--draft-layers", "0"], "--draft-layers 0 must be an integer >= 1"),
    (["--speculative", "draft", "--draft-dtype", "q4"], "--draft-dtype 'q4' is not one of f32, f16, bf16"),
    (["--speculative", "draft", "--draft-weights", "q3"], "--draft-weights 'q3' is not one of f32, f16, bf16, int8, int4"),
    (["--speculative", "beam"], "argument --speculative: invalid choice: 'beam'"),
])
@pytest.mark.parametrize("command", ["generate", "chat"])
def test_bad_options_are_one_line_before_any_model_is_loaded(monkeypatch, capsys, command, args, message):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"hi\n")))
    assert main([command, *(["hi"] if command == "generate" else []), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"anatomy {command}: error: ") and message in err
