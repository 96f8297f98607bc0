"""The 2026 families' real chat templates render exactly what HF transformers' apply_chat_template renders:
gpt-oss's harmony format, SmolLM3's and DeepSeek-V3.1's (llama.cpp's models/templates, from the sources
`make test` unpacks) and Gemma 3's (tests/data). anatomy's side is Tokenizer.apply_chat_template (what
`anatomy.generate` and `anatomy chat` render with) and the server's chat_text (a request's messages,
tools and chat_template_kwargs); HF's is a PreTrainedTokenizerFast over the same vocabulary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tokenizers

from anatomy.serving.chat_prompt import chat_text
from anatomy.serving.protocol import ChatRequest
from anatomy.text.tokenizer import Tokenizer
from benchmarks.llama_cpp import llama_sources

transformers = pytest.importorskip("transformers")

# google/gemma-3-4b-it's tokenizer_config.json "chat_template", verbatim (1532 bytes); the same text as
# _CHAT_TEMPLATE in transformers' models/gemma3/convert_gemma3_weights_orbax_to_hf.py
GEMMA3 = Path(__file__).parent.parent / "data" / "google-gemma-3-4b-it.jinja"

SYSTEM_USER = [{"role": "system", "content": "You answer in one word."},
               {"role": "user", "content": "Capital of Italy?"}]
MULTI_TURN = [*SYSTEM_USER, {"role": "assistant", "content": "Rome."},
              {"role": "user", "content": "  And of France? 😀\n"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "description": "The city's name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}}]
# an OpenAI round trip as HF's docs write it: the call's content None, its arguments an object
ROUND_TRIP = [*SYSTEM_USER,
              {"role": "assistant", "content": None, "reasoning_content": "The user wants the weather.",
               "tool_calls": [{"id": "call_1", "type": "function",
                               "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
              {"role": "tool", "tool_call_id": "call_1", "content": "22 C, sunny"}]


def _pair(template: str, special_tokens: dict[str, str]) -> tuple[Tokenizer, object]:
    """anatomy's tokenizer and HF's, with `template` and the special tokens (by role) as the vocabulary."""
    vocab = {token: i for i, token in enumerate(dict.fromkeys(["<unk>", *special_tokens.values()]))}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    backend.add_special_tokens(list(vocab))
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=backend,
                                              **{f"{role}_token": t for role, t in special_tokens.items()})
    hf.chat_template = template
    ours = Tokenizer(tokenizers.Tokenizer.from_str(backend.to_str()), source="test", special_tokens=special_tokens,
                     chat_template=template)
    return ours, hf


def _assert_renders_as_hf(pair: tuple[Tokenizer, object], messages: list[dict], **variables) -> str:
    ours, hf = pair
    expected = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **variables)
    assert ours.apply_chat_template(messages, add_generation_prompt=True, **variables) == expected
    return expected


def _assert_served_as_hf(pair: tuple[Tokenizer, object], messages: list[dict], **variables) -> str:
    """The server's prompt for an OpenAI request (arguments as JSON text) is HF's for the same conversation."""
    ours, hf = pair
    tools = variables.pop("tools", None)
    expected = hf.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True, **variables)
    request = ChatRequest.model_validate({"model": "m", "messages": _as_openai(messages), "tools": tools,
                                          "chat_template_kwargs": variables or None})
    assert chat_text(ours, request.messages, tools=request.tools, variables=request.chat_template_kwargs) == expected
    return expected


def _as_openai(messages: list[dict]) -> list[dict]:
    """The messages as a client sends them: a call's arguments as JSON text."""
    def call(c: dict) -> dict:
        return {**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}

    return [{**m, "tool_calls": [call(c) for c in m["tool_calls"]]} if m.get("tool_calls") else m for m in messages]


@pytest.fixture(scope="module")
def llama_templates() -> Path:
    try:
        folder = llama_sources() / "models" / "templates"
    except RuntimeError as exc:
        pytest.skip(f"llama.cpp's sources (models/templates) are not here and could not be unpacked: {exc}")
    if not folder.is_dir():
        pytest.skip(f"llama.cpp's sources have no {folder}")
    return folder


@pytest.fixture(scope="module")
def gpt_oss(llama_templates):
    template = (llama_templates / "openai-gpt-oss-120b.jinja").read_text(encoding="utf-8")
    return _pair(template, {"bos": "<|startoftext|>", "eos": "<|return|>", "pad": "<|endoftext|>"})


@pytest.mark.parametrize("messages", [
    SYSTEM_USER, MULTI_TURN, [{"role": "developer", "content": "Answer in French."}, *MULTI_TURN[1:]],
    [{"role": "user", "content": "Hi"}]], ids=["system", "multi-turn", "developer", "user only"])
def test_gpt_oss_harmony(gpt_oss, messages):
    text = _assert_renders_as_hf(gpt_oss, messages)
    assert text.startswith("<|start|>system<|message|>") and text.endswith("<|start|>assistant")


@pytest.mark.parametrize("effort", ["low", "high"])
def test_gpt_oss_reasoning_effort(gpt_oss, effort):
    assert f"Reasoning: {effort}\n" in _assert_renders_as_hf(gpt_oss, SYSTEM_USER, reasoning_effort=effort)
    _assert_served_as_hf(gpt_oss, MULTI_TURN, reasoning_effort=effort)


def test_gpt_oss_tools_and_a_round_trip(gpt_oss):
    """The call's analysis is kept (its reasoning passed as `thinking`); content None is left out, as HF does."""
    text = _assert_renders_as_hf(gpt_oss, ROUND_TRIP, tools=TOOLS)
    assert "type get_weather = (_: {\n// The city's name\ncity: string,\nunit?: \"celsius\" | \"fahrenheit\"" in text
    assert "<|channel|>analysis<|message|>The user wants the weather.<|end|>" in text
    assert '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"22 C, sunny"<|end|>' in text
    _assert_served_as_hf(gpt_oss, SYSTEM_USER, tools=TOOLS)
    served = _assert_served_as_hf(gpt_oss, ROUND_TRIP, tools=TOOLS, reasoning_effort="low")
    assert "Reasoning: low\n" in served and "The user wants the weather." in served


@pytest.mark.parametrize("enable_thinking", [None, True, False])
@pytest.mark.parametrize("messages", [SYSTEM_USER, MULTI_TURN, [{"role": "user", "content": "Hi"}]],
                         ids=["system", "multi-turn", "user only"])
def test_smollm3(llama_templates, messages, enable_thinking):
    template = (llama_templates / "HuggingFaceTB-SmolLM3-3B.jinja").read_text(encoding="utf-8")
    pair = _pair(template, {"eos": "<|im_end|>", "pad": "<|im_end|>"})
    variables = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    text = _assert_renders_as_hf(pair, messages, **variables)
    assert ("/no_think" in text) == (enable_thinking is False)
    _assert_served_as_hf(pair, messages, **variables)


@pytest.mark.parametrize("thinking", [None, True, False])
@pytest.mark.parametrize("messages", [
    SYSTEM_USER, [*MULTI_TURN[:2], {"role": "assistant", "content": "<think>Italy.</think>Rome."}, MULTI_TURN[3]],
    ROUND_TRIP], ids=["system", "multi-turn", "round trip"])
def test_deepseek_v3_1(llama_templates, messages, thinking):
    template = (llama_templates / "deepseek-ai-DeepSeek-V3.1.jinja").read_text(encoding="utf-8")
    pair = _pair(template, {"bos": "<｜begin▁of▁sentence｜>", "eos": "<｜end▁of▁sentence｜>"})
    variables = {} if thinking is None else {"thinking": thinking}
    text = _assert_renders_as_hf(pair, messages, **variables)
    assert text.startswith("<｜begin▁of▁sentence｜>You answer in one word.")
    if messages is not ROUND_TRIP:  # its template writes no tool definitions: the server gives calls its own prompt
        _assert_served_as_hf(pair, messages, **variables)


@pytest.fixture(scope="module")
def gemma3():
    return _pair(GEMMA3.read_text(encoding="utf-8"), {"bos": "<bos>", "eos": "<eos>", "pad": "<pad>"})


def test_the_gemma3_template_is_the_published_one():
    """Unedited: its newlines in string literals are real ones (not \\n), as published."""
    assert len(GEMMA3.read_bytes()) == 1532 and "first_user_prefix" in GEMMA3.read_text(encoding="utf-8")


@pytest.mark.parametrize("messages", [
    SYSTEM_USER, MULTI_TURN, MULTI_TURN[1:],
    [{"role": "system", "content": [{"type": "text", "text": "You answer in one word."}]},
     {"role": "user", "content": [{"type": "text", "text": " Capital "}, {"type": "text", "text": "of Italy?\n"}]},
     {"role": "assistant", "content": [{"type": "text", "text": "Rome."}]},
     {"role": "user", "content": [{"type": "text", "text": "And of France?"}]}],
], ids=["system", "multi-turn", "no system", "text parts"])
def test_gemma3_folds_the_system_into_the_first_user_turn(gemma3, messages):
    text = _assert_renders_as_hf(gemma3, messages)
    assert text.startswith("<bos><start_of_turn>user\n") and text.endswith("<start_of_turn>model\n")
    if messages[0]["role"] == "system":
        assert "<start_of_turn>user\nYou answer in one word.\n\n" in text


def test_gemma3_refuses_turns_out_of_order(gemma3):
    with pytest.raises(ValueError, match="roles must alternate"):
        gemma3[0].apply_chat_template([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


GENERATION_BLOCK = ("{% for m in messages %}<|{{ m.role }}|>{% if m.role == 'assistant' %}{% generation %}"
                    "{{ m.content }}<|end|>{% endgeneration %}{% else %}{{ m.content }}<|end|>{% endif %}{% endfor %}"
                    "{% if add_generation_prompt %}<|assistant|>{% endif %}")
TOOLS_IS_NONE = ("{% if tools is not none %}[TOOLS]{{ tools | tojson }}{% endif %}"
                 "{% if documents is none %}[NO DOCUMENTS]{% endif %}"
                 "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}")


@pytest.mark.parametrize("template", [GENERATION_BLOCK, TOOLS_IS_NONE], ids=["generation block", "tools is none"])
def test_hfs_template_environment(template):
    """HF's {% generation %} block (training templates carry it) and `tools`/`documents` None when not given."""
    pair = _pair(template, {"eos": "<|end|>"})
    _assert_renders_as_hf(pair, MULTI_TURN)
    _assert_renders_as_hf(pair, MULTI_TURN, tools=TOOLS)
