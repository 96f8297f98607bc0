"""`anatomy serve --draft-model`: a draft model's proposals verified in the serving loop, through the
official `openai` client. The target runs in f32 (where greedy output is the same whatever the step's
batch), the draft is the GGUF file's own Q4_1 blocks (--draft-weights auto): greedy answers, streamed
or not, alone or eight at once, are those of plain serving (`speculative.n_max: 0` on the same server)."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from .conftest import Server

MODEL = "smollm2-135m-instruct"
GROUNDED = ("Repeat this list exactly, one item per line: alpha, bravo, charlie, delta, echo, foxtrot, golf, "
            "hotel, india, juliet.")
QUESTIONS = [GROUNDED, "What is the capital of France?", "Name three colours.", "Count from one to ten in words."]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server():
    s = Server("--weights", "f32", "--speculative", "draft", "--model-draft", MODEL, "--draft-weights", "auto", "--num-speculative-tokens", "4",
               "--kv-memory", "64MiB", "--embedding-model", "none")
    yield s
    s.close()


def answer(client, question: str, **options) -> str:
    messages = [{"role": "user", "content": question}]
    if options.pop("stream", False):
        chunks = client.chat.completions.create(model=MODEL, messages=messages, stream=True, **options)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return client.chat.completions.create(model=MODEL, messages=messages, **options).choices[0].message.content


def test_draft_proposals_give_plain_greedy_answers(server):
    client = server.client()
    greedy = dict(max_tokens=48, temperature=0)
    plain = [answer(client, q, **greedy, extra_body={"speculative.n_max": 0}) for q in QUESTIONS]
    assert [answer(client, q, **greedy) for q in QUESTIONS] == plain
    assert answer(client, GROUNDED, **greedy, stream=True) == plain[0]
    with ThreadPoolExecutor(8) as pool:
        batched = list(pool.map(lambda q: answer(client, q, **greedy), QUESTIONS * 2))
    assert batched == plain * 2
    status, metrics = server.get("/metrics")
    drafted = int(re.search(r"anatomy_spec_decode_num_draft_tokens_total\{[^}]*\} (\d+)", metrics).group(1))
    kept = int(re.search(r"anatomy_spec_decode_num_accepted_tokens_total\{[^}]*\} (\d+)", metrics).group(1))
    assert status == 200 and 0 < kept <= drafted
    assert kept > drafted / 2, "the Q4_1 copy of the target guesses most of its greedy tokens"
    assert re.search(r"speculative decoding draft, up to 4 tokens per step \(draft smollm2-135m-instruct: "
                     r"weights \d+ MB a step, its KV cache \d+ MiB", server.output())
