"""The HTTP edge of the endpoints that read a model without generating: /v1/embeddings, /v1/rerank
(also /rerank, /v2/rerank, as vLLM routes them) and /v1/score (also /score). Each runs its forward passes in a
worker thread, one request at a time (the state's embed_lock), and answers in its API's JSON.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from anatomy.serving import responses
from anatomy.serving.pooling import matryoshka
from anatomy.serving.protocol import EmbeddingRequest, RequestError
from anatomy.serving.rerank import activated
from anatomy.serving.rerank_protocol import RerankRequest, ScoreRequest

RERANK_PATHS = ("/v1/rerank", "/rerank", "/v2/rerank")
SCORE_PATHS = ("/v1/score", "/score")


async def embeddings(state: Any, request: Request, body: bytes) -> Response:
    req = state.parse(EmbeddingRequest, request, body)
    if state.embedder is None:
        state.serving()  # 503 while loading
    state.check_model(req.model, embedding=True)
    inputs = req.inputs()
    vectors, tokens = await _locked(state, lambda: state.embedder(inputs))
    vectors = matryoshka(vectors, req.dimensions)
    return JSONResponse(responses.embeddings(vectors, req.model, req.encoding_format, tokens))


async def rerank(state: Any, request: Request, body: bytes) -> Response:
    req = state.parse(RerankRequest, request, body)
    name = _reranker(state, req.model)
    texts = req.texts()
    logits, tokens = await _locked(state, lambda: state.reranker.scores([(req.query, d) for d in texts],
                                                                          req.instruction))
    scores = _scores(state, logits, req.activation)
    order = sorted(range(len(texts)), key=lambda i: -scores[i])[:req.top_n]
    results = [{"index": i, "relevance_score": scores[i], **({"document": {"text": texts[i]}}
                                                              if req.return_documents else {})} for i in order]
    return JSONResponse({"id": f"rerank-{uuid.uuid4().hex}", "model": name, "usage": {"total_tokens": tokens},
                         "results": results})


async def score(state: Any, request: Request, body: bytes) -> Response:
    req = state.parse(ScoreRequest, request, body)
    name = _reranker(state, req.model)
    pairs = req.pairs()
    logits, tokens = await _locked(state, lambda: state.reranker.scores(pairs, req.instruction, param="text_2"))
    data = [{"index": i, "object": "score", "score": s} for i, s in enumerate(_scores(state, logits, req.activation))]
    return JSONResponse({"id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                         "model": name, "data": data, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


def _reranker(state: Any, model: str | None) -> str:
    """The reranker's name; 400 if the server has none, 404 for another model's name."""
    if state.reranker is None:
        state.serving()  # 503 while loading
        raise RequestError(f"{model or state.model_name!r} is not a reranker: start the server with "
                           "--rerank-model (a cross-encoder, or 'self' for the served decoder)", param="model",
                           code="model_not_supported")
    if model is not None and model != state.rerank_name:
        raise RequestError(f"the reranker {model!r} does not exist here (served: {state.rerank_name!r})",
                           param="model", status=404, code="model_not_found")
    return state.rerank_name


def _scores(state: Any, logits: Any, activation: bool | None) -> list[float]:
    chosen = state.reranker.activation if activation is None else activation
    return activated(logits, chosen).tolist()


async def _locked(state: Any, work: Callable[[], Any]) -> Any:
    """work() in a worker thread, one pooling request at a time."""

    def run() -> Any:
        with state.embed_lock:
            return work()

    return await asyncio.to_thread(run)
