"""`anatomy serve --backend torch`: the server runs the torch backend (what a GPU runs: dense products,
torch's norms, SDPA over the paged cache, nothing captured) and answers as the cpu backend does on fp32
weights; its start-up report names the backend."""

from __future__ import annotations

import pytest

import anatomy

from .conftest import Server

MODEL = "smollm2-135m-instruct"
PROMPT = "The capital of France is"

pytestmark = pytest.mark.slow


def test_the_torch_backend_serves_the_cpu_backends_greedy_answer(smollm2, smollm2_tokenizer):
    server = Server("--backend", "torch", "--weights", "f32", "--kv-memory", "64MiB", "--embedding-model", "none")
    try:
        answer = server.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0)
        assert "0 decode-step shapes captured (torch backend)" in server.output()
    finally:
        server.close()
    expected = anatomy.generate(smollm2, PROMPT, tokenizer=smollm2_tokenizer, max_new_tokens=16, ignore_eos=True)
    assert answer.choices[0].text == expected.text[:len(answer.choices[0].text)] and answer.choices[0].text
