"""Tool calls: the model's text -> OpenAI `tool_calls`, whole or as streaming deltas, and the grammars
that enforce tool_choice "required" or a named function.

Calls are read back in three formats, whatever the model family: hermes (<tool_call>{...}</tool_call>),
llama3_json ({"name", "parameters"}) and mistral ([TOOL_CALLS] [...]); a JSON answer counts as a call
only if its "name" is one of the request's tools. Details: docs/serving.md, "Tool calling".
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from anatomy.serving.grammar import GrammarSpec

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
MARKERS = (HERMES_OPEN, "[TOOL_CALLS]", "<|python_tag|>")


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class Call:
    """One parsed tool call: the function's name and its arguments as a JSON string."""

    name: str
    arguments: str
    id: str = field(default_factory=call_id)

    def openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def calls_from_json(text: str, names: set[str]) -> list[Call] | None:
    """Calls from JSON text: an object or a list of objects with "name" (one of `names`) and
    "arguments" or "parameters"; several objects may be separated by ";". None if it is not that."""
    text = text.strip()
    try:
        value = json.loads(text)
    except ValueError:
        value = _semicolon_separated(text)
    items = value if isinstance(value, list) else [value]
    if not items or any(not isinstance(v, dict) or v.get("name") not in names for v in items):
        return None
    calls = []
    for v in items:
        args = v.get("arguments", v.get("parameters", {}))
        calls.append(Call(v["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)))
    return calls


def _semicolon_separated(text: str) -> list | None:
    try:
        return [json.loads(part) for part in text.split(";") if part.strip()] or None
    except ValueError:
        return None


class ToolStream:
    """One choice's text as it arrives -> pieces: ("content", text), ("call", Call), and, for a named
    function, ("call_start", Call) then ("arguments", text). `mode` is tool_choice: "auto",
    "required", or the name of the function. Text that may still turn into a call is held back."""

    def __init__(self, mode: str, names: set[str]) -> None:
        self.mode, self.names = mode, names
        self.buffer = ""  # text held back
        self.inside = False  # within <tool_call> ... </tool_call>
        self.whole = False  # the answer is to be read as a whole at the end (JSON, or a marker)
        self.decided = False  # whether the start of the output is a JSON answer or a marker is known
        self.calls = 0

    def push(self, text: str) -> list[tuple[str, Any]]:
        if self.mode not in ("auto", "required"):
            return self._named(text)
        self.buffer += text
        if self.mode == "required" or self.whole:
            return []
        if not self.decided:
            head = self.buffer.lstrip()
            if head and (head[0] in "{[" or head.startswith(MARKERS[1:])):
                self.whole = True
            if self.whole or not head or any(m.startswith(head) for m in MARKERS[1:]):
                return []  # a JSON answer or a marker must start the output: wait until it is known
            self.decided = True
        return self._scan()

    def finish(self) -> list[tuple[str, Any]]:
        """The pieces left at the end of the output."""
        if self.mode not in ("auto", "required"):
            return self._named("")
        text, self.buffer = self.buffer, ""
        if self.mode == "required" or self.whole:
            stripped = text.strip()
            for marker in MARKERS[1:]:
                stripped = stripped.removeprefix(marker)
            calls = calls_from_json(stripped, self.names)
            return self._counted(calls) if calls else [("content", text)] if text else []
        if self.inside:  # an unclosed call at the end: a call if it parses
            calls = calls_from_json(text, self.names)
            return self._counted(calls) if calls else [("content", HERMES_OPEN + text)]
        return [("content", text)] if text else []

    def _scan(self) -> list[tuple[str, Any]]:
        pieces = []
        while True:
            if self.inside:
                end = self.buffer.find(HERMES_CLOSE)
                if end < 0:
                    return pieces
                body, self.buffer, self.inside = self.buffer[:end], self.buffer[end + len(HERMES_CLOSE):], False
                calls = calls_from_json(body, self.names)
                pieces += self._counted(calls) if calls else [("content", HERMES_OPEN + body + HERMES_CLOSE)]
                continue
            start = self.buffer.find(HERMES_OPEN)
            if start >= 0:
                if start:
                    pieces.append(("content", self.buffer[:start]))
                self.buffer, self.inside = self.buffer[start + len(HERMES_OPEN):], True
                continue
            keep = partial_marker(self.buffer, HERMES_OPEN)
            if len(self.buffer) > keep:
                pieces.append(("content", self.buffer[:len(self.buffer) - keep]))
                self.buffer = self.buffer[len(self.buffer) - keep:]
            return pieces

    def _named(self, text: str) -> list[tuple[str, Any]]:
        pieces = []
        if not self.calls:
            self.calls = 1
            pieces.append(("call_start", Call(self.mode, "")))
        if text:
            pieces.append(("arguments", text))
        return pieces

    def _counted(self, calls: list[Call]) -> list[tuple[str, Any]]:
        self.calls += len(calls)
        return [("call", c) for c in calls]


def read_pieces(stream: ToolStream | None, text: str, *, last: bool) -> list[tuple[str, Any]]:
    """The pieces of one event's text: as `stream` reads it (all it holds back, at the `last` event),
    or all content when the request has no tools (`stream` None)."""
    if stream is None:
        return [("content", text)]
    return stream.push(text) + (stream.finish() if last else [])


def partial_marker(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def parse_output(text: str, mode: str, names: set[str]) -> tuple[str | None, list[Call]]:
    """A whole answer -> (content, or None when only calls; the calls), the streaming rules applied once."""
    stream = ToolStream(mode, names)
    pieces = stream.push(text) + stream.finish()
    content = "".join(v for kind, v in pieces if kind == "content")
    calls = [v for kind, v in pieces if kind == "call"]
    starts = [v for kind, v in pieces if kind == "call_start"]
    if starts:
        starts[0].arguments = "".join(v for kind, v in pieces if kind == "arguments")
        calls = starts
    return (content.strip() or None) if calls else content, calls


def choice_grammar(tools: list[Any], mode: str, *, parallel: bool) -> GrammarSpec | None:
    """The grammar that enforces tool_choice `mode` ("required" or a function name), or None (auto, none)."""
    schemas = {t.function.name: t.function.parameters or {"type": "object"} for t in tools}
    if mode in ("auto", "none"):
        return None
    if mode != "required":
        return GrammarSpec("json", schemas[mode], param="tool_choice")
    one_call = {"anyOf": [{"type": "object", "properties": {"name": {"const": name}, "parameters": schema},
                           "required": ["name", "parameters"], "additionalProperties": False}
                          for name, schema in schemas.items()]}
    array = {"type": "array", "items": one_call, "minItems": 1, **({} if parallel else {"maxItems": 1})}
    return GrammarSpec("json", array, param="tools")
