"""What the app serves and the rules at its door: the model side (filled in by the loader), readiness,
shutdown (draining), the admission limit, the unknown-field policy, the grammar engine."""

from __future__ import annotations

import math
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from starlette.requests import Request

from anatomy.serving.grammar import GrammarEngine
from anatomy.serving.loop import ServingLoop
from anatomy.serving.protocol import RequestError, ignored_fields, parse

MAX_BODY_BYTES = 4 * 1024 * 1024


@dataclass
class ServerState:
    """What the app serves; the model side is filled in by a loader thread (`ready` when done)."""

    model_name: str
    api_key: str | None = None
    max_body_bytes: int = MAX_BODY_BYTES
    loop: ServingLoop | None = None
    tokenizer: Any = None
    embedding_name: str | None = None
    embedder: Callable[[list], tuple[Any, int]] | None = None  # texts or ids -> (unit vectors [N, D], tokens)
    rerank_name: str | None = None
    reranker: Any = None  # /v1/rerank and /v1/score (serving/rerank.py)
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
    reasoning_parser: str | None = None  # chat answers' <think> blocks go to reasoning_content (reasoning.py)
    reasoning_budget: int = -1  # tokens a thinking block may take unless a request says (-1: no limit)
    runtime_lora: bool = False  # /v1/load_lora_adapter and /v1/unload_lora_adapter are on (serving/adapters.py)

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

    def adapters(self) -> Any:
        """The LoRA adapters the engine serves (anatomy/lora/slots.py AdapterSlots), or None."""
        return getattr(getattr(self.loop, "engine", None), "lora", None)

    def adapter(self, name: str | None) -> Any:
        """The loaded LoRA adapter (an AdapterRef) a request's `model` names: None for the base model; a
        404 naming it for a name that is neither."""
        if name is None or name == self.model_name:
            return None
        slots = self.adapters()
        ref = slots.get(name) if slots is not None else None
        if ref is None:
            self.check_model(name)
        return ref

    def check_model(self, name: str, *, embedding: bool = False) -> None:
        served = self.embedding_name if embedding else self.model_name
        slots = None if embedding else self.adapters()
        if name != served and (slots is None or slots.get(name) is None):
            what = "embedding model" if embedding else "model"
            adapters = [ref.name for ref in slots.loaded()] if slots is not None else []
            choices = ", ".join(repr(n) for n in dict.fromkeys((self.model_name, self.embedding_name, *adapters))
                                if n) or "none"
            raise RequestError(f"the {what} {name!r} does not exist here (served: {choices})", param="model",
                               status=404, code="model_not_found")
