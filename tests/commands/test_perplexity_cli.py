"""`anatomy perplexity`: the library's figures (inference/perplexity.py) for the model, text and mode
on the command line, as JSON or text; bad input is one line naming the value, exit 2."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import anatomy
from anatomy.cli import main
from anatomy.inference.engine import DecoderEngine
from anatomy.inference.perplexity import perplexity

from ..conftest import tiny_chat_model

ENGLISH = Path(__file__).parents[1] / "data" / "english.txt"
ANATOMY = shutil.which("anatomy") or str(Path(sys.executable).parent / "anatomy")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> str:
    """A tiny random LLaMA-style model with SmolLM2's tokenizer, as an f32 GGUF file."""
    root = tmp_path_factory.mktemp("perplexity")
    tiny_chat_model(root / "hf", root / "tiny.gguf")
    return str(root / "tiny.gguf")


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("options, tokens, chunks", [([], 39, 1), (["--ctx", "16"], 14, 2)])
def test_json_gives_the_librarys_figures(tiny_gguf, capsys, options, tokens, chunks):
    code, out, err = _run(capsys, "perplexity", "--model", tiny_gguf, "--file", str(ENGLISH), "--max-tokens", "40",
                          "--json", *options)
    assert code == 0, err
    report = json.loads(out)
    ids = anatomy.load_tokenizer(tiny_gguf).encode(ENGLISH.read_text())[:40]
    ctx = int(options[1]) if options else None
    expected = perplexity(DecoderEngine(anatomy.load(tiny_gguf)), anatomy.load(tiny_gguf, weights="f32"), ids, ctx=ctx)
    assert (report["tokens"], report["chunks"], report["ctx"]) == (tokens, chunks, ctx)
    for key in ("perplexity", "reference_perplexity", "kl_divergence", "top1_agreement"):
        assert report[key] == pytest.approx(getattr(expected, key), rel=1e-6, abs=1e-9), key
    assert report["perplexity"] == pytest.approx(math.exp(report["nll"]))


def test_text_output_names_each_figure(tiny_gguf, capsys):
    code, out, err = _run(capsys, "perplexity", "--model", tiny_gguf, "--file", str(ENGLISH), "--max-tokens", "24")
    assert code == 0, err
    assert "23 predictions scored (the whole text)" in out
    for label in ("perplexity", "KL divergence", "top-1 agreement"):
        assert label in out


@pytest.mark.parametrize("name, content, options, message", [
    ("missing.txt", None, [], "--file {path}: no such file"),
    ("empty.txt", b" \n\n", [], "--file {path} is empty: no text to score"),
    ("latin1.txt", b"caf\xe9", [], "--file {path} is not UTF-8: byte 0xe9 at offset 3"),
    ("text.txt", b"A short text.", ["--max-tokens", "1"], "--max-tokens=1: scoring needs at least 2 tokens"),
    ("text.txt", b"A short text.", ["--ctx", "2"], "--ctx=2: a chunk needs at least 3 tokens"),
    ("text.txt", b"A short text.", ["--ctx", "16"], "the text has 4 tokens, fewer than one chunk of ctx=16"),
    ("text.txt", b"word " * 200, [], "the text has 201 tokens, more than the model's context of 128"),
])
def test_bad_input_is_one_line_naming_the_value(tiny_gguf, tmp_path, capsys, name, content, options, message):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    code, _, err = _run(capsys, "perplexity", "--model", tiny_gguf, "--file", str(path), *options)
    assert code == 2 and err.count("\n") == 1 and err.startswith("anatomy perplexity: error: "), err
    assert message.format(path=path) in err


@pytest.mark.slow
def test_the_console_script_on_the_default_model(smollm2, smollm2_tokenizer):
    """The real command on SmolLM2's shipped file: fp32's perplexity is anatomy's fp32 forward's on the
    same tokens, and the file's own blocks through the decode step stay close to it."""
    out = subprocess.run([ANATOMY, "perplexity", "--file", str(ENGLISH), "--max-tokens", "64", "--json"],
                         capture_output=True, timeout=600)
    assert out.returncode == 0, out.stderr.decode()
    report = json.loads(out.stdout)
    ids = smollm2_tokenizer.encode(ENGLISH.read_text())[:64]
    fp32 = perplexity(DecoderEngine(smollm2), smollm2, ids)
    assert report["tokens"] == 63 and report["weights"] == "auto"
    assert report["reference_perplexity"] == pytest.approx(fp32.reference_perplexity, rel=1e-6)
    # the plan may measure the int8-activation tiles fastest for decode (llama.cpp's own Q8 activations):
    # they move this 64-token perplexity by up to ~1.2%, the int16 ones by ~0.1%
    assert report["perplexity"] == pytest.approx(fp32.perplexity, rel=0.02)
    assert report["kl_divergence"] < 1e-2 and report["top1_agreement"] > 0.9
