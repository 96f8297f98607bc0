"""Tool calls without a model: hand-written outputs of each family's format parsed into OpenAI calls,
streamed in pieces (any split) to the same calls and content; the conversation of a round trip
(call -> tool result) rendered by a template without tool support (SmolLM2's: the Hermes prompt in the
system message) and by templates that render tools themselves (Hermes/Qwen-style, Llama-3-style)."""

from __future__ import annotations

import json

import pytest

from anatomy.serving.chat_prompt import renders_tools, with_tool_prompt
from anatomy.serving.protocol import ChatRequest
from anatomy.serving.tools import ToolStream, choice_grammar, parse_output

NAMES = {"get_weather", "get_time"}
WEATHER = '{"city": "Paris", "unit": "celsius"}'

OUTPUTS = {  # format -> (model output, content, [(name, arguments)])
    "hermes": ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": ' + WEATHER + '}\n</tool_call>',
               "Let me check.", [("get_weather", WEATHER)]),
    "hermes, two calls": ('<tool_call>{"name": "get_weather", "arguments": ' + WEATHER + '}</tool_call>\n'
                          '<tool_call>{"name": "get_time", "arguments": {"zone": "CET"}}</tool_call>',
                          None, [("get_weather", WEATHER), ("get_time", '{"zone": "CET"}')]),
    "hermes, unclosed at the end": ('<tool_call>\n{"name": "get_time", "arguments": {}}', None, [("get_time", "{}")]),
    "llama3_json": ('{"name": "get_weather", "parameters": ' + WEATHER + '}', None, [("get_weather", WEATHER)]),
    "llama3_json, python_tag": ('<|python_tag|>{"name": "get_time", "parameters": {"zone": "UTC"}}', None,
                                [("get_time", '{"zone": "UTC"}')]),
    "llama3_json, two": ('{"name": "get_time", "parameters": {}}; {"name": "get_weather", "parameters": ' + WEATHER
                         + '}', None, [("get_time", "{}"), ("get_weather", WEATHER)]),
    "mistral": ('[TOOL_CALLS] [{"name": "get_weather", "arguments": ' + WEATHER + '}]', None,
                [("get_weather", WEATHER)]),
    "mistral, marker skipped": ('[{"name": "get_time", "arguments": {"zone": "UTC"}}]', None,
                                [("get_time", '{"zone": "UTC"}')]),
    "plain text": ("It is sunny in Paris.", "It is sunny in Paris.", []),
    "JSON that is not a call": ('{"city": "Paris"}', '{"city": "Paris"}', []),
    "an unknown function": ('<tool_call>{"name": "launch", "arguments": {}}</tool_call>',
                            '<tool_call>{"name": "launch", "arguments": {}}</tool_call>', []),
}


def calls_of(calls) -> list[tuple[str, str]]:
    return [(c.name, json.dumps(json.loads(c.arguments))) for c in calls]


@pytest.mark.parametrize("name", list(OUTPUTS))
def test_each_format_parses_into_calls(name):
    text, content, expected = OUTPUTS[name]
    got_content, calls = parse_output(text, "auto", NAMES)
    assert got_content == content and calls_of(calls) == [(n, json.dumps(json.loads(a))) for n, a in expected]


@pytest.mark.parametrize("name", list(OUTPUTS))
@pytest.mark.parametrize("size", [1, 3, 7])
def test_streamed_in_pieces_gives_the_same(name, size):
    text, content, expected = OUTPUTS[name]
    stream = ToolStream("auto", NAMES)
    pieces = []
    for i in range(0, len(text), size):
        pieces += stream.push(text[i:i + size])
    pieces += stream.finish()
    streamed = "".join(v for kind, v in pieces if kind == "content")
    assert (streamed.strip() or None if expected else streamed) == content
    assert calls_of(v for kind, v in pieces if kind == "call") == calls_of(parse_output(text, "auto", NAMES)[1])


def test_named_and_required_modes():
    content, calls = parse_output(WEATHER, "get_weather", NAMES)
    assert content is None and calls_of(calls) == [("get_weather", WEATHER)]
    stream = ToolStream("get_weather", NAMES)
    pieces = stream.push('{"city": ') + stream.push('"Oslo"}') + stream.finish()
    assert [k for k, _ in pieces] == ["call_start", "arguments", "arguments"], "arguments streamed as they come"
    required = '[{"name": "get_time", "parameters": {"zone": "UTC"}}, {"name": "get_weather", "parameters": {}}]'
    assert calls_of(parse_output(required, "required", NAMES)[1]) == [("get_time", '{"zone": "UTC"}'),
                                                                      ("get_weather", "{}")]


def tools_request(**extra) -> ChatRequest:
    return ChatRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [
        {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "get_time"}}], **extra})


def test_the_grammars_of_required_and_named():
    req = tools_request()
    named = choice_grammar(req.tools, "get_weather", parallel=True)
    assert named.kind == "json" and named.value["required"] == ["city"]
    required = choice_grammar(req.tools, "required", parallel=False)
    assert required.value["maxItems"] == 1 and len(required.value["items"]["anyOf"]) == 2
    assert choice_grammar(req.tools, "auto", parallel=True) is None


ROUND_TRIP = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "22 C, sunny"},
]

# a Hermes/Qwen-style template and a Llama-3-style one, written for these tests (the shapes of theirs)
HERMES_TEMPLATE = """{%- if tools %}<|im_start|>system
<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools><|im_end|>
{% endif %}{%- for m in messages %}{%- if m.role == 'tool' %}<|im_start|>user
<tool_response>{{ m.content }}</tool_response><|im_end|>
{% elif m.tool_calls %}<|im_start|>assistant
{% for c in m.tool_calls %}<tool_call>{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}</tool_call>{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
LLAMA3_TEMPLATE = """{%- for m in messages %}<|start_header_id|>{{ 'ipython' if m.role == 'tool' else m.role }}<|end_header_id|>

{% if m.role == 'user' and tools and loop.first %}{% for t in tools %}{{ t | tojson }}

{% endfor %}{% endif %}{% if m.tool_calls %}{% for c in m.tool_calls %}{"name": "{{ c.function.name }}", "parameters": {{ c.function.arguments | tojson }}}{% endfor %}{% else %}{{ m.content }}{% endif %}<|eot_id|>{%- endfor %}{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""


def rendered(tokenizer, template: str | None, messages) -> str:
    from anatomy.serving.chat_prompt import chat_ids
    from anatomy.text.tokenizer import Tokenizer

    if template is not None:
        tokenizer = Tokenizer(tokenizer.backend, source="test", special_tokens=tokenizer.special_tokens,
                              chat_template=template)
    req = tools_request(messages=messages)
    return tokenizer.decode(chat_ids(tokenizer, req.messages, tools=req.tools))


def test_a_template_without_tools_gets_the_hermes_prompt(smollm2_tokenizer):
    assert not renders_tools(smollm2_tokenizer)
    text = rendered(smollm2_tokenizer, None, ROUND_TRIP)
    assert text.startswith("<|im_start|>system\n# Tools") and '"name": "get_weather"' in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\n22 C, sunny\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    req = tools_request(messages=[{"role": "system", "content": "Be brief."}, *ROUND_TRIP])
    merged = with_tool_prompt(req.messages, [t.model_dump(exclude_none=True) for t in req.tools])
    assert merged[0]["content"].startswith("Be brief.\n\n# Tools"), "appended to the request's own system message"


@pytest.mark.parametrize("template, call", [
    (HERMES_TEMPLATE, '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'),
    (LLAMA3_TEMPLATE, '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
], ids=["hermes", "llama3"])
def test_templates_with_tools_render_them_and_the_round_trip(smollm2_tokenizer, template, call):
    text = rendered(smollm2_tokenizer, template, ROUND_TRIP)
    assert "# Tools" not in text, "no prompt of ours: the template writes the tools"
    assert '"name": "get_weather"' in text.split(call)[0], "the tool definitions"
    assert call in text, "the earlier call, its arguments as an object"
    assert "22 C, sunny" in text
