"""Sentence embeddings from an encoder: what sentence-transformers computes for all-MiniLM-L6-v2.

    anatomy.embed("all-minilm-l6-v2", ["a cat", "a dog"])  -> Tensor [2, 384], unit rows;
                                                              rows @ rows.T is cosine similarity

Each text is tokenized ([CLS] text [SEP]), cut to the model's maximum length, run through the
encoder, and its hidden states are averaged over the real tokens (mean pooling: padding is left
out by the attention mask), then L2-normalised. Texts go through in batches sorted by length, so
each batch pads to little more than its own longest text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from anatomy.deprecation import deprecated
from anatomy.errors import CheckpointError, InputError
from anatomy.inference.model_cache import loaded_models
from anatomy.models import Encoder
from anatomy.text.tokenizer import Tokenizer

DEFAULT_MODEL = "all-minilm-l6-v2"
ModelSpec = Union[str, Path, tuple[nn.Module, Tokenizer]]


def embed(model: ModelSpec | None = None, texts: str | Sequence[str] | None = None, /, *, batch_size: int = 32,
          normalize: bool = True, **keywords: Any) -> Tensor:
    """Embeddings [N, D] of `texts` (one string counts as a list of one) by `model`, model first as
    in anatomy.generate: `anatomy.embed("all-minilm-l6-v2", texts)` (or model=, texts= by name).

    `model` is an installed model name, a model directory, or an already loaded (encoder,
    tokenizer) pair. A model loaded by name is kept for the next call (anatomy.loaded_models).
    The old texts-first forms embed(texts), embed(texts, model=...) and embed(texts, "name") still
    work, with a DeprecationWarning.
    """
    model, texts = _model_and_texts(model, texts, keywords)
    texts = [texts] if isinstance(texts, str) else texts
    _check_texts(texts)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size must be a positive integer, got {batch_size!r}")
    encoder, tokenizer, max_length = _model(model)
    ids = tokenizer.encode_batch(list(texts), max_length=max_length)
    pad_id = _pad_id(encoder, tokenizer)
    out = torch.empty(len(ids), encoder.config.d_model)  # [N, D]
    longest_first = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    for start in range(0, len(ids), batch_size):
        chunk = longest_first[start:start + batch_size]
        input_ids, mask = pad_right([ids[i] for i in chunk], pad_id=pad_id)
        with torch.inference_mode():
            hidden = encoder(input_ids, attention_mask=mask)  # [b, S, D]
        out[chunk] = mean_pool(hidden, mask).float()  # [b, D]
    return F.normalize(out, dim=-1) if normalize else out


# the call forms of embed: (first positional given, second positional given, keywords)
_MODEL_FIRST = (True, True, frozenset())
_MODEL_THEN_TEXTS_KEYWORD = (True, False, frozenset({"texts"}))
_KEYWORDS = (False, False, frozenset({"model", "texts"}))
_TEXTS_FIRST = ((True, False, frozenset()), (True, False, frozenset({"model"})), (False, False, frozenset({"texts"})))


def _model_and_texts(first: Any, second: Any, keywords: dict[str, Any]) -> tuple[ModelSpec, Any]:
    """(model, texts) of a call, in a model-first form or one of the deprecated texts-first ones."""
    unknown = sorted(set(keywords) - {"model", "texts"})
    if unknown:
        raise InputError(f"embed() has no argument {unknown[0]!r}: it takes (model, texts, *, batch_size, normalize)")
    form = (first is not None, second is not None, frozenset(keywords))
    if form == _MODEL_FIRST and _texts_then_model(first, second):
        deprecated("anatomy.embed(texts, model) is deprecated, use anatomy.embed(model, texts)")
        return second, first
    if form == _MODEL_FIRST:
        return first, second
    if form == _MODEL_THEN_TEXTS_KEYWORD:
        return first, keywords["texts"]
    if form == _KEYWORDS:
        return keywords["model"], keywords["texts"]
    if form in _TEXTS_FIRST:
        deprecated(f"anatomy.embed(texts{', model=...' if 'model' in keywords else ''}) is deprecated, use "
                   f"anatomy.embed(model, texts), e.g. anatomy.embed({DEFAULT_MODEL!r}, texts)")
        return keywords.get("model", DEFAULT_MODEL), first if first is not None else keywords["texts"]
    raise InputError("embed() takes the model, then the texts: anatomy.embed(model, texts)")


def _texts_then_model(first: Any, second: Any) -> bool:
    """Is (first, second) the old (texts, model name) order? A list of strings before a name is;
    two strings are when the second names a model and the first does not."""
    if not isinstance(second, (str, Path)):
        return False
    if isinstance(first, (list, tuple)) and all(isinstance(t, str) for t in first):
        return True
    return isinstance(first, str) and not _names_model(first) and _names_model(second)


def _names_model(text: str | Path) -> bool:
    from anatomy.checkpoints.registry import NAMED_MODELS

    return str(text) in NAMED_MODELS or Path(text).expanduser().exists()


def mean_pool(hidden: Tensor, mask: Tensor) -> Tensor:
    """Average of hidden [B, S, D] over the positions where mask [B, S] is 1 -> [B, D]."""
    weights = mask.to(hidden.dtype).unsqueeze(-1)  # [B, S, 1]
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)


def pad_right(batch: list[list[int]], *, pad_id: int) -> tuple[Tensor, Tensor]:
    """Token id lists -> input_ids [B, S] padded at the end with pad_id, attention_mask [B, S]."""
    longest = max(len(ids) for ids in batch)
    input_ids = torch.full((len(batch), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), longest), dtype=torch.long)
    for row, ids in enumerate(batch):
        input_ids[row, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        mask[row, :len(ids)] = 1
    return input_ids, mask


def _model(model: str | Path | tuple[nn.Module, Tokenizer]) -> tuple[Encoder, Tokenizer, int]:
    """(encoder, tokenizer, max_length) for any accepted form of `model`."""
    if isinstance(model, tuple):
        if len(model) != 2 or not isinstance(model[1], Tokenizer):
            raise InputError("model must be a name, a directory, or an (encoder, anatomy Tokenizer) pair")
        encoder = _encoder_of(model[0], source="the given model")
        return encoder, model[1], encoder.config.max_seq_len
    if not isinstance(model, (str, Path)):
        raise InputError(f"model must be a name, a directory, or an (encoder, tokenizer) pair, "
                         f"got {type(model).__name__}")
    return load_embedder(str(model))


def load_embedder(name_or_path: str) -> tuple[Encoder, Tokenizer, int]:
    """(encoder, tokenizer, max_length) of a model name or directory, loaded once (anatomy.loaded_models)."""
    return loaded_models.get(("embed", name_or_path), lambda: _load_embedder(name_or_path))


def _load_embedder(name_or_path: str) -> tuple[Encoder, Tokenizer, int]:
    import anatomy
    from anatomy.checkpoints.source import find_model

    path = find_model(name_or_path).checkpoint("embedding")
    encoder = _encoder_of(anatomy.load(path), source=str(path))
    tokenizer = anatomy.load_tokenizer(path)
    return encoder, tokenizer, _max_length(path, encoder)


def _encoder_of(model: nn.Module, *, source: str) -> Encoder:
    """The Encoder itself, or the one inside a MaskedLM; anything else cannot embed text."""
    encoder = getattr(model, "encoder", model)
    if not isinstance(encoder, Encoder):
        raise InputError(f"{source}: embeddings need an encoder model (BERT-like), got {type(model).__name__}")
    return encoder


def _max_length(path: Path, encoder: Encoder) -> int:
    """sentence-transformers' max_seq_length (sentence_bert_config.json) when the model has one,
    else the position table's length."""
    limit = encoder.config.max_seq_len
    config_path = path / "sentence_bert_config.json"
    if not config_path.is_file():
        return limit
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{config_path}: not valid UTF-8 JSON: {exc}") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{config_path}: expected a JSON object, got {type(config).__name__}")
    value = config.get("max_seq_length", limit)
    if isinstance(value, bool) or not isinstance(value, int) or not 2 < value <= limit:
        raise CheckpointError(f"{config_path}: max_seq_length={value!r} must be an integer in [3, {limit}]")
    return value


def _pad_id(encoder: Encoder, tokenizer: Tokenizer) -> int:
    for candidate in (tokenizer.pad_id, encoder.config.pad_token_id):
        if candidate is not None:
            return candidate
    return 0  # any id works: padded positions are masked out of attention and pooling


def _check_texts(texts: object) -> None:
    if not isinstance(texts, Sequence) or not texts:
        raise InputError(f"texts must be a string or a non-empty list of strings, got {texts!r:.80}")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InputError(f"text {i} is not a string: {text!r:.80}")
