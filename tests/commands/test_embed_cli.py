"""`anatomy embed` through the real console script, in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import anatomy

SCRIPT = Path(sys.executable).parent / "anatomy"
TEXTS = ["A man is eating food.", "A man is eating a piece of bread.", "日本語のテキスト 😀"]


def _run(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    command = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "anatomy"]
    return subprocess.run([*command, "embed", *args], input=stdin, capture_output=True, timeout=120)


@pytest.mark.slow
def test_json_vectors_and_similarity_equal_the_api():
    done = _run(*TEXTS, "--json", "--similarity")
    assert done.returncode == 0, done.stderr.decode()
    out = json.loads(done.stdout)
    assert [e["text"] for e in out["embeddings"]] == TEXTS and out["dimension"] == 384
    vectors = torch.tensor([e["embedding"] for e in out["embeddings"]])
    assert torch.allclose(vectors, anatomy.embed("all-minilm-l6-v2", TEXTS), atol=1e-6)
    similarity = torch.tensor(out["similarity"])
    assert torch.allclose(similarity, vectors @ vectors.T, atol=1e-6)
    assert torch.allclose(similarity.diagonal(), torch.ones(3), atol=1e-6)


@pytest.mark.slow
def test_tables_from_stdin_lines():
    done = _run("--similarity", stdin="\n".join(TEXTS[:2]).encode() + b"\n\n")
    assert done.returncode == 0, done.stderr.decode()
    text = done.stdout.decode()
    assert "2 embeddings [2, 384] from all-minilm-l6-v2" in text
    assert "cosine similarity" in text and "0.755" in text  # the two sentences about eating


@pytest.mark.slow
@pytest.mark.parametrize("args, stdin, message", [
    (["-"], b"caf\xe9 latin-1\n", "stdin is not valid UTF-8: byte 0xe9 at offset 3"),
    ([], b"\n  \n", "no texts to embed"),
    (["x", "--model", "no-such-model"], b"", "'no-such-model' is neither an existing file"),
])
def test_bad_input_is_one_line_and_exit_2(args, stdin, message):
    done = _run(*args, stdin=stdin)
    err = done.stderr.decode()
    assert done.returncode == 2
    assert message in err and "Traceback" not in err
    assert err.strip().count("\n") == 0


@pytest.mark.parametrize("args, message", [
    (["x", "--batch-size", "0"], "batch_size must be a positive integer, got 0"),
    (["x", "--model", "smollm2-135m-instruct"], "embeddings need an encoder model (BERT-like), got DecoderLM"),
    (["x", "--batch-size", "two"], "argument --batch-size: invalid int value: 'two'"),
])
def test_bad_options_are_one_line_and_exit_2_in_process(capsys, args, message):
    from anatomy.cli import main

    assert main(["embed", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("anatomy embed: error: ") and message in err
