"""`anatomy attention`: the page, the PNG and the terminal table from a real model; bad input
(text past the context, a layer or head out of range, an unwritable output path, words for a
model without a tokenizer) is one line and exit 2, with no file left behind."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

import anatomy
from anatomy import build_model, get_preset
from anatomy.checkpoints.registry import resolve
from anatomy.cli import main

pytestmark = pytest.mark.slow  # real checkpoints

MINILM = ["--model", "all-minilm-l6-v2"]


@pytest.fixture(scope="module")
def seq2seq_dir(tmp_path_factory):
    """A tiny random encoder-decoder saved in the HF layout, without a tokenizer."""
    torch.manual_seed(0)
    config = get_preset("transformer-base", vocab_size=64, d_model=32, n_layers=2, n_decoder_layers=2, n_heads=4,
                        d_ff=48, max_seq_len=32, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    return anatomy.save(build_model(config).eval(), tmp_path_factory.mktemp("marian") / "tiny")


def _error(capsys, args: list[str]) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("anatomy attention: error: ")
    return err


def test_page_png_and_terminal(tmp_path, capsys):
    page, png = tmp_path / "minilm.html", tmp_path / "minilm.png"
    assert main(["attention", *MINILM, "A man is eating food.", "--html", str(page)]) == 0
    text = page.read_text()
    assert 'id="attention-data"' in text and text.count('class="cell"') == 6 * 12
    assert main(["attention", "all-minilm-l6-v2", "A man is eating food.", "--layer", "2", "--png", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # MODEL TEXT works too
    capsys.readouterr()
    assert main(["attention", *MINILM, "A man is eating food.", "--layer", "3", "--head", "5"]) == 0
    out = capsys.readouterr().out
    assert "all-minilm-l6-v2: self-attention, layer 3, head 5" in out and "[CLS]" in out and "eating" in out


def test_default_model_is_smollm2(capsys):
    assert main(["attention", "The capital of France is Paris.", "--layer", "0", "--head", "0"]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m-instruct: self-attention, layer 0, head 0" in out and "Paris" in out


def test_encoder_decoder_without_a_tokenizer_takes_ids(tmp_path, capsys, seq2seq_dir):
    page = tmp_path / "s2s.html"
    assert main(["attention", "--model", str(seq2seq_dir), "5 9 13 2", "--target", "11 3", "--html", str(page)]) == 0
    text = page.read_text()
    assert "cross-attention" in text and text.count('class="cell"') == 3 * 2 * 4
    capsys.readouterr()
    err = _error(capsys, ["attention", "--model", str(seq2seq_dir), "hello there"])
    assert "the model has no tokenizer: give the text as token ids separated by spaces, e.g. '5 17 42'" in err


def test_text_past_the_context(tmp_path, capsys):
    page = tmp_path / "long.html"
    long_text = "word " * 600
    err = _error(capsys, ["attention", *MINILM, long_text, "--max-tokens", "1000", "--html", str(page)])
    assert ("the text is 602 tokens, longer than the model's context of 512 tokens (max_seq_len); shorten it or "
            "pass --truncate to keep the first 512") in err
    err = _error(capsys, ["attention", *MINILM, long_text, "--html", str(page)])
    assert "longer than the 128 tokens the maps are drawn for (--max-tokens; the model's context is 512)" in err
    assert not page.exists() and os.listdir(tmp_path) == []
    assert main(["attention", *MINILM, long_text, "--max-tokens", "24", "--truncate", "--html", str(page)]) == 0
    assert page.read_text().count("&#34;[CLS]&#34;") + page.read_text().count('"[CLS]"') >= 1
    assert '"shape": [6, 12, 24, 24]' in page.read_text()


@pytest.mark.parametrize("args, message", [
    (["--layer", "6"], "--layer 6 is out of range: the model has 6 layers (0 to 5)"),
    (["--layer", "-1"], "--layer -1 is out of range"),
    (["--head", "12"], "--head 12 is out of range: the model has 12 heads (0 to 11)"),
    (["--target", "x"], "--target is for an encoder-decoder model; this one is a encoder"),
    (["--max-tokens", "0"], "--max-tokens 0 must be a positive integer"),
])
def test_bad_options(capsys, args, message):
    assert message in _error(capsys, ["attention", *MINILM, "A man is eating food.", *args])


def test_model_given_twice(capsys):
    assert "the model is given twice" in _error(capsys, ["attention", "all-minilm-l6-v2", "text", *MINILM])


def test_unwritable_output_paths(tmp_path, capsys):
    missing = tmp_path / "no" / "such" / "dir" / "page.html"
    err = _error(capsys, ["attention", *MINILM, "hi", "--html", str(missing)])
    assert f"--html {missing}: the folder {missing.parent} does not exist" in err
    assert f"--png {tmp_path}: is a directory, not a file" in _error(
        capsys, ["attention", *MINILM, "hi", "--png", str(tmp_path)])
    assert os.listdir(tmp_path) == []


def test_a_read_only_folder(tmp_path, capsys):
    """A folder its user may not write to is refused before any work, one line and exit 2; the command
    runs in a child that is the user nobody when the tests run as root (root writes through any mode)."""
    assert "does not exist" in _error(capsys, ["attention", *MINILM, "hi", "--html", str(tmp_path / "no" / "p.html")])
    top = Path(tempfile.mkdtemp())  # under /tmp, where nobody may look (pytest's tmp_path is its owner's alone)
    folder = top / "ro"
    folder.mkdir()
    top.chmod(0o755)
    # the model copied where nobody may read it: a checkout in a folder of mode 0700 (mktemp -d) is not
    model = shutil.copytree(resolve(MINILM[1]), top / "model")
    folder.chmod(0o555)
    try:
        code, err = _in_a_child_as_nobody(["attention", "--model", str(model), "hi", "--html", str(folder / "p.html")])
        assert code == 2 and err.count("\n") == 1 and f"--html {folder / 'p.html'}: not writable" in err
        assert os.listdir(folder) == []
    finally:
        folder.chmod(0o700)
        shutil.rmtree(top)


def _in_a_child_as_nobody(args: list[str]) -> tuple[int, str]:
    """(exit code, stderr) of main(args) in a forked child, which drops to the user nobody if it is root.
    Forked, not run: nobody may not be able to read the interpreter; main's imports so far are inherited
    (the caller ran it once up to the same check)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 99
        try:
            os.close(read)
            sys.stderr = os.fdopen(write, "w")
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)  # nobody
            code = main(args)
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        err = f.read()
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), err


def test_the_console_script_says_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "anatomy", "attention", *MINILM, "hi", "--head", "99"],
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "--head 99 is out of range" in result.stderr
