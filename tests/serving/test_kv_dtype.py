"""`anatomy serve --kv-dtype int8`: the same KV budget holds about twice the tokens of a bf16 cache
(from the server's own start-up line and /metrics), and the model still answers."""

from __future__ import annotations

import re

import pytest

from .conftest import Server

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"


def capacity(server: Server) -> tuple[int, float]:
    """(tokens the KV cache holds, per the start-up line; the same, per /metrics)."""
    line = next(l for l in server.output().splitlines() if "KV cache" in l and "blocks of" in l)
    tokens = int(re.search(r"= ([0-9,]+) tokens", line).group(1).replace(",", ""))
    return tokens, server.metric("anatomy_kv_cache_tokens")


def test_an_int8_cache_holds_twice_the_tokens_and_answers():
    servers = {kv: Server("--kv-dtype", kv, "--kv-memory", "64MiB", "--embedding-model", "none")
               for kv in ("bf16", "int8")}
    try:
        (bf16, bf16_metric), (int8, int8_metric) = capacity(servers["bf16"]), capacity(servers["int8"])
        assert bf16_metric == bf16 and int8_metric == int8
        assert 1.9 < int8 / bf16 < 2.0  # 23,040 B a token in bf16, 11,880 B in int8 (codes + float16 scales)
        answer = servers["int8"].client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "What is the capital of France?"}], max_tokens=12,
            temperature=0)
        assert "Paris" in answer.choices[0].message.content
    finally:
        for server in servers.values():
            server.close()
