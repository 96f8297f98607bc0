"""`anatomy serve --scheduling-policy priority` through the openai client: a high-priority request
sent while long low-priority ones hold every batch slot finishes first (one of them is preempted and
recomputed), and the preempted answers equal the same requests served alone (f32 weights, greedy);
bad priorities get 400 naming the field. (FCFS's refusal of a priority is in test_server.py.)"""

from __future__ import annotations

import threading

import openai
import pytest

from .conftest import Server

MODEL = "smollm2-135m-instruct"
LOW = dict(max_tokens=80, temperature=0, extra_body={"ignore_eos": True, "priority": 5})

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server():
    s = Server("--weights", "f32", "--kv-memory", "64MiB", "--embedding-model", "none", "--batch-size", "2",
               "--scheduling-policy", "priority")
    yield s
    s.close()


def ask(client, text: str, **options):
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}], **options)


class LowStream(threading.Thread):
    """A streamed low-priority request; `started` is set at its first token, `text` joined at its end."""

    def __init__(self, client, text: str) -> None:
        super().__init__(daemon=True)
        self.client, self.question, self.text = client, text, ""
        self.started, self.done = threading.Event(), threading.Event()
        self.start()

    def run(self) -> None:
        for chunk in ask(self.client, self.question, stream=True, **LOW):
            if chunk.choices and chunk.choices[0].delta.content:
                self.text += chunk.choices[0].delta.content
                self.started.set()
        self.done.set()


def test_a_high_priority_request_into_a_full_server_finishes_first(server):
    client = server.client(timeout=300)
    before = server.metric("anatomy_preemptions_total")
    lows = [LowStream(client, q) for q in ("Tell me about rivers.", "Tell me about mountains.")]
    assert all(low.started.wait(120) for low in lows), server.output()
    answer = ask(client, "What is 2 + 2?", max_tokens=8, temperature=0, extra_body={"priority": -1})
    assert answer.choices[0].message.content and not any(low.done.is_set() for low in lows), \
        "the high-priority answer came while both batch slots were taken by long low-priority streams"
    for low in lows:
        low.join(300)
    assert server.metric("anatomy_preemptions_total") > before, "a low-priority stream gave its slot"
    for low in lows:  # recomputed after preemption: the same greedy text as alone
        alone = ask(client, low.question, **LOW).choices[0].message.content
        assert low.text == alone


def test_priority_through_completions_and_responses(server):
    client = server.client()
    text = client.completions.create(model=MODEL, prompt="One, two,", max_tokens=4, temperature=0,
                                     extra_body={"priority": 3}).choices[0].text
    assert text
    response = client.responses.create(model=MODEL, input="Say hi.", max_output_tokens=4, extra_body={"priority": 2})
    assert response.output_text


@pytest.mark.parametrize("priority", ["high", 1.5, 2 ** 63])
def test_a_bad_priority_is_a_400_naming_it(server, priority):
    with pytest.raises(openai.BadRequestError) as info:
        ask(server.client(), "Hi", max_tokens=2, extra_body={"priority": priority})
    assert info.value.body["param"] == "priority"
