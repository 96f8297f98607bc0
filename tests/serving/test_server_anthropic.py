"""Anthropic's Messages API on `anatomy serve --weights f32`, through the official anthropic SDK: the
text answer == the chat route's for the same messages (greedy), streamed == whole (the SDK's stream
accumulator), system prompts and multi-turn, a prefill, stop_sequences, max_tokens, a forced tool
call and its result fed back, count_tokens == the answer's input_tokens, and errors in Anthropic's
shape (the SDK's exception classes; hostile bodies get a 4xx naming the field)."""

from __future__ import annotations

import json

import anthropic
import pytest

from .conftest import Server

MODEL = "smollm2-135m-instruct"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {"name": "get_weather", "description": "Get the current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                            "required": ["city"], "additionalProperties": False}}
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server():
    s = Server("--weights", "f32", "--kv-memory", "128MiB", "--embedding-model", "none")
    yield s
    s.close()


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)


GREEDY = {"temperature": 0}  # the SDK no longer has the field: sent as an extra


def ask(claude, **options):
    return claude.messages.create(**{"model": MODEL, "max_tokens": 30, "messages": FRANCE, "extra_body": GREEDY,
                                     **options})


def chat_answer(server, messages, max_tokens=30) -> str:
    r = server.client().chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=max_tokens)
    return r.choices[0].message.content


def streamed(claude, **options):
    """(the text deltas joined, the SDK's accumulated final message)."""
    with claude.messages.stream(**{"model": MODEL, "max_tokens": 30, "messages": FRANCE, "extra_body": GREEDY,
                                   **options}) as stream:
        text = "".join(stream.text_stream)
        return text, stream.get_final_message()


def test_the_answer_is_the_chat_routes_and_streams_the_same(server, claude):
    r = ask(claude)
    assert r.type == "message" and r.role == "assistant" and r.id.startswith("msg_") and r.model == MODEL
    assert [b.type for b in r.content] == ["text"] and r.content[0].text == chat_answer(server, FRANCE)
    assert "Paris" in r.content[0].text and r.stop_reason == "end_turn" and r.stop_sequence is None
    assert r.usage.output_tokens > 0 and r.usage.input_tokens > 5
    text, final = streamed(claude)
    assert text == final.content[0].text == r.content[0].text
    assert (final.stop_reason, final.usage.input_tokens, final.usage.output_tokens) == \
        (r.stop_reason, r.usage.input_tokens, r.usage.output_tokens)
    kinds = [e.type for e in ask(claude, stream=True)]
    assert kinds[:3] == ["message_start", "content_block_start", "content_block_delta"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_system_prompt_multi_turn_and_count_tokens(server, claude):
    turns = FRANCE + [{"role": "assistant", "content": "Paris."},
                      {"role": "user", "content": [{"type": "text", "text": "And of Italy?"}]}]
    system = "Answer with one word."
    r = ask(claude, system=[{"type": "text", "text": system}], messages=turns)
    expected = chat_answer(server, [{"role": "system", "content": system}, *FRANCE,
                                    {"role": "assistant", "content": "Paris."},
                                    {"role": "user", "content": "And of Italy?"}])
    assert r.content[0].text == expected
    assert claude.messages.count_tokens(model=MODEL, system=system, messages=turns).input_tokens == \
        r.usage.input_tokens
    alone = claude.messages.count_tokens(model=MODEL, messages=FRANCE).input_tokens
    assert alone == ask(claude, max_tokens=1).usage.input_tokens < r.usage.input_tokens


def test_a_prefill_is_continued(claude):
    whole = ask(claude).content[0].text
    assert len(whole.split(" ")) > 3
    start = " ".join(whole.split(" ")[:3])
    r = ask(claude, messages=FRANCE + [{"role": "assistant", "content": start}])
    assert start + r.content[0].text == whole, "greedy from the same tokens: the rest of the same answer"


def test_stop_sequences_and_max_tokens(claude):
    whole = ask(claude).content[0].text
    word = whole.split(" ")[2]
    for r in (ask(claude, stop_sequences=["zzqx", word]), streamed(claude, stop_sequences=["zzqx", word])[1]):
        assert (r.stop_reason, r.stop_sequence) == ("stop_sequence", word)
        assert r.content[0].text == whole[:whole.index(word)]
    for r in (ask(claude, max_tokens=3), streamed(claude, max_tokens=3)[1]):
        assert r.stop_reason == "max_tokens" and r.usage.output_tokens == 3


def test_output_config_format_is_followed(claude):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
              "additionalProperties": False}
    r = ask(claude, extra_body={**GREEDY, "output_config": {"format": {"type": "json_schema", "schema": schema}}},
            max_tokens=40)
    assert r.stop_reason == "end_turn" and set(json.loads(r.content[0].text)) == {"city"}


def words(n: int) -> list[dict]:
    return [{"role": "user", "content": "Repeat after me: " + "word " * n}]


def test_max_tokens_past_the_context_is_cut_to_it(server, claude):
    context = server.client().models.list().data[0].max_model_len
    n = 100 + context - 4 - claude.messages.count_tokens(model=MODEL, messages=words(100)).input_tokens
    r = ask(claude, messages=words(n), max_tokens=10_000)
    assert context - 8 < r.usage.input_tokens < context
    assert r.stop_reason == "model_context_window_exceeded"
    assert r.usage.input_tokens + r.usage.output_tokens == context


def test_a_forced_tool_call_round_trips(claude):
    ask_weather = [{"role": "user", "content": "What is the weather in Oslo?"}]
    options = dict(messages=ask_weather, tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"},
                   max_tokens=60)
    r = ask(claude, **options)
    call = r.content[-1]
    assert r.stop_reason == "tool_use" and isinstance(call, anthropic.types.ToolUseBlock)
    assert call.id.startswith("toolu_") and call.name == "get_weather" and isinstance(call.input, dict)
    assert isinstance(call.input["city"], str)
    final = streamed(claude, **options)[1]
    assert final.stop_reason == "tool_use" and final.content[-1].input == call.input
    anyone = ask(claude, **{**options, "tool_choice": {"type": "any"}})
    assert anyone.stop_reason == "tool_use" and anyone.content[-1].name == "get_weather"
    turns = ask_weather + [{"role": "assistant", "content": r.content},
                           {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                         "content": "5 degrees Celsius and snow"}]}]
    answer = ask(claude, messages=turns, tools=[WEATHER], tool_choice={"type": "none"}, max_tokens=30)
    assert answer.content and answer.content[0].type == "text" and answer.content[0].text
    assert answer.stop_reason in ("end_turn", "max_tokens")
    alone = claude.messages.count_tokens(model=MODEL, messages=ask_weather).input_tokens
    assert answer.usage.input_tokens > alone + 20, "the call and its result are in the prompt"
    assert claude.messages.count_tokens(model=MODEL, messages=turns, tools=[WEATHER],
                                        tool_choice={"type": "none"}).input_tokens == answer.usage.input_tokens


def test_errors_are_the_sdks_exceptions(claude):
    with pytest.raises(anthropic.NotFoundError) as exc:
        ask(claude, model="claude-sonnet-4-5")
    assert exc.value.body["error"]["type"] == "not_found_error" and "claude-sonnet-4-5" in exc.value.message
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError) as exc:
        ask(claude, messages=[{"role": "user", "content": [image]}])
    assert exc.value.body["error"]["type"] == "invalid_request_error"
    assert "messages.0.content.0.type" in exc.value.message and "'image'" in exc.value.message


BASE = {"model": MODEL, "max_tokens": 5, "messages": FRANCE}
HOSTILE = [
    ({"model": MODEL, "messages": FRANCE}, "max_tokens"),
    ({**BASE, "max_tokens": "5"}, "max_tokens"),
    ({**BASE, "max_tokens": 0}, "max_tokens"),
    ({**BASE, "messages": "hi"}, "messages"),
    ({**BASE, "messages": []}, "messages"),
    ({**BASE, "messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
    ({**BASE, "messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    ({**BASE, "messages": [{"role": "user", "content": [{"type": "document"}]}]}, "messages.0.content.0.type"),
    ({**BASE, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]},
     "messages.0.content.0.type"),
    ({**BASE, "messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages.0.content.0.text"),
    ({**BASE, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                         "content": [{"type": "image"}]}]}]},
     "messages.0.content.0.content.0.type"),
    ({**BASE, "system": [{"type": "text", "text": 3}]}, "system.0.text"),
    ({**BASE, "temperature": 1.5}, "temperature"),
    ({**BASE, "top_k": -1}, "top_k"),
    ({**BASE, "stream": "yes"}, "stream"),
    ({**BASE, "stop_sequences": [""]}, "stop_sequences"),
    ({**BASE, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0.type"),
    ({**BASE, "tools": [{"name": "has space", "input_schema": {}}]}, "tools.0.name"),
    ({**BASE, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name"),
    ({**BASE, "tool_choice": {"type": "any"}}, "tool_choice"),
    ({**BASE, "max_tokens": 100_000_000, "messages": [{"role": "user", "content": "word " * 9000}]}, "messages"),
    ({**BASE, "thinking": {"type": "enabled", "budget_tokens": 2}}, "--reasoning-parser"),
    ({**BASE, "thinking": {"type": "enabled", "budget_tokens": 5}}, "thinking.budget_tokens"),
    ({**BASE, "thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
    ({**BASE, "thinking": {"type": "always"}}, "thinking.type"),
    ({**BASE, "messages": [{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}]},
     "messages.0.content.0.type"),
    ({**BASE, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "thinking"}]},
                           {"role": "user", "content": "and?"}]}, "messages.1.content.0.thinking"),
    (b"{not json", "JSON"),
    ([1, 2], "JSON object"),
]


def bad_request(server, path: str, body, named: str) -> None:
    status, answer = server.post(path, body)
    assert status == 400 and answer["type"] == "error", answer
    assert answer["error"]["type"] == "invalid_request_error" and named in answer["error"]["message"], answer


@pytest.mark.parametrize("body, named", HOSTILE, ids=[named for _, named in HOSTILE])
def test_hostile_bodies_get_a_400_naming_the_field(server, body, named):
    bad_request(server, "/v1/messages", body, named)


def test_count_tokens_refuses_what_messages_refuses_and_the_server_serves_on(server):
    for body, named in HOSTILE[3:12] + HOSTILE[16:20] + HOSTILE[-2:]:  # the prompt's fields, and bodies no API takes
        bad_request(server, "/v1/messages/count_tokens", body, named)
    status, answer = server.post("/v1/messages", {**BASE, "model": "gpt-4"})
    assert status == 404 and answer["error"]["type"] == "not_found_error" and "gpt-4" in answer["error"]["message"]
    status, text = server.get("/v1/messages")
    assert status == 405 and '"type":"error"' in text
    status, answer = server.post("/v1/messages", BASE)
    assert status == 200 and answer["usage"]["output_tokens"] == 5 and answer["stop_reason"] == "max_tokens"
