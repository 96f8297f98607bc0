"""`anatomy serve --kv-offload-dir` across a restart, through the openai client (f32 weights, greedy):
a ~2,000-token prompt served, the server stopped (its cached blocks written) and started again
with the same directory: the same prompt gives the same answer with only its tail computed
(/metrics); once its files are damaged, they are ignored with a log line and it is computed again,
with the same answer."""

from __future__ import annotations

import pytest

from .conftest import Server

MODEL = "smollm2-135m-instruct"
LONG = " ".join(f"Item {i} of the list is the word {w}." for i, w in
                enumerate(["apple", "river", "stone", "cloud", "lamp", "paper", "green", "seven"] * 20))
OTHER = LONG.replace("Item", "Entry")

pytestmark = pytest.mark.slow


def start(directory) -> Server:
    return Server("--weights", "f32", "--kv-memory", "128MiB", "--embedding-model", "none",
                  "--kv-offload-dir", str(directory))


def complete(server: Server, prompt: str) -> tuple[str, int, float]:
    """(the answer, the prompt's tokens, prompt tokens the server computed for it)."""
    before = server.metric("anatomy_prompt_tokens_total")
    answer = server.client(timeout=300).completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
    return answer.choices[0].text, answer.usage.prompt_tokens, server.metric("anatomy_prompt_tokens_total") - before


def test_the_prefix_cache_outlives_a_restart(tmp_path):
    server = start(tmp_path)
    try:
        cold, tokens, computed = complete(server, LONG)
    finally:
        server.close()
    assert 1800 <= tokens <= 2600 and computed == tokens
    assert len(list(tmp_path.glob("*.kv"))) >= tokens // 16

    server = start(tmp_path)
    try:
        warm, _, computed = complete(server, LONG)
        assert warm == cold and computed <= 16, "every full block but the last token's was restored"
        assert server.metric("anatomy_kv_offload_restored_blocks_total") == (tokens - 1) // 16
        complete(server, OTHER)  # evicts most of LONG's blocks from the pool (128 MiB holds one of the two)
        for path in tmp_path.glob("*.kv"):
            path.write_bytes(path.read_bytes()[:100])  # truncated
        restored = server.metric("anatomy_kv_offload_restored_blocks_total")
        again, _, computed = complete(server, LONG)
        assert again == cold and computed > 16, "what the pool no longer holds is computed again"
        assert server.metric("anatomy_kv_offload_restored_blocks_total") == restored
        assert "ignoring the KV block file" in server.output() and "(truncated?)" in server.output()
    finally:
        server.close()
