"""OpenAI response bodies from the serving loop's events: whole (collect) or as SSE chunks (stream).

A stream's deltas join to what the same request gets unstreamed (content, tool calls read by
tools.ToolStream, reasoning_content); it ends with `data: [DONE]`, after an error event when the
request fails. Details: docs/serving.md, "The API" (streaming), "Tool calling", "Reasoning" and
"Scoring: echo and prompt logprobs".
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import torch

from anatomy.serving.protocol import ChatRequest, CompletionRequest, RequestError
from anatomy.serving.reasoning import ThinkSplitter, read, split
from anatomy.serving.sequence import Event, TokenLogprob
from anatomy.serving.tools import Call, ToolStream, parse_output, read_pieces


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


class _Render:
    """The choices of one request as their events arrive."""

    prefix = ""
    obj = ""
    chunk_obj = ""

    def __init__(self, req: ChatRequest | CompletionRequest, tokenizer: Any, *, usage_prompt: int,
                 choices: int) -> None:
        self.req, self.tokenizer = req, tokenizer
        self.id = f"{self.prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.prompt_tokens = usage_prompt
        self.texts: list[list[str]] = [[] for _ in range(choices)]
        self.tokens = [0] * choices
        self.finish: list[str | None] = [None] * choices
        self.logprobs: list[list[tuple[int, TokenLogprob]]] = [[] for _ in range(choices)]
        self.prompt_logprobs: list[list[TokenLogprob | None] | None] = [None] * choices
        self.reasoning_tokens = 0
        self.splitters: list[ThinkSplitter] | None = None  # per choice, once read_thinking is called

    def usage(self) -> dict[str, Any]:
        completion = sum(self.tokens)
        usage = {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion,
                 "total_tokens": self.prompt_tokens + completion}
        if self.splitters is not None:
            usage["completion_tokens_details"] = {"reasoning_tokens": self.reasoning_tokens}
        return usage

    def _account(self, index: int, event: Event) -> None:
        if event.error is not None:
            raise RequestError(event.error, status=500, type="server_error")
        if event.prompt_logprobs is not None:
            self.prompt_logprobs[index] = event.prompt_logprobs
        if event.token is not None:
            self.tokens[index] += 1
        self.reasoning_tokens += event.reasoning
        if event.logprob is not None:
            self.logprobs[index].append((event.token, event.logprob))
        self.texts[index].append(event.text)
        self.finish[index] = event.finish_reason

    async def collect(self, events: AsyncIterator[tuple[int, Event]]) -> dict[str, Any]:
        async for index, event in events:
            self._account(index, event)
        return {"id": self.id, "object": self.obj, "created": self.created, "model": self.req.model,
                "choices": [self._choice(i) for i in range(len(self.texts))], "usage": self.usage()}

    async def stream(self, events: AsyncIterator[tuple[int, Event]]) -> AsyncIterator[bytes]:
        for i in range(len(self.texts)):
            opening = self._opening(i)
            if opening is not None:
                yield self._chunk([opening])
        try:
            async for index, event in events:
                pending = len(self.logprobs[index])
                self._account(index, event)
                for choice in self._deltas(index, event, self.logprobs[index][pending:]):
                    yield self._chunk([choice])
        except RequestError as exc:
            yield sse({"error": {"message": exc.message, "type": exc.type, "param": None, "code": exc.code}})
            yield DONE
            return
        if self.req.include_usage:
            yield self._chunk([], usage=self.usage())
        yield DONE

    def _chunk(self, choices: list[dict], usage: dict | None = None) -> bytes:
        body = {"id": self.id, "object": self.chunk_obj, "created": self.created, "model": self.req.model,
                "choices": choices}
        if self.req.include_usage:
            body["usage"] = usage if usage is not None or not self.req.continuous_usage else self.usage()
        return sse(body)

    def _deltas(self, index: int, event: Event, fresh: list) -> list[dict]:
        return self._text_deltas(index, event.text, fresh, event.finish_reason)

    def _text_deltas(self, index: int, text: str, fresh: list, finish: str | None) -> list[dict]:
        """The streamed choices of one event's text: the text (and logprobs), then its finish_reason."""
        out = [self._delta(index, text, fresh, None)] if text or fresh else []
        if finish is not None:
            out.append(self._delta(index, "", [], finish))
        return out

    def _token_text(self, token: int) -> str:
        return self.tokenizer.decode([token])

    def _opening(self, index: int) -> dict | None:
        return None

    def _choice(self, index: int) -> dict: ...

    def _delta(self, index: int, text: str, logprobs: list, finish: str | None) -> dict: ...


class ChatRender(_Render):
    prefix, obj, chunk_obj = "chatcmpl", "chat.completion", "chat.completion.chunk"

    def __init__(self, req: ChatRequest, tokenizer: Any, *, usage_prompt: int, choices: int) -> None:
        super().__init__(req, tokenizer, usage_prompt=usage_prompt, choices=choices)
        mode = req.tool_choice_name if req.tools else "none"
        self.tool_mode, self.tool_names = mode, {t.function.name for t in req.tools or []}
        self.tool_streams = [ToolStream(mode, self.tool_names) for _ in range(choices)] if mode != "none" else None
        self.calls = [0] * choices
        self.opened = False

    def read_thinking(self, *, opened: bool) -> None:
        """Read each choice's thinking block out of its text (`opened`: the prompt opened it)."""
        self.opened = opened
        self.splitters = [ThinkSplitter(opened=opened) for _ in self.texts]

    def _choice(self, index: int) -> dict:
        text, finish = "".join(self.texts[index]), self.finish[index]
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if self.splitters is not None:
            message["reasoning_content"], text = split(text, opened=self.opened)
            message["content"] = text
        if self.tool_streams is not None:
            message["content"], calls = parse_output(text, self.tool_mode, self.tool_names)
            if calls:
                message["tool_calls"] = [c.openai() for c in calls]
                finish = "tool_calls" if finish == "stop" else finish
        return {"index": index, "message": message,
                "logprobs": self._logprobs(self.logprobs[index]) if self.req.logprobs else None,
                "finish_reason": finish}

    def _opening(self, index: int) -> dict:
        return {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                "finish_reason": None}

    def _delta(self, index: int, text: str, logprobs: list, finish: str | None) -> dict:
        return {"index": index, "delta": {"content": text} if text or logprobs else {},
                "logprobs": self._logprobs(logprobs) if logprobs else None, "finish_reason": finish}

    def _deltas(self, index: int, event: Event, fresh: list) -> list[dict]:
        """Its thinking block's text first (with the event's logprobs), then the rest as content."""
        if self.splitters is None:
            return super()._deltas(index, event, fresh)
        reasoning, text = read(self.splitters[index], event.text, last=event.finish_reason is not None)
        out = []
        if reasoning:
            out.append({"index": index, "delta": {"reasoning_content": reasoning},
                        "logprobs": self._logprobs(fresh) if fresh else None, "finish_reason": None})
            fresh = []
        return out + self._text_deltas(index, text, fresh, event.finish_reason)

    def _text_deltas(self, index: int, text: str, fresh: list, finish: str | None) -> list[dict]:
        if self.tool_streams is None:
            return super()._text_deltas(index, text, fresh, finish)
        pieces = read_pieces(self.tool_streams[index], text, last=finish is not None)
        out = []
        for kind, value in pieces:
            if kind == "content":
                out.append(self._delta(index, value, fresh, None))
                fresh = []
            elif kind == "arguments":
                out.append(self._tool_delta(index, {"index": self.calls[index] - 1, "function": {"arguments": value}}))
            else:
                out += self._call_deltas(index, value, with_arguments=kind == "call")
        if fresh:
            out.append(self._delta(index, "", fresh, None))
        if finish is not None:
            finish = "tool_calls" if self.calls[index] and finish == "stop" else finish
            out.append(self._delta(index, "", [], finish))
        return out

    def _call_deltas(self, index: int, call: Call, *, with_arguments: bool) -> list[dict]:
        k = self.calls[index]
        self.calls[index] += 1
        out = [self._tool_delta(index, {"index": k, "id": call.id, "type": "function",
                                        "function": {"name": call.name, "arguments": ""}})]
        if with_arguments:
            out.append(self._tool_delta(index, {"index": k, "function": {"arguments": call.arguments}}))
        return out

    def _tool_delta(self, index: int, call: dict) -> dict:
        return {"index": index, "delta": {"tool_calls": [call]}, "logprobs": None, "finish_reason": None}

    def _logprobs(self, entries: list[tuple[int, TokenLogprob]]) -> dict:
        return {"content": [dict(self._entry(token, lp.logprob),
                                 top_logprobs=[self._entry(t, v) for t, v in zip(lp.top_ids, lp.top_logprobs)])
                            for token, lp in entries]}

    def _entry(self, token: int, logprob: float) -> dict:
        text = self._token_text(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


class CompletionRender(_Render):
    prefix, obj, chunk_obj = "cmpl", "text_completion", "text_completion"

    def __init__(self, req: CompletionRequest, tokenizer: Any, *, usage_prompt: int, choices: int,
                 prompts: list[tuple[str, list[int]]] | None = None) -> None:
        super().__init__(req, tokenizer, usage_prompt=usage_prompt, choices=choices)
        self.prompts = prompts or []  # echo: each prompt's (text, ids)

    def _choice(self, index: int) -> dict:
        text = "".join(self.texts[index])
        logprobs = None
        if self.req.logprobs is not None:
            logprobs = self._logprobs(self.logprobs[index], 0)
        if self.req.echo:
            prompt_text, ids = self.prompts[index // self.req.n]
            text = prompt_text + text
            if logprobs is not None:
                logprobs = self._echoed(ids, self.prompt_logprobs[index] or [None] * len(ids), logprobs)
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": self.finish[index]}

    def _delta(self, index: int, text: str, logprobs: list, finish: str | None) -> dict:
        offset = sum(len(t) for t in self.texts[index]) - len(text)
        return {"index": index, "text": text,
                "logprobs": self._logprobs(logprobs, offset) if logprobs else None, "finish_reason": finish}

    def _logprobs(self, entries: list[tuple[int, TokenLogprob]], offset: int) -> dict:
        tokens = [self._token_text(token) for token, _ in entries]
        return {"tokens": tokens, "token_logprobs": [lp.logprob for _, lp in entries],
                "top_logprobs": [self._top(lp) for _, lp in entries], "text_offset": _offsets(tokens, offset)}

    def _echoed(self, ids: list[int], entries: list[TokenLogprob | None], generated: dict) -> dict:
        """The prompt's tokens before the generated ones: the first token's logprob and top are null."""
        tokens = [self._token_text(t) for t in ids]
        out = {"tokens": tokens + generated["tokens"],
               "token_logprobs": [e.logprob if e else None for e in entries] + generated["token_logprobs"],
               "top_logprobs": [self._top(e) if e else None for e in entries] + generated["top_logprobs"]}
        out["text_offset"] = _offsets(out["tokens"], 0)
        return out

    def _top(self, lp: TokenLogprob) -> dict[str, float]:
        k = self.req.logprobs or 0
        return {self._token_text(t): v for t, v in zip(lp.top_ids[:k], lp.top_logprobs[:k])}


def _offsets(tokens: list[str], offset: int) -> list[int]:
    offsets = []
    for text in tokens:
        offsets.append(offset)
        offset += len(text)
    return offsets


def embeddings(vectors: torch.Tensor, model: str, encoding_format: str, tokens: int) -> dict[str, Any]:
    """vectors [N, D] float -> OpenAI's embedding list (floats, or base64 of little-endian float32)."""
    vectors = vectors.float().contiguous()
    data = []
    for i, row in enumerate(vectors):
        value = (base64.b64encode(row.numpy().astype("<f4").tobytes()).decode() if encoding_format == "base64"
                 else row.tolist())
        data.append({"object": "embedding", "index": i, "embedding": value})
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def tokenizer_info(tokenizer: Any, context: int) -> dict[str, Any]:
    """GET /tokenizer_info as vLLM answers it: the special tokens, the chat template, the lengths."""
    special = {f"{role}_token": tokenizer.special_tokens.get(role) for role in ("bos", "eos", "pad", "unk")}
    return {"tokenizer_class": type(tokenizer).__name__, **special,
            "eos_token_id": tokenizer.eos_id, "bos_token_id": tokenizer.bos_id,
            "chat_template": tokenizer.chat_template.text if tokenizer.chat_template else None,
            "model_max_length": context, "vocab_size": tokenizer.vocab_size}


def model_entry(name: str, created: int, context: int | None) -> dict[str, Any]:
    entry = {"id": name, "object": "model", "created": created, "owned_by": "anatomy"}
    if context is not None:
        entry["max_model_len"] = context
    return entry
