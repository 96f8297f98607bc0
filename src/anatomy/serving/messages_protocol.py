"""Anthropic's Messages API request bodies (`POST /v1/messages`, `/v1/messages/count_tokens`), validated,
and the chat request each one becomes.

Content blocks (text, tool_use, thinking, tool_result) become chat messages; other block types are
refused by name (400). `thinking` is the thinking budget, custom tools and tool_choice auto / any /
tool / none become chat's auto / required / named / none, output_config.format becomes chat's
response_format (docs/serving.md, "Anthropic's Messages API"). Errors name the field by its
Anthropic path.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from anatomy.serving.protocol import TOOL_NAME, ChatRequest, RequestError, _Body, validated

# Claude Code's attribution system block: a per-request hash that would defeat the prefix cache (vLLM drops it too)
BILLING_HEADER = "x-anthropic-billing-header"
BLOCK_FIELDS = {"text": ("text",), "tool_use": ("id", "name", "input"), "tool_result": ("tool_use_id",),
                "thinking": ("thinking",), "redacted_thinking": ("data",)}
ROLE_BLOCKS = {"user": ("text", "tool_result"), "assistant": ("text", "tool_use", "thinking", "redacted_thinking")}


def _as_blocks(value: Any) -> Any:
    """A string is one text block."""
    if isinstance(value, str):
        return [{"type": "text", "text": value}]
    if not isinstance(value, list):
        raise ValueError("must be a string or a list of content blocks")
    return value


class Block(_Body):
    """A content block of any type; `check_blocks` refuses the types and the missing fields."""

    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None
    content: Annotated[list[Block], BeforeValidator(_as_blocks)] | None = None
    is_error: bool = False
    thinking: str | None = None
    signature: str | None = None  # accepted, not checked: nothing is signed here
    data: str | None = None  # a redacted_thinking block's


Blocks = Annotated[list[Block], BeforeValidator(_as_blocks)]


class InputMessage(_Body):
    role: Literal["user", "assistant"]
    content: Blocks


class CustomTool(_Body):
    type: Literal["custom"] | None = None
    name: str
    input_schema: dict[str, Any]
    description: str | None = None


class ToolChoice(_Body):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class OutputFormat(_Body):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class ThinkingConfig(_Body):
    type: Literal["enabled", "disabled"]
    budget_tokens: int | None = Field(default=None, ge=1)


class OutputConfig(_Body):
    format: OutputFormat | None = None
    effort: str | None = None  # accepted, not used


class CountRequest(_Body):
    """A count_tokens body: the prompt's fields."""

    model: str
    messages: list[InputMessage]
    system: Blocks | None = None
    tools: list[CustomTool] | None = None
    tool_choice: ToolChoice | None = None

    def check(self) -> None:
        if not self.messages:
            raise RequestError("messages must hold at least one message", param="messages")
        check_blocks(self.system or [], "system", ("text",))
        for i, m in enumerate(self.messages):
            check_blocks(m.content, f"messages.{i}.content", ROLE_BLOCKS[m.role])
        self._check_tools()

    def _check_tools(self) -> None:
        names = [t.name for t in self.tools or []]
        for i, name in enumerate(names):
            if not TOOL_NAME.fullmatch(name) or name in names[:i]:
                raise RequestError(f"tools.{i}.name {name!r} must be 1-64 letters, digits, _ or - and not repeat",
                                   param=f"tools.{i}.name")
        choice = self.tool_choice
        if choice is not None and choice.type in ("any", "tool") and not names:
            raise RequestError(f"tool_choice {choice.type!r} needs tools", param="tool_choice")
        if choice is not None and choice.type == "tool" and choice.name not in names:
            raise RequestError(f"tool_choice.name {choice.name!r} is not one of the tools ({', '.join(names)})",
                               param="tool_choice.name")

    @property
    def prefill(self) -> str:
        """The text of a final assistant message (the answer's start), or ""."""
        last = self.messages[-1]
        if last.role != "assistant" or any(b.type != "text" for b in last.content):
            return ""
        return _text(last.content)

    def chat(self) -> ChatRequest:
        """The same request as a chat request (validated as one); a prefill is left out of its messages."""
        body = {"model": self.model, "messages": self._messages(), **self._sampling()}
        if self.tools:
            body["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                               "parameters": t.input_schema}} for t in self.tools]
        if self.tool_choice is not None:
            body["tool_choice"] = _tool_choice(self.tool_choice)
            body["parallel_tool_calls"] = not self.tool_choice.disable_parallel_tool_use
        return validated(MessagesChat, body)

    def _sampling(self) -> dict[str, Any]:
        return {}

    def _messages(self) -> list[dict[str, Any]]:
        system = [b for b in self.system or [] if not b.text.startswith(BILLING_HEADER)]
        out = [{"role": "system", "content": _text(system)}] if system else []
        turns = self.messages[:-1] if self.prefill else self.messages
        for m in turns:
            out += [_assistant(m.content)] if m.role == "assistant" else _user(m.content)
        return out


class MessagesRequest(CountRequest):
    """A /v1/messages body: the prompt's fields, then the generation's."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float = Field(default=1.0, ge=0.0, le=1.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    stream: bool = False
    output_config: OutputConfig | None = None
    thinking: ThinkingConfig | None = None
    metadata: dict[str, Any] | None = None  # accepted, not used

    def check(self) -> None:
        super().check()
        if any(not s for s in self.stop_sequences or []):
            raise RequestError("stop_sequences must not hold an empty string", param="stop_sequences")
        budget = self.thinking.budget_tokens if self.thinking is not None else None
        if self.thinking is not None and self.thinking.type == "enabled":
            if budget is None:
                raise RequestError("thinking.budget_tokens is required when thinking is enabled",
                                   param="thinking.budget_tokens")
            if budget >= self.max_tokens:
                raise RequestError(f"thinking.budget_tokens ({budget}) must be less than max_tokens "
                                   f"({self.max_tokens})", param="thinking.budget_tokens")

    def _sampling(self) -> dict[str, Any]:
        fields = {"max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
                  "top_k": self.top_k, "stop": self.stop_sequences, "stream": self.stream}
        if self.thinking is not None:
            enabled = self.thinking.type == "enabled"
            fields["chat_template_kwargs"] = {"enable_thinking": enabled}
            if enabled:
                fields["thinking_budget"] = self.thinking.budget_tokens
        fmt = self.output_config.format if self.output_config else None
        if fmt is not None:
            fields["response_format"] = {"type": "json_schema",
                                         "json_schema": {"name": "output", "schema": fmt.schema_}}
        return fields


class MessagesChat(ChatRequest):
    """The chat request a Messages request becomes: its stop sequences are not held to OpenAI's four."""

    def stops(self) -> tuple[str, ...]:
        return tuple(self.stop or ())


def check_blocks(blocks: list[Block], where: str, allowed: tuple[str, ...]) -> None:
    """400 naming the first block of a type not `allowed` here, or without a field its type needs."""
    for i, block in enumerate(blocks):
        at = f"{where}.{i}"
        if block.type not in allowed:
            raise RequestError(f"{at}.type: {block.type!r} blocks are not supported by this server here (only "
                               f"{', '.join(allowed)})", param=f"{at}.type")
        missing = next((f for f in BLOCK_FIELDS[block.type] if getattr(block, f) is None), None)
        if missing is not None:
            raise RequestError(f"{at}.{missing} is required in a {block.type} block", param=f"{at}.{missing}")
        if block.type == "tool_result":
            check_blocks(block.content or [], f"{at}.content", ("text",))


def _text(blocks: list[Block]) -> str:
    return "\n".join(b.text for b in blocks if b.type == "text")


def _user(blocks: list[Block]) -> list[dict[str, Any]]:
    """A user turn's blocks in order: each tool result a tool message, the text between them user messages."""
    out: list[dict[str, Any]] = []
    for block in blocks:
        if block.type == "tool_result":
            result = _text(block.content or [])
            out.append({"role": "tool", "tool_call_id": block.tool_use_id,
                        "content": f"Error: {result}" if block.is_error else result})
        elif out and out[-1]["role"] == "user":
            out[-1]["content"] += "\n" + block.text
        else:
            out.append({"role": "user", "content": block.text})
    return out


def _assistant(blocks: list[Block]) -> dict[str, Any]:
    calls = [{"id": b.id, "type": "function", "function": {"name": b.name, "arguments": b.input}}
             for b in blocks if b.type == "tool_use"]
    reasoning = "\n".join(b.thinking for b in blocks if b.type == "thinking")
    return {"role": "assistant", "content": _text(blocks) or None, **({"tool_calls": calls} if calls else {}),
            **({"reasoning_content": reasoning} if reasoning else {})}


def _tool_choice(choice: ToolChoice) -> str | dict[str, Any]:
    if choice.type == "tool":
        return {"type": "function", "function": {"name": choice.name}}
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type]
