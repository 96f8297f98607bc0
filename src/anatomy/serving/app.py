"""The OpenAI-compatible HTTP app (Starlette on uvicorn): the edge between clients and the serving loop.

Routes: OpenAI's /v1/chat/completions, /v1/completions, /v1/responses, /v1/embeddings, /v1/models;
Anthropic's /v1/messages; vLLM's rerank, score, tokenizer and LoRA-adapter routes; /health, /metrics.
At the edge: the API key, the body and admission limits, a gone client's sequences cancelled at once,
the drain on shutdown; every error is OpenAI's JSON (Anthropic's under /v1/messages).
Details: docs/serving.md, "The API", "Overload and shutdown" and "Errors".
"""

from __future__ import annotations

import hmac
import sys
import traceback
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from anatomy.errors import InputError
from anatomy.serving import adapters, messages_api, pooling_api, responses, responses_api
from anatomy.serving.chat_prompt import chat_ids
from anatomy.serving.generation import chat_inputs, generate
from anatomy.serving.loop import ServingLoop
from anatomy.serving.protocol import ChatRequest, CompletionRequest, DetokenizeRequest, RequestError, TokenizeRequest
from anatomy.serving.state import MAX_BODY_BYTES, ServerState  # noqa: F401 (the app's state, for its users)

OPEN_PATHS = ("/health", "/metrics")


def create_app(state: ServerState) -> Starlette:
    async def health(request: Request) -> Response:
        if state.load_error is not None:
            return JSONResponse({"status": "error", "message": state.load_error}, status_code=503)
        return JSONResponse({"status": "ok" if state.ready.is_set() else "loading"},
                            status_code=200 if state.ready.is_set() else 503)

    async def models(request: Request) -> Response:
        context = state.loop.context if state.ready.is_set() and state.loop else None
        entries = [responses.model_entry(state.model_name, state.created, context)]
        entries += adapters.model_entries(state, context)
        for name in dict.fromkeys((state.embedding_name, state.rerank_name)):
            if name and name != state.model_name:
                entries.append(responses.model_entry(name, state.created, None))
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

    async def responses_endpoint(request: Request) -> Response:
        return await responses_api.handle(state, request, await read_body(request, state.max_body_bytes))

    async def messages(request: Request) -> Response:
        return await messages_api.handle(state, request, await read_body(request, state.max_body_bytes))

    async def count_tokens(request: Request) -> Response:
        return await messages_api.count_tokens(state, request, await read_body(request, state.max_body_bytes))

    async def tokenizer_info(request: Request) -> Response:
        loop = state.serving()
        return JSONResponse(responses.tokenizer_info(state.tokenizer, loop.context))

    async def embeddings(request: Request) -> Response:
        return await pooling_api.embeddings(state, request, await read_body(request, state.max_body_bytes))

    async def rerank(request: Request) -> Response:
        return await pooling_api.rerank(state, request, await read_body(request, state.max_body_bytes))

    async def score(request: Request) -> Response:
        return await pooling_api.score(state, request, await read_body(request, state.max_body_bytes))

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

    async def load_adapter(request: Request) -> Response:
        return await adapters.load(state, request, await read_body(request, state.max_body_bytes))

    async def unload_adapter(request: Request) -> Response:
        return await adapters.unload(state, request, await read_body(request, state.max_body_bytes))

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
        Route("/v1/responses", responses_endpoint, methods=["POST"]),
        Route(messages_api.PATH, messages, methods=["POST"]),
        Route(f"{messages_api.PATH}/count_tokens", count_tokens, methods=["POST"]),
        Route("/tokenizer_info", tokenizer_info, methods=["GET"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        *(Route(path, rerank, methods=["POST"]) for path in pooling_api.RERANK_PATHS),
        *(Route(path, score, methods=["POST"]) for path in pooling_api.SCORE_PATHS),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/load_lora_adapter", load_adapter, methods=["POST"]),
        Route("/v1/unload_lora_adapter", unload_adapter, methods=["POST"]),
    ]
    handlers = {HTTPException: _http_error, RequestError: _request_error, InputError: _request_error,
                Exception: _bug}
    return Starlette(routes=routes, exception_handlers=handlers,
                     middleware=[] if state.api_key is None else [_key_middleware(state.api_key)])


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
        "kv_cache_tokens": (f"Tokens the KV cache holds ({loop.engine.kv_dtype})", blocks.num_blocks * blocks.block_size),
        "kv_cache_bytes": ("Bytes of the KV cache's blocks (scales included)", loop.cache.nbytes),
        "kv_held_bytes": ("Bytes of the KV blocks the sequences hold (every group)", loop.held_bytes),
        **(window_gauges(loop.window) if loop.window else {}),
        "prefix_cache_queries_total": ("Prompt tokens looked up in the prefix cache", blocks.queried_tokens),
        "prefix_cache_hits_total": ("Prompt tokens found in the prefix cache", blocks.hit_tokens),
        "prefix_cache_hit_rate": ("Prefix-cache hits / queries, in tokens", blocks.hit_rate),
        "preemptions_total": ("Sequences preempted (recomputed later)", scheduler.preemptions),
        **(offload_counters(loop.offload) if getattr(loop, "offload", None) else {}),
    }


def offload_counters(offload) -> dict[str, tuple[str, float]]:
    """The KV blocks kept beyond the pool (serving/offload.py)."""
    return {
        "kv_offload_saved_blocks_total": ("KV blocks evicted from the pool into host memory", offload.saved),
        "kv_offload_written_blocks_total": ("KV blocks written to --kv-offload-dir", offload.written),
        "kv_offload_restored_blocks_total": ("KV blocks copied back instead of computed", offload.restored),
    }


def window_gauges(window) -> dict[str, tuple[str, float]]:
    """The sliding-window layers' group of blocks (serving/window_blocks.py)."""
    blocks = window.manager
    return {
        "kv_window_blocks_used": ("Sliding-window layers' KV blocks held by sequences", blocks.used),
        "kv_window_blocks_free": ("Sliding-window layers' KV blocks free", blocks.free),
        "kv_window_blocks_total": (f"Sliding-window layers' KV blocks (window {window.window})", blocks.num_blocks),
    }


def error_json(status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None, path: str = "") -> JSONResponse:
    """An error in OpenAI's JSON, or in Anthropic's for a path of the Messages API."""
    if path.startswith(messages_api.PATH):
        return messages_api.error_json(status, message)
    return JSONResponse({"error": {"message": message, "type": type, "param": param, "code": code}},
                        status_code=status)


async def _request_error(request: Request, exc: Exception) -> Response:
    path = request.url.path
    if isinstance(exc, RequestError):
        response = error_json(exc.status, exc.message, type=exc.type, param=exc.param, code=exc.code, path=path)
        response.headers.update(exc.headers or {})
        return response
    return error_json(400, str(exc), param=getattr(exc, "param", None), path=path)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    path = request.url.path
    if exc.status_code == 404:
        return error_json(404, f"no such endpoint: {request.method} {path}", code="not_found", path=path)
    if exc.status_code == 405:
        return error_json(405, f"{request.method} is not allowed on {path}", code="method_not_allowed", path=path)
    return error_json(exc.status_code, str(exc.detail), path=path)


async def _bug(request: Request, exc: Exception) -> Response:
    traceback.print_exception(exc, file=sys.stderr)
    return error_json(500, "internal server error (a bug in anatomy; see the server's log)", type="server_error",
                      path=request.url.path)


def _key_middleware(key: str):
    from starlette.middleware import Middleware

    return Middleware(KeyCheck, key=key)


class KeyCheck:
    """401 for requests without `Authorization: Bearer <key>` or (Anthropic's) `x-api-key: <key>`
    (constant-time compares); /health and /metrics stay open."""

    def __init__(self, app, *, key: str) -> None:
        self.app, self.key = app, key.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            headers = dict(scope["headers"])
            bearer = hmac.compare_digest(headers.get(b"authorization", b""), b"Bearer " + self.key)
            if not (hmac.compare_digest(headers.get(b"x-api-key", b""), self.key) or bearer):
                response = error_json(401, "invalid or missing API key (send Authorization: Bearer <key> or "
                                      "x-api-key: <key>)", code="invalid_api_key", path=scope["path"])
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

