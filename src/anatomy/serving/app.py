"""The OpenAI-compatible HTTP app (Starlette on uvicorn): the edge between clients and the serving loop.

    POST /v1/chat/completions, /v1/completions   generation (SSE when "stream": true)
    POST /v1/responses                           the Responses API on the same loop (responses_api.py)
    POST /v1/embeddings                          sentence embeddings from the encoder model
    GET  /v1/models, /health, /metrics           what is served, readiness (200 / 503 loading), Prometheus
    POST /tokenize, /detokenize                  the served model's tokenizer (vLLM's shapes)
    GET  /tokenizer_info                         its special tokens and chat template (vLLM's)

Every error is OpenAI's JSON, {"error": {"message", "type", "param", "code"}}: 400 for bad input,
401 for a wrong or missing key (when the server has one; /health and /metrics stay open), 404
for an unknown model or path, 413 for a body over the limit, 429 (with Retry-After) past the
admission limit, 503 while loading or shutting down, 500 for a bug.
A client that goes away (a closed connection) has its sequences cancelled at once: the loop
frees their blocks at the start of its next step. On shutdown (`drain`) new requests get 503, the
ones in flight finish up to a deadline, and those still running then end with an error (a stream:
an error event and [DONE]).
"""

from __future__ import annotations

import asyncio
import hmac
import math
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
from anatomy.serving.chat_prompt import chat_ids
from anatomy.serving.grammar import GrammarEngine, GrammarError, GrammarSpec
from anatomy.serving.loop import ServingLoop
from anatomy.serving.protocol import (ChatRequest, CompletionRequest, DetokenizeRequest, EmbeddingRequest,
                                      RequestError, TokenizeRequest, ignored_fields, parse)
from anatomy.serving.sequence import Event
from anatomy.serving.tools import choice_grammar

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
    strict_fields: bool = False  # unknown request fields: 400 (OpenAI) rather than ignored and logged (vLLM)
    max_queue: int | None = None  # sequences that may wait beyond a full batch; past it, 429
    runs: set = field(default_factory=set)  # the RequestRuns in flight
    draining: bool = False  # shutting down: new requests get 503
    warned: set = field(default_factory=set)  # unknown field names already logged
    grammar_engine: GrammarEngine | None = None
    grammar_lock: threading.Lock = field(default_factory=threading.Lock)

    def serving(self) -> ServingLoop:
        if self.load_error is not None:
            raise RequestError(f"the model failed to load: {self.load_error}", status=503, type="server_error")
        if not self.ready.is_set():
            raise RequestError("the model is still loading; retry shortly", status=503, type="server_error",
                               code="loading")
        if self.draining:
            raise RequestError("the server is shutting down", status=503, type="server_error", code="shutting_down")
        return self.loop

    def admit(self, sequences: int) -> None:
        """429 with Retry-After when `sequences` more would queue past the admission limit."""
        if self.max_queue is None:
            return
        waiting = self.in_flight + sequences - self.loop.scheduler.max_seqs
        if waiting > self.max_queue:
            raise RequestError(f"the server is at its admission limit ({self.max_queue} sequences waiting beyond "
                               f"a full batch of {self.loop.scheduler.max_seqs}); retry later", status=429,
                               type="server_error", code="too_many_requests",
                               headers={"Retry-After": str(self.retry_after())})

    @property
    def in_flight(self) -> int:
        return sum(run.open for run in self.runs)

    def retry_after(self) -> int:
        """Seconds until a batch's worth of the queue is likely done: the median request latency, at least 1."""
        return max(1, math.ceil(self.loop.metrics.median_latency() or 1.0))

    def grammars(self) -> GrammarEngine:
        with self.grammar_lock:
            if self.grammar_engine is None:
                loop = self.serving()
                self.grammar_engine = GrammarEngine(self.tokenizer, vocab_size=loop.engine.config.vocab_size,
                                                    stop_ids=loop.eos_ids)
            return self.grammar_engine

    def parse(self, model: type, request: Request, body: bytes) -> Any:
        """The validated body; unknown fields are refused (strict_fields) or named once in the log."""
        req = parse(model, body, strict=self.strict_fields)
        new = [f for f in ignored_fields(req) if f not in self.warned]
        if new:
            self.warned.update(new)
            print(f"anatomy serve: warning: ignoring unrecognized fields in a {request.url.path} request: "
                  f"{', '.join(new)} (logged once per field)", file=sys.stderr, flush=True)
        return req

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
        req = state.parse(ChatRequest, request, await read_body(request, state.max_body_bytes))
        state.check_model(req.model)
        state.serving()
        ids, spec = chat_inputs(state.tokenizer, req)
        return await generate(state, request, req, [ids], chat=True, spec=spec)

    async def completions(request: Request) -> Response:
        req = state.parse(CompletionRequest, request, await read_body(request, state.max_body_bytes))
        state.check_model(req.model)
        state.serving()
        prompts = [encode_text(state.tokenizer, p) for p in req.prompts()]
        return await generate(state, request, req, prompts, chat=False, spec=req.structure())

    async def responses_api(request: Request) -> Response:
        from anatomy.serving.responses_api import handle

        return await handle(state, request, await read_body(request, state.max_body_bytes))

    async def tokenizer_info(request: Request) -> Response:
        loop = state.serving()
        return JSONResponse(responses.tokenizer_info(state.tokenizer, loop.context))

    async def embeddings(request: Request) -> Response:
        req = state.parse(EmbeddingRequest, request, await read_body(request, state.max_body_bytes))
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
        req = state.parse(TokenizeRequest, request, await read_body(request, state.max_body_bytes))
        if req.model is not None:
            state.check_model(req.model)
        loop = state.serving()
        if req.messages is not None:
            ids = chat_ids(state.tokenizer, req.messages, add_generation_prompt=req.add_generation_prompt)
        else:
            ids = state.tokenizer.encode(req.prompt, add_special_tokens=req.add_special_tokens)
        body = {"tokens": ids, "count": len(ids), "max_model_len": loop.context}
        if req.return_token_strs:
            body["token_strs"] = [state.tokenizer.id_to_token(i) for i in ids]
        return JSONResponse(body)

    async def detokenize(request: Request) -> Response:
        req = state.parse(DetokenizeRequest, request, await read_body(request, state.max_body_bytes))
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
        Route("/v1/responses", responses_api, methods=["POST"]),
        Route("/tokenizer_info", tokenizer_info, methods=["GET"]),
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
                   prompts: list[list[int]], *, chat: bool, spec: GrammarSpec | None = None,
                   render: Any = None) -> Response:
    """Run the prompts (n choices each) on the loop; the response whole, or streamed as SSE."""
    loop = state.serving()
    limits = [token_limit(len(ids), req.token_limit, loop.context, chat=chat) for ids in prompts]
    count = len(prompts) * req.n
    state.admit(count)
    constraints = await compile_constraints(state, spec, count)
    bias = req.bias(loop.engine.config.vocab_size)
    run = RequestRun(state, prompts, req, limits, constraints=constraints, bias=bias)
    if render is None:
        render = responses.ChatRender(req, state.tokenizer, usage_prompt=sum(map(len, prompts)), choices=count) \
            if chat else responses.CompletionRender(req, state.tokenizer, usage_prompt=sum(map(len, prompts)),
                                                    choices=count, prompts=echoed(state.tokenizer, req, prompts))
    if req.stream:
        return EventStream(render.stream(run.events()), on_disconnect=run.cancel)
    gathered = asyncio.ensure_future(render.collect(run.events()))
    gone = asyncio.ensure_future(_disconnected(request))
    await asyncio.wait({gathered, gone}, return_when=asyncio.FIRST_COMPLETED)
    if not gathered.done():  # the client left: free its sequences now
        run.cancel()
        gathered.cancel()
        return Response(status_code=499)
    gone.cancel()
    return JSONResponse(gathered.result())


def chat_inputs(tokenizer: Any, req: ChatRequest) -> tuple[list[int], GrammarSpec | None]:
    """A chat request's prompt ids (its tools in it unless tool_choice is "none") and the grammar its
    output must follow (response_format and the like, or tool_choice required / named), if any."""
    tools = req.tools if req.tool_choice_name != "none" else None
    ids = chat_ids(tokenizer, req.messages, tools=tools, add_generation_prompt=req.add_generation_prompt,
                   variables=req.chat_template_kwargs)
    spec = req.structure() or choice_grammar(req.tools or [], req.tool_choice_name, parallel=req.parallel_tool_calls)
    return ids, spec


async def compile_constraints(state: ServerState, spec: GrammarSpec | None, count: int) -> list:
    """One Constraint per sequence (the grammar compiled once, off the event loop), or Nones."""
    if spec is None:
        return [None] * count
    engine = await asyncio.to_thread(state.grammars)
    try:
        first = await asyncio.to_thread(engine.compile, spec)
    except GrammarError as exc:
        raise RequestError(exc.message, param=exc.param) from None
    return [first] + [engine.compile(spec) for _ in range(count - 1)]  # copies of the cached grammar


def echoed(tokenizer: Any, req: CompletionRequest, prompts: list[list[int]]) -> list[tuple[str, list[int]]] | None:
    """echo: each prompt's text (as sent, or its ids decoded) and ids."""
    if not req.echo:
        return None
    given = req.prompts()
    return [(p if isinstance(p, str) else tokenizer.decode(ids), ids) for p, ids in zip(given, prompts)]


async def drain(state: ServerState, deadline_s: float) -> None:
    """Shutdown: new requests get 503 from now on; the runs in flight have up to `deadline_s` seconds
    to finish, then the rest are aborted (a stream ends with an error event and [DONE])."""
    state.draining = True
    end = time.monotonic() + deadline_s
    while state.runs and time.monotonic() < end:
        await asyncio.sleep(0.05)
    for run in list(state.runs):
        run.abort(f"the server shut down before this request finished ({deadline_s:g} s after the signal)")
    await asyncio.sleep(0.2)  # the streams write their last events


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
    """The sequences of one HTTP request (n per prompt) and the queue their events arrive on; while
    it runs it is in state.runs (the admission limit counts its open choices; shutdown aborts it)."""

    def __init__(self, state: ServerState, prompts: list[list[int]], req: ChatRequest | CompletionRequest,
                 limits: list[int], *, constraints: list, bias: dict[int, float]) -> None:
        self.state, self.loop = state, state.loop
        self.queue: asyncio.Queue[tuple[int, Event] | None] = asyncio.Queue()
        aio = asyncio.get_running_loop()
        self.seqs = []
        prompt_logprobs = getattr(req, "prompt_logprob_count", None)
        for p, (ids, limit) in enumerate(zip(prompts, limits)):
            for j in range(req.n):
                index = p * req.n + j
                sink = _sink(aio, self.queue, index)
                self.seqs.append(self.loop.submit(
                    ids, req.sampling(limit, choice=j), sink, logprobs=req.logprob_count,
                    prompt_logprobs=prompt_logprobs, constraint=constraints[index], bias=bias,
                    min_tokens=req.min_tokens, generate=limit > 0))
        self.open = len(self.seqs)
        self.cancelled = False
        self.aborted: str | None = None
        state.runs.add(self)

    async def events(self) -> AsyncIterator[tuple[int, Event]]:
        """(choice index, event) until every choice has finished (or the run is cancelled); a
        RequestError (503) if the server's shutdown ended it first."""
        try:
            while self.open:
                item = await self.queue.get()
                if item is None:
                    break
                if item[1].finish_reason is not None:
                    self.open -= 1
                yield item
        finally:
            self.state.runs.discard(self)
        if self.aborted:
            raise RequestError(self.aborted, status=503, type="server_error", code="shutting_down")

    def cancel(self) -> None:
        if self.cancelled:
            return
        self.cancelled = True
        self.open = 0
        for seq in self.seqs:
            if not seq.finished:
                self.loop.cancel(seq)
        self.queue.put_nowait(None)
        self.state.runs.discard(self)

    def abort(self, message: str) -> None:
        """End the run now (shutdown): its sequences are cancelled, its response ends with `message`."""
        self.aborted = message
        self.cancel()


def _sink(aio: asyncio.AbstractEventLoop, queue: asyncio.Queue, index: int) -> Callable[[Event], None]:
    def sink(event: Event) -> None:  # called on the serving loop's thread
        if aio.is_closed():  # the server has stopped: nobody is listening
            return
        try:
            aio.call_soon_threadsafe(queue.put_nowait, (index, event))
        except RuntimeError:  # closed between the check and the call
            pass
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
        response = error_json(exc.status, exc.message, type=exc.type, param=exc.param, code=exc.code)
        response.headers.update(exc.headers or {})
        return response
    return error_json(400, str(exc), param=getattr(exc, "param", None))


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

