"""LoRA adapters at the HTTP edge, as vLLM serves them: a request's `model` names the adapter it runs
with (state.adapter), /v1/models lists them with the base as `parent`, and with --allow-runtime-lora
they are loaded and unloaded while the server runs.

    POST /v1/load_lora_adapter    {"lora_name": "sql", "lora_path": "adapters/sql"}   200 text; 400 bad, taken, full
    POST /v1/unload_lora_adapter  {"lora_name": "sql"}                                200 text; 404 unknown
    a request's "lora": [{"id": 1, "scale": 0.5}]   llama-server's: the adapter of that index in /v1/models' order
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from anatomy.errors import InputError
from anatomy.serving.protocol import LoadLoraRequest, RequestError, UnloadLoraRequest
from anatomy.serving.responses import model_entry
from anatomy.serving.state import ServerState


def model_entries(state: ServerState, context: int | None) -> list[dict[str, Any]]:
    """/v1/models' entries of the loaded adapters (vLLM's: `root` the adapter's path, `parent` the base)."""
    slots = state.adapters()
    return [{**model_entry(ref.name, state.created, context), "root": ref.path, "parent": state.model_name}
            for ref in (slots.loaded() if slots is not None else [])]


def requested(state: ServerState, req: Any) -> tuple[Any, float]:
    """(the AdapterRef a generation request runs with or None, the scale of its update): by its `model`
    (vLLM), or by llama-server's `lora` list (one entry of non-zero scale; not with an adapter's `model`)."""
    ref = state.adapter(getattr(req, "model", None))
    entries = [e for e in (getattr(req, "lora", None) or []) if e.scale != 0]
    if not entries:
        return ref, 1.0
    if ref is not None or len(entries) > 1:
        raise RequestError("a request runs with one LoRA adapter: named by `model` or by one `lora` entry of "
                           "non-zero scale", param="lora")
    slots = state.adapters()
    loaded = slots.loaded() if slots is not None else []
    if entries[0].id >= len(loaded):
        names = ", ".join(f"{i}: {r.name!r}" for i, r in enumerate(loaded)) or "none"
        raise RequestError(f"lora id {entries[0].id} is not a loaded adapter (loaded: {names})", param="lora")
    return loaded[entries[0].id], entries[0].scale


async def load(state: ServerState, request: Request, body: bytes) -> Response:
    slots = _runtime_slots(state)
    req = state.parse(LoadLoraRequest, request, body)
    if req.lora_name in (state.model_name, state.embedding_name, state.rerank_name):
        raise RequestError(f"lora_name {req.lora_name!r} is the name of a served model", param="lora_name")
    if slots.get(req.lora_name) is not None:
        raise RequestError(f"The lora adapter '{req.lora_name}' has already been loaded.", param="lora_name")
    try:
        await asyncio.to_thread(slots.load, req.lora_name, req.lora_path)
    except InputError as exc:
        raise RequestError(str(exc), param="lora_path") from None
    return PlainTextResponse(f"Success: LoRA adapter '{req.lora_name}' added successfully.")


async def unload(state: ServerState, request: Request, body: bytes) -> Response:
    slots = _runtime_slots(state)
    req = state.parse(UnloadLoraRequest, request, body)
    if not slots.unload(req.lora_name):
        raise RequestError(f"The lora adapter '{req.lora_name}' cannot be found.", param="lora_name", status=404,
                           code="model_not_found")
    return PlainTextResponse(f"Success: LoRA adapter '{req.lora_name}' removed successfully.")


def _runtime_slots(state: ServerState):
    state.serving()
    slots = state.adapters()
    if slots is None or not state.runtime_lora:
        raise RequestError("loading and unloading LoRA adapters at run time is off: start the server with "
                           "--allow-runtime-lora (and --max-loras)", status=400, code="runtime_lora_disabled")
    return slots
