"""The OpenAI-compatible HTTP app (Starlette on uvicorn): the edge between clients and the serving loop.

    POST /v1/chat/completions, /v1/completions   generation (SSE when "stream": true)
    POST /v1/embeddings                          sentence embeddings from the encoder model
    GET  /v1/models, /health, /metrics           what is served, readiness (200 / 503 loading), Prometheus
    POST /tokenize, /detokenize                  the served model's tokenizer

Every error is OpenAI's JSON, {"error": {"message", "type", "param", "code"}}: 400 for bad input,
401 for a wrong or missing key (when the server has one; /health and /metrics stay open), 404
for an unknown model or path, 413 for a body over the limit, 503 while loading, 500 for a bug.
A client that goes away (a closed connection) has its sequences cancelled at once: the loop
frees their blocks at the start of its next step.
"""

from __future__ import annotations

import asyncio
import hmac
import sys
import threading
import time
import traceback
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from anatomy.errors import InputError
from anatomy.serving import responses
from anatomy.serving.loop import ServingLoop
from anatomy.serving.protocol import (ChatRequest, CompletionRequest, DetokenizeRequest, EmbeddingRequest,
                                      RequestError, TokenizeRequest, parse)
from anatomy.serving.sequence import Event

MAX_BODY_BYTES = 4 * 1024 * 1024
OPEN_PATHS = ("/health", "/metrics")


@dataclass
class ServerState:
    """What the app serves; the model side is filled in by a loader thread (`ready` when done)."""

    model_name: str
    api_key: str | None = None
    max_body_bytes: int = MAX_BODY_BYTES
    loop: ServingLoop | None = None
    tokenizer: Any = None
    embedding_name: str | None = None
    embedder: Callable[[list[str]], tuple[Any, int]] | None = None  # texts -> (vectors [N, D], tokens)
    ready: threading.Event = field(default_factory=threading.Event)
    load_error: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    embed_lock: threading.Lock = field(default_factory=threading.Lock)

    def serving(self) -> ServingLoop:
        if self.load_error is not None:
            raise RequestError(f"the model failed to load: {self.load_error}", status=503, type="server_error")
        if not self.ready.is_set():
            raise RequestError("the model is still loading; retry shortly", status=503, type="server_error",
                               code="loading")
        return self.loop

    def check_model(self, name: str, *, embedding: bool = False) -> None:
        served = self.embedding_name if embedding else self.model_name
        if name != served:
            what = "embedding model" if embedding else "model"
            choices = ", ".join(repr(n) for n in (self.model_name, self.embedding_name) if n) or "none"
            raise RequestError(f"the {what} {name!r} does not exist here (served: {choices})", param="model",
                               status=404, code="model_not_found")


def create_app(state: ServerState) -> Starlette:
    async def health(request: Request) -> Response:
        if state.load_error is not None:
            return JSONResponse({"status": "error", "message": state.load_error}, status_code=503)
        return JSONResponse({"status": "ok" if state.ready.is_set() else "loading"},
                            status_code=200 if state.ready.is_set() else 503)

    async def models(request: Request) -> Response:
        entries = [responses.model_entry(state.model_name, state.created,
                                          state.loop.context if state.ready.is_set() and state.loop else None)]
        if state.embedding_name:
            entries.append(responses.model_entry(state.embedding_name, state.created, None))
        return JSONResponse({"object": "list", "data": entries})

    async def chat(request: Request) -> Response:
        req = parse(ChatRequest, await read_body(request, state.max_body_bytes))
        state.check_model(req.model)
        state.serving()
        ids = encode_chat(state.tokenizer, req.messages)
        return await generate(state, request, req, [ids], chat=True)

    async def completions(request: Request) -> Response:
        req = parse(CompletionRequest, await read_body(request, state.max_body_bytes))
        state.check_model(req.model)
        state.serving()
        prompts = [encode_text(state.tokenizer, p) for p in req.prompts()]
        return await generate(state, request, req, prompts, chat=False)

    async def embeddings(request: Request) -> Response:
        req = parse(EmbeddingRequest, await read_body(request, state.max_body_bytes))
        if state.embedder is None:
            state.serving()  # 503 while loading
        state.check_model(req.model, embedding=True)
        texts = req.texts()

        def run() -> tuple[Any, int]:
            with state.embed_lock:
                return state.embedder(texts)

        vectors, tokens = await asyncio.to_thread(run)
        return JSONResponse(responses.embeddings(vectors, req.model, req.encoding_format, tokens))

    async def tokenize(request: Request) -> Response:
        req = parse(TokenizeRequest, await read_body(request, state.max_body_bytes))
        if req.model is not None:
            state.check_model(req.model)
        loop = state.serving()
        if req.messages is not None:
            ids = encode_chat(state.tokenizer, req.messages, add_generation_prompt=req.add_generation_prompt)
        else:
            ids = state.tokenizer.encode(req.prompt, add_special_tokens=req.add_special_tokens)
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": loop.context})

    async def detokenize(request: Request) -> Response:
        req = parse(DetokenizeRequest, await read_body(request, state.max_body_bytes))
        if req.model is not None:
            state.check_model(req.model)
        state.serving()
        return JSONResponse({"prompt": state.tokenizer.decode(req.tokens)})

    async def metrics(request: Request) -> Response:
        if not state.ready.is_set() or state.loop is None:
            return PlainTextResponse("", media_type="text/plain; version=0.0.4")
        loop = state.loop
        return PlainTextResponse(loop.metrics.render(lambda: gauges(loop)), media_type="text/plain; version=0.0.4")

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    handlers = {HTTPException: _http_error, RequestError: _request_error, InputError: _request_error,
                Exception: _bug}
    return Starlette(routes=routes, exception_handlers=handlers,
                     middleware=[] if state.api_key is None else [_key_middleware(state.api_key)])


# -- generation ------------------------------------------------------------------------------------

async def generate(state: ServerState, request: Request, req: ChatRequest | CompletionRequest,
                   prompts: list[list[int]], *, chat: bool) -> Response:
    loop = state.serving()
    limits = [token_limit(len(ids), req.token_limit, loop.context, chat=chat) for ids in prompts]
    run = RequestRun(loop, prompts, req, limits)
    render = responses.ChatRender if chat else responses.CompletionRender
    out = render(req, state.tokenizer, usage_prompt=sum(len(p) for p in prompts), choices=len(run.seqs))
    if req.stream:
        return EventStream(out.stream(run.events()), on_disconnect=run.cancel)
    gathered = asyncio.ensure_future(out.collect(run.events()))
    gone = asyncio.ensure_future(_disconnected(request))
    await asyncio.wait({gathered, gone}, return_when=asyncio.FIRST_COMPLETED)
    if not gathered.done():  # the client left: free its sequences now
        run.cancel()
        gathered.cancel()
        return Response(status_code=499)
    gone.cancel()
    return JSONResponse(gathered.result())


def token_limit(prompt: int, asked: int | None, context: int, *, chat: bool) -> int:
    """max_tokens of a prompt of `prompt` tokens: as asked if prompt + it fits the context, else a
    400 saying both numbers; unset: whatever room the context leaves."""
    where = "messages" if chat else "prompt"
    if prompt >= context:
        raise RequestError(f"this model's maximum context length is {context} tokens, and the {where} alone "
                           f"has {prompt} tokens", param="messages" if chat else "prompt",
                           code="context_length_exceeded")
    if asked is None:
        return context - prompt
    if prompt + asked > context:
        raise RequestError(f"this model's maximum context length is {context} tokens; you requested "
                           f"{prompt + asked} tokens ({prompt} in the {where}, {asked} in the completion)",
                           param="max_tokens", code="context_length_exceeded")
    return asked


class RequestRun:
    """The sequences of one HTTP request (n per prompt) and the queue their events arrive on."""

    def __init__(self, loop: ServingLoop, prompts: list[list[int]], req: ChatRequest | CompletionRequest,
                 limits: list[int]) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[tuple[int, Event] | None] = asyncio.Queue()
        aio = asyncio.get_running_loop()
        self.seqs = []
        for p, (ids, limit) in enumerate(zip(prompts, limits)):
            for j in range(req.n):
                index = p * req.n + j
                sink = _sink(aio, self.queue, index)
                self.seqs.append(loop.submit(ids, req.sampling(limit, choice=j), sink, logprobs=req.logprob_count,
                                             speculative_tokens=req.speculative_n_max,
                                             speculative_min=req.speculative_n_min))
        self.cancelled = False

    async def events(self) -> AsyncIterator[tuple[int, Event]]:
        """(choice index, event) until every choice has finished (or the run is cancelled)."""
        open_choices = len(self.seqs)
        while open_choices:
            item = await self.queue.get()
            if item is None:
                return
            if item[1].finish_reason is not None:
                open_choices -= 1
            yield item

    def cancel(self) -> None:
        if self.cancelled:
            return
        self.cancelled = True
        for seq in self.seqs:
            if not seq.finished:
                self.loop.cancel(seq)
        self.queue.put_nowait(None)


def _sink(aio: asyncio.AbstractEventLoop, queue: asyncio.Queue, index: int) -> Callable[[Event], None]:
    def sink(event: Event) -> None:  # called on the serving loop's thread
        aio.call_soon_threadsafe(queue.put_nowait, (index, event))
    return sink


class EventStream(Response):
    """A server-sent-events response that stops, and cancels the generation, as soon as the client
    disconnects (not only when the next write fails)."""

    media_type = "text/event-stream"

    def __init__(self, chunks: AsyncIterator[bytes], *, on_disconnect: Callable[[], None]) -> None:
        self.chunks, self.on_disconnect = chunks, on_disconnect
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def __call__(self, scope, receive, send) -> None:
        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            self.on_disconnect()

        watcher = asyncio.ensure_future(watch())
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for chunk in self.chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # the client went away mid-write
            self.on_disconnect()
        finally:
            watcher.cancel()
            await self.chunks.aclose()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


# -- the edges -------------------------------------------------------------------------------------

async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 past `limit` bytes (by its Content-Length, or as it arrives)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise RequestError(f"Content-Length {declared!r} is not a number")
        if int(declared) > limit:
            raise _too_large(int(declared), limit)
    body, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(size, limit)
        body.append(chunk)
    return b"".join(body)


def _too_large(size: int, limit: int) -> RequestError:
    return RequestError(f"the request body has {size:,} bytes or more, the limit is {limit:,}", status=413,
                        code="request_too_large")


def encode_chat(tokenizer: Any, messages: list, *, add_generation_prompt: bool = True) -> list[int]:
    from anatomy.inference.generate import encode_prompt

    rendered = [{"role": m.role, "content": m.text(), **({"name": m.name} if m.name else {})} for m in messages]
    if not add_generation_prompt:
        text = tokenizer.apply_chat_template(rendered, add_generation_prompt=False)
        return tokenizer.encode(text, add_special_tokens=False)
    return encode_prompt(rendered, tokenizer)


def encode_text(tokenizer: Any, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, str):
        if not prompt:
            raise RequestError("prompt must not be empty", param="prompt")
        return tokenizer.encode(prompt)
    bad = next((t for t in prompt if not 0 <= t < tokenizer.vocab_size), None)
    if bad is not None or not prompt:
        raise RequestError(f"prompt token id {bad!r} is not in [0, {tokenizer.vocab_size})" if prompt
                           else "prompt must not be empty", param="prompt")
    return list(prompt)


def gauges(loop: ServingLoop) -> dict[str, tuple[str, float]]:
    scheduler, blocks = loop.scheduler, loop.blocks
    return {
        "requests_running": ("Sequences in the running batch", len(scheduler.running)),
        "requests_waiting": ("Sequences waiting to be admitted", len(scheduler.waiting)),
        "kv_blocks_used": ("KV-cache blocks held by sequences", blocks.used),
        "kv_blocks_free": ("KV-cache blocks free (cached, unreferenced blocks included)", blocks.free),
        "kv_blocks_total": (f"KV-cache blocks of {blocks.block_size} tokens", blocks.num_blocks),
        "prefix_cache_queries_total": ("Prompt tokens looked up in the prefix cache", blocks.queried_tokens),
        "prefix_cache_hits_total": ("Prompt tokens found in the prefix cache", blocks.hit_tokens),
        "prefix_cache_hit_rate": ("Prefix-cache hits / queries, in tokens", blocks.hit_rate),
        "preemptions_total": ("Sequences preempted (recomputed later)", scheduler.preemptions),
    }


def error_json(status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type, "param": param, "code": code}},
                        status_code=status)


async def _request_error(request: Request, exc: Exception) -> Response:
    if isinstance(exc, RequestError):
        return error_json(exc.status, exc.message, type=exc.type, param=exc.param, code=exc.code)
    return error_json(400, str(exc))


async def _http_error(request: Request, exc: HTTPException) -> Response:
    if exc.status_code == 404:
        return error_json(404, f"no such endpoint: {request.method} {request.url.path}", code="not_found")
    if exc.status_code == 405:
        return error_json(405, f"{request.method} is not allowed on {request.url.path}", code="method_not_allowed")
    return error_json(exc.status_code, str(exc.detail))


async def _bug(request: Request, exc: Exception) -> Response:
    traceback.print_exception(exc, file=sys.stderr)
    return error_json(500, "internal server error (a bug in anatomy; see the server's log)", type="server_error")


def _key_middleware(key: str):
    from starlette.middleware import Middleware

    return Middleware(KeyCheck, key=key)


class KeyCheck:
    """401 for requests without `Authorization: Bearer <key>` (constant-time compare); /health and
    /metrics stay open."""

    def __init__(self, app, *, key: str) -> None:
        self.app, self.expected = app, f"Bearer {key}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                response = error_json(401, "invalid or missing API key (send Authorization: Bearer <key>)",
                                      code="invalid_api_key")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

