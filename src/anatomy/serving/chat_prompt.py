"""A chat request's prompt: its messages (and tools) through the model's chat template, to token ids.

A template that renders `tools` itself (Qwen2.5/3, Llama 3.1+, Mistral, Hermes; found by rendering a
probe conversation with a tool) gets them as HF transformers passes them. A template without tool
support (SmolLM2's, Gemma's, Phi-3's) gets vLLM's and llama-server's generic handling: the tools and
the Hermes calling convention in the system message, earlier calls and results written back as
<tool_call> and <tool_response> blocks (docs/serving.md, "Tool calling").
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from anatomy.text.chat_template import REASONING_FIELDS

TOOL_SYSTEM_PROMPT = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""

_PROBE_TOOL = {"type": "function", "function": {"name": "probe_tool_support", "description": "",
                                                "parameters": {"type": "object", "properties": {}}}}


def chat_ids(tokenizer: Any, messages: list, *, tools: list | None = None, add_generation_prompt: bool = True,
             variables: dict[str, Any] | None = None) -> list[int]:
    """Token ids of the conversation (the template's special tokens are in its text: none added)."""
    text = chat_text(tokenizer, messages, tools=tools, add_generation_prompt=add_generation_prompt,
                     variables=variables)
    return tokenizer.encode(text, add_special_tokens=False)


def chat_text(tokenizer: Any, messages: list, *, tools: list | None = None, add_generation_prompt: bool = True,
              variables: dict[str, Any] | None = None) -> str:
    """The prompt text of the conversation: its messages (and tools) through the chat template, with
    `variables` (the request's chat_template_kwargs) passed to the template."""
    variables = dict(variables or {})
    tool_dicts = [t.model_dump(exclude_none=True) for t in tools] if tools else None
    has_calls = any(m.role == "tool" or m.tool_calls for m in messages)
    if (tool_dicts or has_calls) and not renders_tools(tokenizer):
        rendered = with_tool_prompt(messages, tool_dicts)
    else:
        rendered = [_native(m) for m in messages]
        if tool_dicts:
            variables["tools"] = tool_dicts
    return tokenizer.apply_chat_template(rendered, add_generation_prompt=add_generation_prompt, **variables)


def renders_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template writes a `tools` list into the prompt."""
    return tokenizer.chat_template is not None and _renders_tools(tokenizer.chat_template)


@lru_cache(maxsize=8)
def _renders_tools(template: Any) -> bool:
    probe = [{"role": "user", "content": "hello"}]
    try:
        with_tools = template.render(probe, add_generation_prompt=True, tools=[_PROBE_TOOL])
    except Exception:  # a template that refuses tools does not render them
        return False
    return "probe_tool_support" in with_tools


def _native(message: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": message.text()}
    if message.name:
        out["name"] = message.name
    if message.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)}}
                             for c in message.tool_calls]
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    for key in REASONING_FIELDS:  # an assistant turn's reasoning, sent back as vLLM takes it
        if isinstance((message.model_extra or {}).get(key), str):
            out[key] = message.model_extra[key]
    return out


def _arguments(arguments: str | dict) -> Any:
    if isinstance(arguments, dict):
        return arguments
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments  # not JSON: the template gets the text as it is


def with_tool_prompt(messages: list, tools: list[dict] | None) -> list[dict[str, Any]]:
    """Plain messages for a template without tools: the tool prompt in the system message (when tools
    are offered), calls as <tool_call> blocks, consecutive tool results as one user turn of
    <tool_response> blocks."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool":
            block = f"<tool_response>\n{m.text()}\n</tool_response>"
            if out and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_results": True})
            continue
        text = m.text()
        for c in m.tool_calls or []:
            call = {"name": c.function.name, "arguments": _arguments(c.function.arguments)}
            text += ("\n" if text else "") + f"<tool_call>\n{json.dumps(call, ensure_ascii=False)}\n</tool_call>"
        out.append({"role": m.role, "content": text})
    for m in out:
        m.pop("_tool_results", None)
    if not tools:
        return out
    prompt = TOOL_SYSTEM_PROMPT.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
    if out[0]["role"] in ("system", "developer"):
        out[0]["content"] = (out[0]["content"] + "\n\n" if out[0]["content"] else "") + prompt
    else:
        out.insert(0, {"role": "system", "content": prompt})
    return out
