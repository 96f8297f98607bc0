"""`POST /v1/responses`: OpenAI's Responses API (what `client.responses.create` and newer agents send),
answered by the same loop as chat: the request becomes a chat request, the events a `response`.

The answer is {"object": "response", "status", "output": [a reasoning item (with --reasoning-parser),
a message, function_call items], "usage"}, or OpenAI's stream events (response.created ...
response.completed). Nothing is stored (previous_response_id and background are refused).
Details: docs/serving.md, "The Responses API" and "Reasoning".
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal, Union

from pydantic import Field

from anatomy.serving.generation import chat_inputs, generate
from anatomy.serving.one_choice import OneChoice
from anatomy.serving.protocol import ChatRequest, RequestError, TextPart, _Body, validated
from anatomy.serving.responses import DONE, sse
from anatomy.serving.sequence import Event
from anatomy.serving.tools import Call


class InputMessage(_Body):
    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: Union[str, list[TextPart]]


class FunctionCallItem(_Body):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None


class FunctionCallOutput(_Body):
    type: Literal["function_call_output"]
    call_id: str
    output: str


class FlatTool(_Body):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunction(_Body):
    type: Literal["function"]
    name: str


class TextFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextOptions(_Body):
    format: TextFormat | None = None


class ResponsesRequest(_Body):
    model: str
    input: Union[str, list[Union[InputMessage, FunctionCallItem, FunctionCallOutput]]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stream: bool = False
    tools: list[FlatTool] | None = None
    tool_choice: Union[Literal["none", "auto", "required"], NamedFunction, None] = None
    parallel_tool_calls: bool = True
    text: TextOptions | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    previous_response_id: str | None = None
    background: bool | None = None
    priority: int = Field(default=0, ge=-(2 ** 63), lt=2 ** 63)  # vLLM's, as in chat completions

    def check(self) -> None:
        if self.previous_response_id is not None:
            raise RequestError("previous_response_id is not supported (nothing is stored): send the whole input",
                               param="previous_response_id")
        if self.background:
            raise RequestError("background responses are not supported by this server", param="background")
        if not self.input:
            raise RequestError("input must not be empty", param="input")

    def chat(self) -> ChatRequest:
        """The same request as a chat completion (validated as one)."""
        body: dict[str, Any] = {"model": self.model, "messages": self._messages(), "temperature": self.temperature,
                                "top_p": self.top_p, "stream": self.stream, "priority": self.priority,
                                "parallel_tool_calls": self.parallel_tool_calls}
        if self.max_output_tokens is not None:
            body["max_tokens"] = self.max_output_tokens
        if self.tools:
            body["tools"] = [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                             for t in self.tools]
        if self.tool_choice is not None:
            body["tool_choice"] = self.tool_choice if isinstance(self.tool_choice, str) else \
                {"type": "function", "function": {"name": self.tool_choice.name}}
        fmt = self.text.format if self.text else None
        if fmt is not None and fmt.type != "text":
            body["response_format"] = {"type": fmt.type} if fmt.type == "json_object" else \
                {"type": "json_schema", "json_schema": {"name": fmt.name or "output", "schema": fmt.schema_}}
        return validated(ChatRequest, body)

    def _messages(self) -> list[dict[str, Any]]:
        messages = [{"role": "system", "content": self.instructions}] if self.instructions else []
        if isinstance(self.input, str):
            return messages + [{"role": "user", "content": self.input}]
        for item in self.input:
            if item.type == "message":
                text = item.content if isinstance(item.content, str) else "".join(p.text for p in item.content)
                messages.append({"role": item.role, "content": text})
            elif item.type == "function_call":
                call = {"id": item.call_id, "type": "function",
                        "function": {"name": item.name, "arguments": item.arguments}}
                if messages and messages[-1]["role"] == "assistant" and messages[-1].get("tool_calls") is not None:
                    messages[-1]["tool_calls"].append(call)
                else:
                    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            else:
                messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
        return messages


async def handle(state: Any, request: Any, body: bytes) -> Any:
    """The response to a POST /v1/responses of `body`."""
    req = state.parse(ResponsesRequest, request, body)
    state.check_model(req.model)
    state.serving()
    chat = req.chat()
    ids, spec = chat_inputs(state.tokenizer, chat)
    render = ResponsesRender(req, chat, prompt_tokens=len(ids))
    return await generate(state, request, chat, [ids], chat=True, spec=spec, render=render)


class ResponsesRender(OneChoice):
    """One choice's events -> a `response` object, or its stream of events."""

    def __init__(self, req: ResponsesRequest, chat: ChatRequest, *, prompt_tokens: int) -> None:
        super().__init__(chat)
        self.req = req
        self.id = f"resp_{uuid.uuid4().hex}"
        self.message_id = f"msg_{uuid.uuid4().hex}"
        self.reasoning_id = f"rs_{uuid.uuid4().hex}"
        self.created = time.time()
        self.prompt_tokens = prompt_tokens
        self.seq = 0

    # -- whole -------------------------------------------------------------------------------------

    async def collect(self, events: AsyncIterator[tuple[int, Event]]) -> dict[str, Any]:
        content, calls = await self.answer(events)
        output = [self._reasoning(self.reasoning)] if self.reasoning else []
        output += [self._message(content)] if content else []
        return self._response("completed", output + [_function_item(c, "completed") for c in calls])

    def _response(self, status: str, output: list[dict]) -> dict[str, Any]:
        incomplete = self.finish == "length" and status == "completed"
        usage = {"input_tokens": self.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
                 "output_tokens": self.tokens, "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
                 "total_tokens": self.prompt_tokens + self.tokens}
        req = self.req
        return {"id": self.id, "object": "response", "created_at": self.created,
                "status": "incomplete" if incomplete else status, "model": req.model, "output": output,
                "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None, "error": None,
                "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
                "temperature": req.temperature, "top_p": req.top_p, "parallel_tool_calls": req.parallel_tool_calls,
                "tool_choice": req.tool_choice or "auto", "tools": [t.model_dump(exclude_none=True, by_alias=True)
                                                                    for t in req.tools or []],
                "text": req.text.model_dump(exclude_none=True, by_alias=True) if req.text else
                {"format": {"type": "text"}},
                "metadata": req.metadata or {}, "store": False, "truncation": "disabled",
                "usage": usage if status != "in_progress" else None}

    def _message(self, text: str, status: str = "completed") -> dict[str, Any]:
        parts = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if text is not None else []
        return {"type": "message", "id": self.message_id, "status": status, "role": "assistant", "content": parts}

    def _reasoning(self, text: str, status: str = "completed") -> dict[str, Any]:
        parts = [{"type": "reasoning_text", "text": text}] if text is not None else []
        return {"type": "reasoning", "id": self.reasoning_id, "summary": [], "content": parts, "status": status}

    # -- streamed ----------------------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> bytes:
        body = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return b"event: " + kind.encode() + b"\n" + sse(body)

    async def stream(self, events: AsyncIterator[tuple[int, Event]]) -> AsyncIterator[bytes]:
        yield self._event("response.created", response=self._response("in_progress", []))
        yield self._event("response.in_progress", response=self._response("in_progress", []))
        self.output: list[dict] = []
        self.open_text: str | None = None  # the message's text so far, while it is open
        self.open_reasoning: str | None = None  # the reasoning item's text so far, while it is open
        try:
            async for kind, value in self.pieces(events):
                for chunk in self._piece(kind, value):
                    yield chunk
        except RequestError as exc:
            yield self._event("error", code=exc.code or exc.type, message=exc.message, param=None)
            yield DONE
            return
        for chunk in self._close_reasoning() + self._close_text() + self._close_call():
            yield chunk
        final = self._response("completed", self.output)
        yield self._event("response.incomplete" if final["status"] == "incomplete" else "response.completed",
                          response=final)

    def _piece(self, kind: str, value: Any) -> list[bytes]:
        if kind == "reasoning":
            return self._reasoning_delta(value)
        if not value:
            return []
        out = self._close_reasoning()  # the thinking block comes before everything else
        return out + self._answer_piece(kind, value)

    def _answer_piece(self, kind: str, value: Any) -> list[bytes]:
        if kind == "content":
            return self._text_delta(value)
        if kind == "arguments":
            index = len(self.output) - 1
            self.output[index]["arguments"] += value
            return [self._event("response.function_call_arguments.delta", item_id=self.output[index]["id"],
                                output_index=index, delta=value)]
        out = self._close_text() + self._close_call()
        item = _function_item(value, "in_progress")
        item["arguments"] = ""
        self.output.append(item)
        out.append(self._event("response.output_item.added", output_index=len(self.output) - 1, item=dict(item)))
        if kind == "call":
            out += self._answer_piece("arguments", value.arguments) + self._close_call()
        return out

    def _reasoning_delta(self, text: str) -> list[bytes]:
        out = []
        if self.open_reasoning is None:
            self.open_reasoning = ""
            out += self._open_part(self.reasoning_id, self._reasoning(None, "in_progress"),
                                   {"type": "reasoning_text", "text": ""})
        self.open_reasoning += text
        out.append(self._event("response.reasoning_text.delta", item_id=self.reasoning_id,
                               output_index=len(self.output) - 1, content_index=0, delta=text))
        return out

    def _close_reasoning(self) -> list[bytes]:
        if self.open_reasoning is None:
            return []
        text, self.open_reasoning = self.open_reasoning, None
        return self._close_part("reasoning_text", self.reasoning_id, self._reasoning(text), text)

    def _text_delta(self, text: str) -> list[bytes]:
        out = []
        if self.open_text is None:
            out += self._close_call()
            self.open_text = ""
            out += self._open_part(self.message_id, self._message(None, "in_progress"),
                                   {"type": "output_text", "text": "", "annotations": []})
        self.open_text += text
        out.append(self._event("response.output_text.delta", item_id=self.message_id, output_index=len(self.output) - 1,
                               content_index=0, delta=text, logprobs=[]))
        return out

    def _close_text(self) -> list[bytes]:
        if self.open_text is None:
            return []
        text, self.open_text = self.open_text, None
        return self._close_part("output_text", self.message_id, self._message(text), text, logprobs=[])

    def _open_part(self, item_id: str, item: dict[str, Any], part: dict[str, Any]) -> list[bytes]:
        """An output item in progress and its one content part, added (the events say so)."""
        self.output.append(item)
        index = len(self.output) - 1
        return [self._event("response.output_item.added", output_index=index, item=item),
                self._event("response.content_part.added", item_id=item_id, output_index=index, content_index=0,
                            part=part)]

    def _close_part(self, kind: str, item_id: str, item: dict[str, Any], text: str, **extra: Any) -> list[bytes]:
        """The open item (the last) finished as `item`: its `kind`.done, content_part.done, output_item.done."""
        index = len(self.output) - 1
        self.output[index] = item
        return [self._event(f"response.{kind}.done", item_id=item_id, output_index=index, content_index=0, text=text,
                            **extra),
                self._event("response.content_part.done", item_id=item_id, output_index=index, content_index=0,
                            part=item["content"][0]),
                self._event("response.output_item.done", output_index=index, item=item)]

    def _close_call(self) -> list[bytes]:
        if not self.output or self.output[-1]["type"] != "function_call" or self.output[-1]["status"] == "completed":
            return []
        index, item = len(self.output) - 1, self.output[-1]
        item["status"] = "completed"
        return [self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                            arguments=item["arguments"]),
                self._event("response.output_item.done", output_index=index, item=dict(item))]


def _function_item(call: Call, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call.id, "name": call.name,
            "arguments": call.arguments, "status": status}
