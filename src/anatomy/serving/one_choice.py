"""One choice's events as the single-choice APIs (Responses, Messages) read them: its text, tokens,
finish reason and stop string gathered, the text read for its thinking block (reasoning.py, on a
server with --reasoning-parser) and for tool calls (tools.py), whole or as it arrives."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from anatomy.serving.protocol import ChatRequest, RequestError
from anatomy.serving.reasoning import ThinkSplitter, read, split
from anatomy.serving.sequence import Event
from anatomy.serving.tools import Call, ToolStream, parse_output, read_pieces


class OneChoice:
    """What a render of one choice of `chat` has read so far."""

    def __init__(self, chat: ChatRequest) -> None:
        self.mode = chat.tool_choice_name if chat.tools else "none"
        self.names = {t.function.name for t in chat.tools or []}
        self.text: list[str] = []
        self.tokens = 0
        self.finish: str | None = None
        self.stop: str | None = None  # the stop string that ended it
        self.opened: bool | None = None  # whether the prompt opened a thinking block; None: not read
        self.reasoning: str | None = None  # the whole answer's thinking block (None: it does not think)
        self.reasoning_tokens = 0

    def read_thinking(self, *, opened: bool) -> None:
        """Read the answer's thinking block out of its text (`opened`: the prompt opened it)."""
        self.opened = opened

    def account(self, event: Event) -> None:
        if event.error is not None:
            raise RequestError(event.error, status=500, type="server_error")
        self.tokens += event.token is not None
        self.reasoning_tokens += event.reasoning
        self.text.append(event.text)
        self.finish = event.finish_reason or self.finish
        self.stop = event.stop_string or self.stop

    async def answer(self, events: AsyncIterator[tuple[int, Event]]) -> tuple[str | None, list[Call]]:
        """The whole answer: its content (None when there are only calls) and its tool calls."""
        async for _, event in events:
            self.account(event)
        text = "".join(self.text)
        if self.opened is not None:
            self.reasoning, text = split(text, opened=self.opened)
        return parse_output(text, self.mode, self.names) if self.mode != "none" else (text, [])

    async def pieces(self, events: AsyncIterator[tuple[int, Event]]) -> AsyncIterator[tuple[str, Any]]:
        """The answer as it arrives: ("reasoning", text) pieces first if it thinks, then ToolStream's
        pieces (only "content" when there are no tools)."""
        tools = ToolStream(self.mode, self.names) if self.mode != "none" else None
        thinking = ThinkSplitter(opened=self.opened) if self.opened is not None else None
        async for _, event in events:
            self.account(event)
            last, text = event.finish_reason is not None, event.text
            if thinking is not None:
                reasoning, text = read(thinking, text, last=last)
                if reasoning:
                    yield "reasoning", reasoning
            for piece in read_pieces(tools, text, last=last):
                yield piece
