"""`anatomy generate`, run as the real console script in a subprocess."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ANATOMY = shutil.which("anatomy") or str(Path(sys.executable).parent / "anatomy")


def anatomy(*args: str, stdin: bytes | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([ANATOMY, *args], input=stdin, capture_output=True, timeout=timeout)


@pytest.mark.slow
def test_answers_with_the_default_model_and_reports_stats():
    out = anatomy("generate", "What is the capital of France?", "--stats", "--max-new-tokens", "100000")
    stdout, stderr = out.stdout.decode(), out.stderr.decode()
    assert out.returncode == 0, stderr
    assert "Paris" in stdout
    assert "clamped to" in stderr and "TTFT" in stderr and "tok/s" in stderr and "Traceback" not in stderr


@pytest.mark.slow
def test_raw_prompt_from_stdin_with_a_stop_string():
    out = anatomy("generate", "--raw", "--max-new-tokens", "30", "--ignore-eos", "--stop", ".", stdin=b"The capital of France is")
    assert out.returncode == 0, out.stderr.decode()
    assert "." not in out.stdout.decode() and out.stdout.decode().strip()


@pytest.mark.parametrize("args, stdin, message", [
    (["generate", ""], None, "the prompt is empty"),
    (["generate"], b"  \n", "the prompt is empty"),
    (["generate"], b"caf\xe9 au lait", "stdin is not valid UTF-8: byte 0xe9 at offset 3"),
    (["generate", "hi", "--temperature", "-1"], None, "temperature=-1.0 must be >= 0"),
    (["generate", "hi", "--top-p", "1.5"], None, "top_p=1.5 must be in (0, 1]"),
    (["generate", "hi", "--top-p", "0"], None, "top_p=0.0 must be in (0, 1]"),
    (["generate", "hi", "--top-k", "-3"], None, "top_k=-3 must be an integer >= 0"),
    (["generate", "hi", "--max-new-tokens", "0"], None, "max_new_tokens=0 must be an integer >= 1"),
    (["generate", "hi", "--model", "smollm-135m"], None, "is neither an existing file or directory nor a known model"),
    (["generate", "hi", "--dtype", "float8"], None, "--dtype 'float8' is not one of f32, f16, bf16"),
    (["generate", "hi", "--seed", str(2 ** 70)], None, f"seed={2 ** 70} must be an integer in [-2**63, 2**64)"),
    (["generate", "hi", "--model", "all-minilm-l6-v2"], None, "generation needs a decoder or encoder-decoder model"),
])
def test_bad_input_is_one_line_and_exit_2(args, stdin, message):
    out = anatomy(*args, stdin=stdin)
    stderr = out.stderr.decode()
    assert out.returncode == 2
    assert stderr.count("\n") == 1 and stderr.startswith("anatomy generate: error: ") and message in stderr


@pytest.mark.slow
def test_prompt_longer_than_the_context_is_an_error_unless_truncated():
    out = anatomy("generate", "--raw", stdin=b"word " * 9000)
    stderr = out.stderr.decode()
    assert out.returncode == 2 and stderr.count("\n") == 1 and "context holds 8192" in stderr and "--truncate" in stderr


def test_help_lists_every_option():
    out = anatomy("generate", "--help")
    assert out.returncode == 0
    for option in ("--model", "--max-new-tokens", "--temperature", "--top-k", "--top-p", "--min-p",
                   "--repetition-penalty", "--seed", "--stop", "--ignore-eos", "--compile", "--dtype", "--stats",
                   "--truncate", "--raw", "--system"):
        assert option in out.stdout.decode()
