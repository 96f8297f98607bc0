"""What a caller passed as "the model", made runnable: a name loaded once, a model given its kept engine.

    load_named("<model>")                  -> LoadedModel(model, tokenizer), kept in anatomy.loaded_models
    resolve_model(model_or_engine_or_name, tokenizer) -> (the engine's model, the tokenizer, the engine)

A name (an installed model, a .gguf file, an HF directory) is loaded once, with its tokenizer, into
`anatomy.loaded_models`; a model object runs on the engine kept for it (`anatomy.engine_for`), so
the second call with the same model pays no set-up; an engine is used as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from anatomy.dtypes import torch_dtype
from anatomy.errors import CheckpointError, InputError
from anatomy.inference.engine import DecoderEngine, Seq2SeqEngine, engine_for
from anatomy.inference.model_cache import loaded_models
from anatomy.kv_format import parse_kv_dtype
from anatomy.text.tokenizer import Tokenizer
from anatomy.weights.choice import parse_weights
from anatomy.weights.modules import weights_held


@dataclass(frozen=True)
class LoadedModel:
    """A model loaded by name and its tokenizer; `engine()` is the one kept for the model."""

    model: nn.Module
    tokenizer: Any

    def engine(self, **options: Any) -> DecoderEngine | Seq2SeqEngine:
        return engine_for(self.model, **options)


def load_named(name: str, dtype: str | torch.dtype = "f32", weights: str = "auto") -> LoadedModel:
    """The model and tokenizer of a name / .gguf path / HF directory, loaded once (anatomy.loaded_models)
    with `anatomy.load`'s dtype and weights choice; loaded again once an engine took its weights."""
    dtype, weights = torch_dtype(dtype), parse_weights(weights)
    key = ("generate", name, dtype, weights)
    named = loaded_models.get(key, lambda: _load_named(name, dtype, weights))
    if not weights_held(named.model):  # an engine took them (the commands' take_weights): load it again
        loaded_models.discard(key)
        named = loaded_models.get(key, lambda: _load_named(name, dtype, weights))
    return named


def _load_named(name: str, dtype: torch.dtype, weights: str) -> LoadedModel:
    from anatomy.checkpoints.loader import load
    from anatomy.text.tokenizer import load_tokenizer

    path = checkpoint_of(name, "generation")
    tokenizer = load_tokenizer(path)  # first: its load's temporaries do not then add to the model's peak
    return LoadedModel(load(path, dtype=dtype, weights=weights), tokenizer)


def checkpoint_of(name: str, needs: str) -> Path:
    """The checkpoint a name or path refers to (source.find_model): an unknown name, a missing
    package, a preset or a config without weights is bad input (InputError), not a bad file."""
    from anatomy.checkpoints.source import find_model

    try:
        return find_model(name).checkpoint(needs)
    except CheckpointError as exc:
        raise InputError(str(exc)) from None


def resolve_model(model: Any, tokenizer: Any, *, compile: bool = False, kv_dtype: str | None = None
                  ) -> tuple[nn.Module, Any, DecoderEngine | Seq2SeqEngine]:
    """(the engine's model, the tokenizer, the engine) of what a caller passed: an engine as is (it
    keeps its own options); a name loaded once into `loaded_models`; a model object on the engine kept
    for it with these options (the model itself is never changed)."""
    if tokenizer is not None and not isinstance(tokenizer, Tokenizer):
        raise InputError(f"tokenizer must be an anatomy Tokenizer (anatomy.load_tokenizer), got {type(tokenizer).__name__}")
    if isinstance(model, (DecoderEngine, Seq2SeqEngine)):
        if kv_dtype is not None and parse_kv_dtype(kv_dtype) != getattr(model, "kv_dtype", None):
            raise InputError(f"kv_dtype={kv_dtype!r}: the engine given holds its KV cache in "
                             f"{getattr(model, 'kv_dtype', 'its own dtype')}; make it with DecoderEngine(model, "
                             "kv_dtype=...) or pass the model")
        return model.model, tokenizer, model
    if isinstance(model, (str, Path)):
        named = load_named(str(model))
        model, tokenizer = named.model, tokenizer if tokenizer is not None else named.tokenizer
    if not isinstance(model, nn.Module) or not hasattr(model, "config"):
        raise InputError(f"model must be an anatomy model, an engine or a model name/path, got {type(model).__name__}")
    if not (model.config.is_decoder or model.config.is_seq2seq):
        raise InputError(f"generation needs a decoder or encoder-decoder model, got architecture="
                         f"{model.config.architecture!r}")
    options = {"compile": compile, "kv_dtype": parse_kv_dtype(kv_dtype)} if model.config.is_decoder else {}
    engine = engine_for(model, **options)
    return engine.model, tokenizer, engine
