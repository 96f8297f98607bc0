"""Engines kept for a model across calls: `anatomy.generate(model, ...)` pays the set-up once.

    engine = engine_for(model)          # made on first use: the engine's view, its kernel plan, its graphs
    engine_for(model) is engine         # True: the same engine the next time
    anatomy.kept_engines.clear()        # frees them all (they also go when the model is collected)

An engine is tied to the model object (weakly: it never keeps the model alive) and to a
fingerprint of its weights, the identity and version counter of every parameter and buffer: any
in-place change (`p.add_(...)`, `load_state_dict`), a new tensor put in place, a module swapped in
makes the next call build a new engine on the new weights. Engines of one model are kept per set of
engine options (`compile`, `capture`, `attention`, `plan_cache`, `kv_dtype`, `native_blocks`,
`take_weights`, `backend`, `huge_pages`; an encoder-decoder's: `attention`).
Safe to share between threads.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any

from torch import nn


def fingerprint(model: nn.Module) -> tuple:
    """Identity, storage and version counter of each of the model's tensors: changes when its weights do."""
    return tuple((id(t), t.data_ptr(), t._version) for t in itertools.chain(model.parameters(), model.buffers()))


class KeptEngines:
    """model -> {options: engine}, valid while the model's fingerprint stays the same."""

    def __init__(self) -> None:
        self._entries: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def get(self, model: nn.Module, **options: Any):
        """The engine of `model` with these options, made now if there is none for its current weights."""
        options = _options(model, options)
        key, now = tuple(sorted(options.items())), fingerprint(model)
        with self._lock:
            seen, engines = self._entries.get(model, (None, {}))
            if seen != now:
                engines = {}
            if key not in engines:
                engines[key] = _make(model, **options)
                now = fingerprint(model)  # an engine that took the weights emptied them
            self._entries[model] = (now, engines)
            return engines[key]

    def __len__(self) -> int:
        with self._lock:
            return sum(len(engines) for _, engines in self._entries.values())

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


DECODER_OPTIONS = {"compile": False, "capture": True, "attention": None, "plan_cache": True, "kv_dtype": None,
                   "native_blocks": True, "take_weights": False, "backend": None, "huge_pages": True}
SEQ2SEQ_OPTIONS = {"attention": None}


def _options(model: nn.Module, options: dict[str, Any]) -> dict[str, Any]:
    """The options of an engine, defaults filled in (so that a default given or left out is one key)."""
    from anatomy.errors import InputError

    if not getattr(getattr(model, "config", None), "architecture", None):
        raise InputError(f"an engine needs an anatomy model, got {type(model).__name__}")
    known = SEQ2SEQ_OPTIONS if model.config.is_seq2seq else DECODER_OPTIONS
    unknown = set(options) - set(known)
    if unknown:
        raise InputError(f"unknown engine option(s) {sorted(unknown)}; the options are {sorted(known)}")
    return {**known, **options}


def _make(model: nn.Module, **options: Any):
    from anatomy.inference.engine.engine import DecoderEngine
    from anatomy.inference.engine.seq2seq import Seq2SeqEngine

    if model.config.is_seq2seq:
        return Seq2SeqEngine(model, **options)
    return DecoderEngine(model, **options)


kept_engines = KeptEngines()


def engine_for(model: nn.Module, **options: Any):
    """The engine kept for `model` (a DecoderEngine, or a Seq2SeqEngine for an encoder-decoder model),
    made on first use; `options` are DecoderEngine's (compile, capture, attention, plan_cache, kv_dtype,
    native_blocks, take_weights, backend)."""
    return kept_engines.get(model, **options)
