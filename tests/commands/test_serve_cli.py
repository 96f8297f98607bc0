"""`anatomy serve` and `anatomy bench-serve` bad input: one line on stderr, exit 2, before anything
is served (a busy port, an unknown model, a size that is not one, a URL off this machine)."""

from __future__ import annotations

import re
import socket

import pytest

from .test_generate_cli import anatomy


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("args, message", [
    (["serve", "--kv-memory", "lots"], "--kv-memory 'lots' is not a size (2GiB, 512MB, 1e9)"),
    (["serve", "--kv-memory", "0"], "--kv-memory '0' must be a positive size or a fraction in (0, 1)"),
    (["serve", "--port", "70000"], "--port 70000 must be <= 65535"),
    (["serve", "--kv-offload-bytes", "lots"], "--kv-offload-bytes 'lots' is not a size"),
    (["serve", "--kv-offload-dir", "kv", "--tensor-parallel-size", "2"], "serve one rank only"),
    (["serve", "--scheduling-policy", "lifo"], "argument --scheduling-policy: invalid choice: 'lifo'"),
    (["serve", "--batch-size", "0"], "--batch-size 0 must be >= 1"),
    (["serve", "--weights", "int3"], "--weights 'int3' is not one of f32, f16, bf16, int8, int4"),
    (["serve", "--model", "smollm-135m"], "--model: 'smollm-135m' is neither an existing file"),
    (["serve", "--embedding-model", "nonesuch-encoder"], "--embedding-model: 'nonesuch-encoder' is neither"),
    (["serve", "--api-key", " "], "--api-key must not be empty"),
    (["serve", "--rerank-model", "nonesuch-ranker"], "--rerank-model: 'nonesuch-ranker' is neither"),
    (["serve", "--embedding-pooling", "max"], "argument --embedding-pooling: invalid choice: 'max'"),
    (["serve", "--kv-dtype", "q4_0"], "--kv-dtype 'q4_0' is not one of f32, f16, bf16, int8"),
    (["serve", "--num-speculative-tokens", "3"], "--num-speculative-tokens needs --speculative ngram or draft"),
    (["serve", "--speculative", "draft"], "--speculative draft needs a draft: --draft-model NAME"),
    (["serve", "--model-draft", "x.gguf"], "--draft-model needs --speculative draft"),
    (["serve", "--speculative", "draft", "--draft-model", "nonesuch-draft"], "--draft-model: 'nonesuch-draft' is neither"),
    (["serve", "--lora", "sql"], "--lora 'sql' must be NAME=PATH (a PEFT directory or a GGUF LoRA file)"),
    (["serve", "--lora", "a=x", "a=y"], "--lora 'a=y': the name 'a' is another adapter's"),
    (["serve", "--lora", "a=x", "b=y", "--max-loras", "1"], "--max-loras 1 must be >= the 2 --lora adapters"),
    (["serve", "--lora", "a=x", "--tensor-parallel-size", "2"], "served on one rank only"),
    (["bench-serve", "--url", "http://example.com:8000"], "only http:// on this machine"),
    (["bench-serve", "--concurrency", "0"], "--concurrency must be in [1, 512]"),
    (["bench-serve", "--requests", "0"], "--requests 0 must be >= 1"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    out = anatomy(*args, timeout=120)
    stderr = out.stderr.decode()
    command = args[0]
    assert out.returncode == 2, stderr
    assert stderr.count("\n") == 1 and stderr.startswith(f"anatomy {command}: error: ") and message in stderr, stderr


def test_help_never_shows_the_key_from_the_environment():
    import os
    import subprocess

    from .test_generate_cli import ANATOMY

    for command in ("serve", "bench-serve"):
        out = subprocess.run([ANATOMY, command, "--help"], capture_output=True, timeout=60,
                             env={**os.environ, "ANATOMY_API_KEY": "do-not-print-me"})
        assert out.returncode == 0 and b"--api-key" in out.stdout and b"do-not-print-me" not in out.stdout


def test_a_busy_port_fails_at_once():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = anatomy("serve", "--port", str(port), timeout=120)
    assert out.returncode == 2
    assert out.stderr.decode() == (f"anatomy serve: error: cannot listen on 127.0.0.1:{port}: "
                                   "Address already in use\n")


def test_bench_serve_with_no_server_says_so():
    port = free_port()
    out = anatomy("bench-serve", "--url", f"http://127.0.0.1:{port}", "--requests", "2", timeout=120)
    stderr = out.stderr.decode()
    assert out.returncode == 2 and "every request failed; the first: ConnectionRefusedError" in stderr, stderr


@pytest.mark.slow
def test_a_kv_memory_too_small_for_two_blocks_stops_the_server():
    out = anatomy("serve", "--port", str(free_port()), "--kv-memory", "100KiB", "--embedding-model", "none",
                  timeout=300)
    lines = out.stderr.decode().splitlines()
    assert out.returncode == 2, lines
    # a block: 30 layers x K and V x 3 KV heads x 64 dims x 16 tokens, in the branches' bf16 or f32 (per the plan)
    assert re.fullmatch(r"anatomy serve: error: a KV memory of 102,400 bytes holds 0 blocks of 16 tokens "
                        r"\((368,640|737,280) bytes each\); at least 2 are needed", lines[-1]), lines
