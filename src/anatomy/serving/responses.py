"""OpenAI response bodies from the serving loop's events: whole (collect) or as SSE chunks (stream).

Streamed chat: the first chunk of each choice carries the role, every chunk the same `id`; the
content deltas join to the text the same request gets unstreamed; each choice ends with a chunk
holding its finish_reason; with stream_options.include_usage a last chunk (no choices) carries
the usage; then `data: [DONE]`.
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
from anatomy.serving.sequence import Event, TokenLogprob


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

    def usage(self) -> dict[str, int]:
        completion = sum(self.tokens)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion,
                "total_tokens": self.prompt_tokens + completion}

    def _account(self, index: int, event: Event) -> None:
        if event.error is not None:
            raise RequestError(event.error, status=500, type="server_error")
        if event.token is not None:
            self.tokens[index] += 1
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
                fresh = self.logprobs[index][pending:]
                if event.text or fresh:
                    yield self._chunk([self._delta(index, event.text, fresh, None)])
                if event.finish_reason is not None:
                    yield self._chunk([self._delta(index, "", [], event.finish_reason)])
        except RequestError as exc:
            yield sse({"error": {"message": exc.message, "type": exc.type, "param": None, "code": exc.code}})
            return
        if self.req.include_usage:
            yield self._chunk([], usage=self.usage())
        yield DONE

    def _chunk(self, choices: list[dict], usage: dict | None = None) -> bytes:
        body = {"id": self.id, "object": self.chunk_obj, "created": self.created, "model": self.req.model,
                "choices": choices}
        if self.req.include_usage:
            body["usage"] = usage
        return sse(body)

    def _token_text(self, token: int) -> str:
        return self.tokenizer.decode([token])

    def _opening(self, index: int) -> dict | None:
        return None

    def _choice(self, index: int) -> dict: ...

    def _delta(self, index: int, text: str, logprobs: list, finish: str | None) -> dict: ...


class ChatRender(_Render):
    prefix, obj, chunk_obj = "chatcmpl", "chat.completion", "chat.completion.chunk"

    def _choice(self, index: int) -> dict:
        return {"index": index, "message": {"role": "assistant", "content": "".join(self.texts[index])},
                "logprobs": self._logprobs(self.logprobs[index]) if self.req.logprobs else None,
                "finish_reason": self.finish[index]}

    def _opening(self, index: int) -> dict:
        return {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                "finish_reason": None}

    def _delta(self, index: int, text: str, logprobs: list, finish: str | None) -> dict:
        return {"index": index, "delta": {"content": text} if text or logprobs else {},
                "logprobs": self._logprobs(logprobs) if logprobs else None, "finish_reason": finish}

    def _logprobs(self, entries: list[tuple[int, TokenLogprob]]) -> dict:
        return {"content": [dict(self._entry(token, lp.logprob),
                                 top_logprobs=[self._entry(t, v) for t, v in zip(lp.top_ids, lp.top_logprobs)])
                            for token, lp in entries]}

    def _entry(self, token: int, logprob: float) -> dict:
        text = self._token_text(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


class CompletionRender(_Render):
    prefix, obj, chunk_obj = "cmpl", "text_completion", "text_completion"

    def _choice(self, index: int) -> dict:
        return {"index": index, "text": "".join(self.texts[index]),
                "logprobs": self._logprobs(self.logprobs[index], 0) if self.req.logprobs is not None else None,
                "finish_reason": self.finish[index]}

    def _delta(self, index: int, text: str, logprobs: list, finish: str | None) -> dict:
        offset = sum(len(t) for t in self.texts[index]) - len(text)
        return {"index": index, "text": text,
                "logprobs": self._logprobs(logprobs, offset) if logprobs else None, "finish_reason": finish}

    def _logprobs(self, entries: list[tuple[int, TokenLogprob]], offset: int) -> dict:
        tokens = [self._token_text(token) for token, _ in entries]
        offsets = []
        for text in tokens:
            offsets.append(offset)
            offset += len(text)
        return {"tokens": tokens, "token_logprobs": [lp.logprob for _, lp in entries],
                "top_logprobs": [{self._token_text(t): v for t, v in zip(lp.top_ids, lp.top_logprobs)}
                                 for _, lp in entries],
                "text_offset": offsets}


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


def model_entry(name: str, created: int, context: int | None) -> dict[str, Any]:
    entry = {"id": name, "object": "model", "created": created, "owned_by": "anatomy"}
    if context is not None:
        entry["max_model_len"] = context
    return entry
