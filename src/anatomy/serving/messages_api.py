"""`POST /v1/messages` and `/v1/messages/count_tokens`: Anthropic's Messages API (what the anthropic SDK
and Claude Code send), answered by the same loop as chat: the request becomes a chat request
(messages_protocol.py), the events a `message` or Anthropic's stream of events (message_start,
content_block_* per block, message_delta, message_stop), errors Anthropic's JSON. The fields, stop
reasons and thinking blocks: docs/serving.md, "Anthropic's Messages API".
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import JSONResponse

from anatomy.serving.generation import chat_inputs, generate
from anatomy.serving.messages_protocol import CountRequest, MessagesRequest
from anatomy.serving.one_choice import OneChoice
from anatomy.serving.protocol import ChatRequest, RequestError
from anatomy.serving.sequence import Event
from anatomy.serving.tools import Call

PATH = "/v1/messages"
EMPTY_TEXT = {"type": "text", "text": ""}  # a text block as it starts
EMPTY_THINKING = {"type": "thinking", "thinking": "", "signature": ""}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


async def handle(state: Any, request: Any, body: bytes) -> Any:
    """The response to a POST /v1/messages of `body`. max_tokens past what the context leaves is cut to
    it (the answer then ends with model_context_window_exceeded), as Anthropic's API does."""
    req = state.parse(MessagesRequest, request, body)
    state.check_model(req.model)
    if req.thinking is not None and req.thinking.type == "enabled" and state.reasoning_parser is None:
        raise RequestError("thinking needs a server started with --reasoning-parser (which reads the model's "
                           "thinking block)", param="thinking")
    loop = state.serving()
    chat = req.chat()
    ids, spec = chat_inputs(state.tokenizer, chat, req.prefill)
    chat = chat.model_copy(update={"max_tokens": max(1, min(req.max_tokens, loop.context - len(ids)))})
    render = MessageRender(req, chat, prompt_tokens=len(ids))
    return await generate(state, request, chat, [ids], chat=True, spec=spec, render=render)


async def count_tokens(state: Any, request: Any, body: bytes) -> JSONResponse:
    """{"input_tokens"} of the prompt the same request to /v1/messages would have."""
    req = state.parse(CountRequest, request, body)
    state.check_model(req.model)
    state.serving()
    ids, _ = chat_inputs(state.tokenizer, req.chat(), req.prefill)
    return JSONResponse({"input_tokens": len(ids)})


def error_json(status: int, message: str) -> JSONResponse:
    """An error as Anthropic's API answers it."""
    return JSONResponse({"type": "error", "error": {"type": error_type(status), "message": message}},
                        status_code=status)


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def event(kind: str, **fields: Any) -> bytes:
    """One server-sent event: its type on the `event:` line and in the data."""
    data = json.dumps({"type": kind, **fields}, separators=(",", ":"), ensure_ascii=False)
    return f"event: {kind}\ndata: {data}\n\n".encode()


class MessageRender(OneChoice):
    """One choice's events -> a `message`, or its stream of events."""

    def __init__(self, req: MessagesRequest, chat: ChatRequest, *, prompt_tokens: int) -> None:
        super().__init__(chat)
        self.model, self.asked = req.model, req.max_tokens
        self.id = f"msg_{uuid.uuid4().hex}"
        self.prompt_tokens = prompt_tokens
        self.calls = 0  # tool_use blocks
        self.blocks, self.open = 0, None  # streamed: blocks started, the type of the open one

    def _stop_reason(self) -> str:
        if self.finish == "length":
            return "max_tokens" if self.tokens >= self.asked else "model_context_window_exceeded"
        if self.calls:
            return "tool_use"
        return "stop_sequence" if self.stop is not None else "end_turn"

    def _stop_sequence(self, reason: str | None) -> str | None:
        return self.stop if reason == "stop_sequence" else None

    def _message(self, content: list[dict], stop_reason: str | None) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": stop_reason, "stop_sequence": self._stop_sequence(stop_reason),
                "usage": {"input_tokens": self.prompt_tokens, "output_tokens": self.tokens}}

    # -- whole -------------------------------------------------------------------------------------

    async def collect(self, events: AsyncIterator[tuple[int, Event]]) -> dict[str, Any]:
        content, calls = await self.answer(events)
        self.calls = len(calls)
        blocks = [dict(EMPTY_THINKING, thinking=self.reasoning)] if self.reasoning else []
        blocks += [{"type": "text", "text": content}] if content else []
        return self._message(blocks + [dict(_tool_use(c), input=_input(c.arguments)) for c in calls],
                             self._stop_reason())

    # -- streamed ----------------------------------------------------------------------------------

    async def stream(self, events: AsyncIterator[tuple[int, Event]]) -> AsyncIterator[bytes]:
        yield event("message_start", message=self._message([], None))
        yield event("ping")
        try:
            async for kind, value in self.pieces(events):
                for chunk in self._piece(kind, value):
                    yield chunk
        except RequestError as exc:
            yield event("error", error={"type": error_type(exc.status), "message": exc.message})
            return
        for chunk in self._close():
            yield chunk
        reason = self._stop_reason()
        yield event("message_delta", delta={"stop_reason": reason, "stop_sequence": self._stop_sequence(reason)},
                    usage={"output_tokens": self.tokens})
        yield event("message_stop")

    def _piece(self, kind: str, value: Any) -> list[bytes]:
        """The events of one piece: reasoning, or ToolStream's text, a whole call, a call's start or its
        arguments."""
        if kind == "reasoning":
            return self._open("thinking", EMPTY_THINKING) + [self._delta({"type": "thinking_delta", "thinking": value})]
        if kind == "content":
            return self._open("text") + [self._delta({"type": "text_delta", "text": value})] if value else []
        if kind == "arguments":
            return [self._delta({"type": "input_json_delta", "partial_json": value})] if value else []
        self.calls += 1
        out = self._open("tool_use", _tool_use(value))
        if kind == "call":  # whole: its arguments as the object the unstreamed answer has
            out += self._piece("arguments", json.dumps(_input(value.arguments), ensure_ascii=False)) + self._close()
        return out

    def _open(self, kind: str, block: dict | None = None) -> list[bytes]:
        """Start a block of `kind` (text and thinking go on in an open block of theirs); `block` as
        content_block_start has it."""
        if self.open == kind and kind in ("text", "thinking"):
            return []
        out = self._close()
        self.open = kind
        return out + [event("content_block_start", index=self.blocks, content_block=block or EMPTY_TEXT)]

    def _close(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        self.blocks += 1
        return [event("content_block_stop", index=self.blocks - 1)]

    def _delta(self, delta: dict) -> bytes:
        return event("content_block_delta", index=self.blocks, delta=delta)


def _tool_use(call: Call) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:24]}", "name": call.name, "input": {}}


def _input(arguments: str) -> dict[str, Any]:
    """A call's arguments as an object: {} if they are not one (a call cut short by max_tokens)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
