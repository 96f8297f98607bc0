"""What real clients send, against `anatomy serve --weights f32` through the official openai client:
structured outputs (JSON schemas validated with jsonschema, under concurrency 8, streamed too; regex,
choice), tool calls with tool_choice required / named / auto and their round trips, streamed;
completions with echo and prompt logprobs (against the model's own log-softmax, from the prefix cache
too); logit_bias; the Responses API; vLLM's tokenizer endpoints and continuous usage; unknown fields;
and the bad input each of these can bring (one OpenAI-style 400 naming the field)."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest
import torch

from .conftest import Server

MODEL = "smollm2-135m-instruct"
pytestmark = pytest.mark.slow

SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"type": "string", "enum": ["admin", "user", "guest"]}},
        "required": ["name", "age", "role"], "additionalProperties": False},
    "nested": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20},
        "location": {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                     "required": ["lat", "lon"], "additionalProperties": False}},
        "required": ["city", "location"], "additionalProperties": False},
    "list": {"type": "object", "properties": {
        "colors": {"type": "array", "items": {"type": "string", "enum": ["red", "green", "blue"]},
                   "minItems": 1, "maxItems": 3},
        "count": {"type": "integer", "minimum": 1, "maximum": 3}},
        "required": ["colors", "count"], "additionalProperties": False},
    "flags": {"type": "object", "properties": {"ok": {"type": "boolean"}, "note": {"type": ["string", "null"],
                                                                                   "maxLength": 20}},
              "required": ["ok", "note"], "additionalProperties": False},
}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "Get the time in a time zone",
                                          "parameters": {"type": "object", "properties": {
                                              "zone": {"type": "string", "enum": ["UTC", "CET"]}},
                                              "required": ["zone"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server():
    s = Server("--weights", "f32", "--kv-memory", "192MiB", "--embedding-model", "none")
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def chat(client, **options):
    return client.chat.completions.create(model=MODEL, **{"messages": ASK, "temperature": 0, **options})


# -- structured outputs ----------------------------------------------------------------------------

def test_json_schemas_under_concurrency_validate(client):
    def ask(name: str, stream: bool) -> str:
        options = dict(messages=[{"role": "user", "content": f"Give me an example {name} as JSON."}],
                       response_format={"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name]}},
                       max_tokens=120, temperature=0.7, seed=len(name))
        if stream:
            return "".join(c.choices[0].delta.content or "" for c in chat(client, stream=True, **options) if c.choices)
        r = chat(client, **options)
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        return r.choices[0].message.content

    jobs = [(name, stream) for name in SCHEMAS for stream in (False, True)]
    with ThreadPoolExecutor(8) as pool:
        outputs = list(pool.map(lambda job: ask(*job), jobs))
    for (name, _), text in zip(jobs, outputs):
        jsonschema.validate(json.loads(text), SCHEMAS[name])
    by_name = dict(zip(jobs, outputs))
    assert all(by_name[(n, False)] == by_name[(n, True)] for n in SCHEMAS), "streamed == whole (same seed)"


def test_json_object_regex_and_choice(client):
    r = chat(client, response_format={"type": "json_object"}, max_tokens=200)
    assert r.choices[0].finish_reason == "length" or isinstance(json.loads(r.choices[0].message.content), dict)
    assert r.choices[0].message.content.startswith("{")
    date = chat(client, extra_body={"guided_regex": r"20[0-9]{2}-[01][0-9]-[0-3][0-9]"}).choices[0].message.content
    assert re.fullmatch(r"20[0-9]{2}-[01][0-9]-[0-3][0-9]", date)
    pick = chat(client, extra_body={"structured_outputs": {"choice": ["sunny", "rainy", "cloudy"]}})
    assert pick.choices[0].message.content in ("sunny", "rainy", "cloudy") and pick.choices[0].finish_reason == "stop"
    grammar = 'root ::= "yes" | "no"'
    assert chat(client, extra_body={"guided_grammar": grammar}).choices[0].message.content in ("yes", "no")
    text = client.completions.create(model=MODEL, prompt="Answer yes or no: is water wet?", max_tokens=5,
                                     extra_body={"guided_choice": ["yes", "no"]}).choices[0].text
    assert text in ("yes", "no"), "completions take the structured-output fields too"


# -- tool calls --------------------------------------------------------------------------------------

def round_trip(client, calls, stream: bool) -> str:
    """The tool result fed back; the model's answer (no tools offered: a text answer)."""
    messages = ASK + [{"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in calls]}] + \
        [{"role": "tool", "tool_call_id": c.id, "content": "22 degrees Celsius and sunny"} for c in calls]
    if stream:
        return "".join(c.choices[0].delta.content or "" for c in
                       chat(client, messages=messages, tools=[WEATHER, CLOCK], tool_choice="none", max_tokens=30,
                            stream=True) if c.choices)
    answer = chat(client, messages=messages, tools=[WEATHER, CLOCK], tool_choice="none", max_tokens=30)
    assert answer.choices[0].message.tool_calls is None
    return answer.choices[0].message.content


def streamed_calls(chunks) -> tuple[list[dict], str | None]:
    """Tool calls joined from streamed deltas the way the openai client's users join them."""
    calls: dict[int, dict] = {}
    finish = None
    for chunk in chunks:
        if not chunk.choices:
            continue
        for d in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            call["id"] = call["id"] or d.id
            call["name"] += (d.function.name or "") if d.function else ""
            call["arguments"] += (d.function.arguments or "") if d.function else ""
        finish = chunk.choices[0].finish_reason or finish
    return [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["required", "named"])
def test_tool_choice_is_enforced_and_round_trips(client, choice):
    r = chat(client, tools=[WEATHER, CLOCK], tool_choice=choice, max_tokens=60)
    message = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and message.tool_calls
    for call in message.tool_calls:
        assert call.id.startswith("call_") and call.type == "function"
        schema = {"get_weather": WEATHER, "get_time": CLOCK}[call.function.name]["function"]["parameters"]
        jsonschema.validate(json.loads(call.function.arguments), schema)
    if isinstance(choice, dict):
        assert [c.function.name for c in message.tool_calls] == ["get_weather"]
    calls, finish = streamed_calls(chat(client, tools=[WEATHER, CLOCK], tool_choice=choice, max_tokens=60,
                                        stream=True))
    assert finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in calls] == \
        [(c.function.name, c.function.arguments) for c in message.tool_calls], "streamed deltas join to the same calls"
    assert all(c["id"].startswith("call_") for c in calls)
    answer = round_trip(client, message.tool_calls, stream=False)
    assert isinstance(answer, str) and answer
    assert round_trip(client, message.tool_calls, stream=True) == answer


def test_tool_choice_auto_answers_well_formed(client):
    r = chat(client, tools=[WEATHER, CLOCK], max_tokens=40)
    choice = r.choices[0]
    if choice.message.tool_calls:  # a call the 135M model chose to make: well formed
        assert choice.finish_reason == "tool_calls"
        assert all(c.function.name in ("get_weather", "get_time") for c in choice.message.tool_calls)
    else:
        assert choice.message.content and choice.finish_reason in ("stop", "length")
    plain = chat(client, max_tokens=40)
    assert plain.choices[0].message.tool_calls is None


# -- echo and logprobs (lm-eval's scoring requests) -------------------------------------------------

def reference_logprobs(model, ids: list[int]) -> list[float]:
    with torch.no_grad():
        logp = model(torch.tensor([ids]))[0].float().log_softmax(-1)
    return [float(logp[p - 1, ids[p]]) for p in range(1, len(ids))]


def test_echo_with_logprobs_equals_the_model_and_the_prefix_cache(server, client, smollm2):
    context = "Question: What is the largest planet in the solar system? Think about the gas giants first. Answer:"
    ids = server.post("/tokenize", {"prompt": context + " Jupiter", "add_special_tokens": False})[1]["tokens"]
    expected = reference_logprobs(smollm2, ids)
    first = client.completions.create(model=MODEL, prompt=[ids], max_tokens=1, logprobs=1, echo=True, temperature=0)
    again = client.completions.create(model=MODEL, prompt=[ids], max_tokens=0, logprobs=1, echo=True)
    for r, generated in ((first, 1), (again, 0)):
        lp = r.choices[0].logprobs
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None, "the first prompt token: null"
        assert len(lp.tokens) == len(ids) + generated
        assert lp.token_logprobs[1:len(ids)] == pytest.approx(expected, abs=1e-3)
        assert all(len(top) == 1 for top in lp.top_logprobs[1:])
        assert r.choices[0].text.startswith(context)
    assert again.choices[0].finish_reason == "length" and again.usage.completion_tokens == 0
    assert again.choices[0].logprobs.token_logprobs == first.choices[0].logprobs.token_logprobs[:-1], \
        "the second request's prefix came from the cache, its logprobs from the kept entries"
    batch = client.completions.create(model=MODEL, prompt=[ids, ids[:10]], max_tokens=1, logprobs=2, echo=True,
                                      temperature=0)  # greedy: a sampled end of text would add no token
    assert [len(c.logprobs.tokens) for c in batch.choices] == [len(ids) + 1, 11]


def test_logit_bias_on_chat_and_completions(server, client):
    greedy = chat(client, max_tokens=1, logprobs=True).choices[0].logprobs.content[0].token
    token = server.post("/tokenize", {"prompt": greedy, "add_special_tokens": False})[1]["tokens"][0]
    banned = chat(client, max_tokens=1, logit_bias={str(token): -100}).choices[0].message.content
    assert banned != greedy
    forced = client.completions.create(model=MODEL, prompt="Hello", max_tokens=3, logit_bias={"42": 100},
                                       temperature=1.0, seed=3)
    assert forced.choices[0].text == server.post("/detokenize", {"tokens": [42, 42, 42]})[1]["prompt"]


# -- the Responses API, vLLM's endpoints, vendor fields ------------------------------------------------

def test_responses_api(client):
    r = client.responses.create(model=MODEL, input="What is the capital of France?", temperature=0,
                                max_output_tokens=30)
    assert r.object == "response" and r.status == "completed" and "Paris" in r.output_text
    assert r.usage.output_tokens > 0 and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    same = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content":
                                                                  "What is the capital of France?"}],
                                          temperature=0, max_tokens=30)
    assert r.output_text == same.choices[0].message.content
    short = client.responses.create(model=MODEL, instructions="Answer in French.",
                                    input=[{"role": "user", "content": [{"type": "input_text", "text": "Say hi"}]}],
                                    max_output_tokens=3)
    assert short.status == "incomplete" and short.incomplete_details.reason == "max_output_tokens"
    events = list(client.responses.create(model=MODEL, input="What is the capital of France?", temperature=0,
                                          max_output_tokens=30, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"] and kinds[-1] == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
    assert events[-1].response.output_text == r.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_responses_api_tool_call(client):
    tools = [{"type": "function", **WEATHER["function"]}]
    r = client.responses.create(model=MODEL, input="Weather in Oslo?", tools=tools, tool_choice="required",
                                max_output_tokens=60, temperature=0)  # greedy: sampled arguments may not end in 60
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and json.loads(calls[0].arguments)["city"]
    follow = client.responses.create(model=MODEL, max_output_tokens=20, temperature=0, input=[
        {"role": "user", "content": "Weather in Oslo?"},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "5 C, snow"}])
    alone = client.responses.create(model=MODEL, max_output_tokens=1, input="Weather in Oslo?")
    assert follow.output_text and follow.usage.input_tokens > alone.usage.input_tokens + 20, "the call and its result"


def test_tokenizer_endpoints_in_vllms_shapes(server):
    status, info = server.get("/tokenizer_info")
    info = json.loads(info)
    assert status == 200 and info["eos_token"] == "<|im_end|>" and info["chat_template"]
    status, body = server.post("/tokenize", {"prompt": "test", "add_special_tokens": False, "return_token_strs": True})
    assert status == 200 and set(body) == {"tokens", "count", "max_model_len", "token_strs"}
    assert body["count"] == len(body["tokens"]) == len(body["token_strs"])
    assert server.post("/tokenize", {"prompt": "<|im_end|>", "add_special_tokens": False})[1]["tokens"] == [2]


def test_continuous_usage_stats_and_unknown_fields(server, client):
    chunks = list(chat(client, max_tokens=5, stream=True, stream_options={"include_usage": True},
                       extra_body={"stream_options": {"include_usage": True, "continuous_usage_stats": True},
                                   "cache_prompt": True, "frobnicate_the_output": 3}))
    assert all(c.usage is not None for c in chunks), "vLLM's continuous usage: the usage so far in every chunk"
    assert [c.usage.completion_tokens for c in chunks][-1] == 5
    assert "frobnicate_the_output" in server.output() and "ignoring unrecognized fields" in server.output()


BAD = [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strnig"}}}},
     "response_format.json_schema.schema", "cannot compile"),
    ({"guided_regex": "(("}, "guided_regex", "regex"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools.0.function.name", "required"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice",
     "not in tools"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"response_format": {"type": "json_object"}, "guided_choice": ["a"]}, "guided_choice", "give one of them"),
    ({"logit_bias": {"not-a-token": 5}}, "logit_bias", "not a token id"),
    ({"logit_bias": {"12": 500}}, "logit_bias", "[-100, 100]"),
    ({"functions": [{"name": "f"}]}, "functions", "not supported"),
]


@pytest.mark.parametrize("extra, param, words", BAD)
def test_bad_requests_get_one_400_naming_the_field(server, extra, param, words):
    status, answer = server.post("/v1/chat/completions", {"model": MODEL, "messages": ASK, "max_tokens": 2, **extra})
    assert status == 400, answer
    assert answer["error"]["param"] == param and words in answer["error"]["message"], answer
    assert server.post("/v1/chat/completions", {"model": MODEL, "messages": ASK, "max_tokens": 2})[0] == 200


def test_bad_completion_and_responses_requests(server, client):
    status, answer = server.post("/v1/completions", {"model": MODEL, "prompt": "x", "echo": True, "n": 2,
                                                     "logprobs": 1})
    assert status == 400 and answer["error"]["param"] == "n" and "echo" in answer["error"]["message"]
    with pytest.raises(openai.BadRequestError) as exc:
        client.responses.create(model=MODEL, input="x", previous_response_id="resp_1")
    assert exc.value.body["param"] == "previous_response_id"
    status, answer = server.post("/v1/responses", {"model": MODEL, "input": "x", "tools": [{"type": "function"}]})
    assert status == 400 and answer["error"]["param"] == "tools.0.name"
