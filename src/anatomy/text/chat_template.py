"""Chat templates: the model's own Jinja template, rendered the way HF transformers renders it.

A chat template is untrusted code shipped with a checkpoint, so it runs in jinja2's immutable
sandbox. The environment matches HF's `apply_chat_template`: `trim_blocks` and `lstrip_blocks`
on, the `loopcontrols` extension, `{% generation %}` blocks, a `tojson` filter that does not
HTML-escape, and the globals `raise_exception(message)` and `strftime_now(format)`. The template
sees `messages` (as HF passes them: None values dropped, reasoning also as `thinking`),
`add_generation_prompt`, `tools` and `documents` (None unless given) and the special-token strings.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from anatomy.errors import CheckpointError, InputError

# the names a message's reasoning may come under; the template gets it as the first two (HF's aliases)
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplate:
    """A compiled chat template. `source` names where it came from, for error messages."""

    def __init__(self, text: str, *, source: str, special_tokens: Mapping[str, str]) -> None:
        if not isinstance(text, str) or not text:
            raise CheckpointError(f"{source}: the chat template is empty or not a string")
        self.text = text
        self.source = source
        self.special_tokens = dict(special_tokens)
        try:
            self._template = _compile(text)
        except jinja2.TemplateSyntaxError as exc:
            raise CheckpointError(f"{source}: chat template line {exc.lineno}: {exc.message}") from None

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
               **variables: Any) -> str:
        """The prompt string for `messages` (a list of {"role": ..., "content": ...} dicts)."""
        check_messages(messages)
        context = {"tools": None, "documents": None, **self.special_tokens, **variables}
        try:
            return self._template.render(messages=[_as_hf_passes(m) for m in messages],
                                         add_generation_prompt=add_generation_prompt, **context)
        except (jinja2.TemplateError, TypeError) as exc:
            raise InputError(f"chat template ({self.source}) refused the messages: {exc}") from None


def check_messages(messages: Any) -> None:
    """Messages must be a non-empty list of mappings, each with a string `role` and a `content`."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise InputError(f"chat messages must be a non-empty list of {{'role', 'content'}} dicts, got {messages!r:.80}")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InputError(f"chat message {i} must be a dict with 'role' and 'content', got {message!r:.80}")
        missing = [key for key in ("role", "content") if key not in message]
        if missing:
            raise InputError(f"chat message {i} has no {' or '.join(repr(k) for k in missing)}: {dict(message)!r:.80}")
        if not isinstance(message["role"], str):
            raise InputError(f"chat message {i}: 'role' must be a string, got {message['role']!r:.80}")


def _as_hf_passes(message: Mapping[str, Any]) -> dict[str, Any]:
    """The message as HF's apply_chat_template hands it over: keys whose value is None dropped (a
    tool call's `content: None`), and its reasoning under both `reasoning_content` and `thinking`
    (gpt-oss's template reads the latter)."""
    out = {key: value for key, value in message.items() if value is not None}
    reasoning = next((out[key] for key in REASONING_FIELDS if key in out), None)
    if reasoning is not None:
        out = {"thinking": reasoning, **out, "reasoning_content": reasoning}
    return out


class _GenerationBlock(jinja2.ext.Extension):
    """HF's `{% generation %}...{% endgeneration %}`: marks the assistant's text for training masks;
    a prompt renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


@lru_cache(maxsize=16)
def _compile(text: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols, _GenerationBlock])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(text)


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """JSON without jinja's HTML escaping, as chat templates expect."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)
