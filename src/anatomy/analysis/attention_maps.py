"""Attention maps: run a real model on a text and keep every layer's attention weights, per head,
over the actual tokens (docs/anatomy.md, "Attention maps").

    maps = anatomy.attention("<model>", "The cat sat on the mat.")
    maps.groups[0].weights          # [L, H, S, S]: softmax(Q K^T / sqrt(d_h) + mask) of each layer
    maps.save_html("attention.html")   # grid of L x H heatmaps + one enlarged, token-to-token on hover

The weights come from the model's eager attention path (`weights=` of every model's forward): each
kind of self-attention, and an encoder-decoder's cross-attention over the source.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from anatomy.errors import InputError

MAX_TOKENS = 128  # the page stores L*H*S^2 weights, so its size grows with the square of the tokens
TARGET_TOKENS = 16  # an encoder-decoder's target, when none is given: its own greedy output


@dataclass(frozen=True)
class AttentionGroup:
    """One kind of attention of a model: weights [L, H, S_q, S_k] over query and key tokens."""

    name: str  # "self-attention", "encoder self-attention", "decoder self-attention", "cross-attention"
    kind: str  # "causal", "bidirectional" or "cross"
    queries: tuple[str, ...]  # token text of each query position (rows)
    keys: tuple[str, ...]  # token text of each key position (columns)
    weights: Tensor  # [L, H, S_q, S_k], float32 on the CPU
    layers: tuple[int, ...]  # the model layer of each of the L maps
    heads: tuple[int, ...]  # the model head of each of the H maps

    def select(self, layers: Sequence[int] | None = None, heads: Sequence[int] | None = None) -> AttentionGroup:
        """The same group restricted to some model layers and heads (indices as in the model)."""
        li = [self.layers.index(layer) for layer in layers] if layers is not None else range(len(self.layers))
        hi = [self.heads.index(head) for head in heads] if heads is not None else range(len(self.heads))
        weights = self.weights[list(li)][:, list(hi)]
        return replace(self, weights=weights, layers=tuple(self.layers[i] for i in li),
                       heads=tuple(self.heads[i] for i in hi))


@dataclass(frozen=True)
class AttentionMaps:
    """Every attention group of one run, with the page and the PNG that show them."""

    model: str
    text: str
    groups: tuple[AttentionGroup, ...]
    focus: tuple[int, int] | None = None  # (layer, head) shown enlarged first
    target: str = ""  # an encoder-decoder's decoder input, as text

    def select(self, layers: Sequence[int] | None = None, heads: Sequence[int] | None = None) -> AttentionMaps:
        return replace(self, groups=tuple(g.select(layers, heads) for g in self.groups))

    def html(self) -> str:
        from anatomy.analysis.page.attention import attention_page

        return attention_page(self)

    def save_html(self, path: str | os.PathLike[str], *, option: str = "path") -> Path:
        from anatomy.analysis.page import write_page

        return write_page(self.html(), path, option=option)

    def save_png(self, path: str | os.PathLike[str], *, option: str = "path") -> Path:
        from anatomy.analysis.attention_png import save_png

        return save_png(self, path, option=option)

    def _repr_html_(self) -> str:
        from anatomy.analysis.page import notebook_frame

        return notebook_frame(self.html(), height=980)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{g.name} {list(g.weights.shape)}" for g in self.groups)
        return f"<anatomy attention maps of {self.model}: {shapes}>"


# -- running the model --------------------------------------------------------------------------

@torch.no_grad()
def attention_weights(model: nn.Module, input_ids: Tensor, *, target_ids: Tensor | None = None) -> dict[str, Tensor]:
    """Each layer's attention weights, stacked: {"self": [L, B, H, S, S]} for a decoder or an
    encoder; {"encoder": ..., "decoder": [L, B, H, T, T], "cross": [L, B, H, T, S]} for an
    encoder-decoder (target_ids [B, T] is then required). Eager path, eval mode."""
    config = model.config
    was_training = model.training
    model.eval()
    try:
        if config.is_seq2seq:
            if target_ids is None:
                raise InputError("an encoder-decoder needs target_ids for its decoder's attention")
            encoder: list[Tensor] = []
            memory = model.encode(input_ids, weights=encoder)  # [B, S, D]
            decoder: list[Tensor] = []  # per block: self-attention, then cross-attention
            model.decode(target_ids, memory, weights=decoder, last_only=True)
            return {"encoder": torch.stack(encoder), "decoder": torch.stack(decoder[0::2]),
                    "cross": torch.stack(decoder[1::2])}
        weights: list[Tensor] = []
        if config.is_encoder:
            model(input_ids, weights=weights)
        else:
            model(input_ids, weights=weights, last_only=True)
        return {"self": torch.stack(weights)}
    finally:
        model.train(was_training)


def attention(model: str | os.PathLike[str] | nn.Module, text: str | Sequence[int], *,
              tokenizer: Any = None, target: str | Sequence[int] | None = None, layer: int | None = None,
              head: int | None = None, truncate: bool = False, max_tokens: int = MAX_TOKENS,
              max_new_tokens: int = TARGET_TOKENS, name: str | None = None) -> AttentionMaps:
    """Run `model` on `text` and keep its attention weights (see the module docstring).

    model: a loaded model, or a name or path for `anatomy.load` (its tokenizer is loaded too, when
    it has one). text: a string, or token ids. Text longer than the model's context or than
    max_tokens raises InputError unless truncate=True (the first tokens are kept). `layer` and
    `head` restrict the maps to one layer and/or one head; for an encoder-decoder, `target` is the
    decoder's input (default: the model's own greedy output, up to max_new_tokens tokens).
    """
    if isinstance(model, (str, os.PathLike)):
        name = name or str(model)
        model, tokenizer = load_with_tokenizer(model, tokenizer)
    config = model.config
    name = name or type(model).__name__
    check_layer_head(config, layer, head, prefix="")
    limit, why = context_limit(config, max_tokens)
    ids = fit_tokens(token_ids(text, tokenizer, config, what="text"), limit, why, truncate=truncate, what="text")
    device = next(model.parameters()).device
    src = torch.tensor([ids], device=device)  # [1, S]
    labels = token_labels(ids, tokenizer)
    if config.is_seq2seq:
        tgt_ids = _target(model, ids, target, tokenizer, limit, why, truncate, max_new_tokens)
        weights = attention_weights(model, src, target_ids=torch.tensor([tgt_ids], device=device))
        tgt_labels = token_labels(tgt_ids, tokenizer)
        groups = [_group("encoder self-attention", "bidirectional", labels, labels, weights["encoder"]),
                  _group("decoder self-attention", "causal", tgt_labels, tgt_labels, weights["decoder"]),
                  _group("cross-attention", "cross", tgt_labels, labels, weights["cross"])]
        target_text = tokenizer.decode(tgt_ids) if tokenizer is not None else " ".join(tgt_labels)
    else:
        weights = attention_weights(model, src)
        kind = "bidirectional" if config.is_encoder else "causal"
        groups = [_group("self-attention", kind, labels, labels, weights["self"])]
        target_text = ""
    maps = AttentionMaps(name, text if isinstance(text, str) else " ".join(map(str, text)), tuple(groups),
                         target=target_text)
    layers = [layer] if layer is not None else None
    heads = [head] if head is not None else None
    maps = maps.select(layers, heads) if layers or heads else maps
    return replace(maps, focus=(layer if layer is not None else 0, head if head is not None else 0))


def _group(name: str, kind: str, queries: list[str], keys: list[str], weights: Tensor) -> AttentionGroup:
    w = weights[:, 0].float().cpu()  # [L, B=1, H, S_q, S_k] -> [L, H, S_q, S_k]
    return AttentionGroup(name, kind, tuple(queries), tuple(keys), w, tuple(range(w.shape[0])),
                          tuple(range(w.shape[1])))


# -- inputs -------------------------------------------------------------------------------------

def load_with_tokenizer(name: str | os.PathLike[str], tokenizer: Any = None) -> tuple[nn.Module, Any]:
    """`anatomy.load(name)` and its tokenizer, or None when the checkpoint has none (ids then)."""
    import anatomy
    from anatomy.checkpoints.source import find_model

    path = find_model(name).checkpoint("drawing attention maps")
    model = anatomy.load(path)
    if tokenizer is None:
        has_tokenizer = path.suffix == ".gguf" or (path.is_dir() and (path / "tokenizer.json").is_file())
        tokenizer = anatomy.load_tokenizer(name) if has_tokenizer else None
    return model, tokenizer


def context_limit(config, max_tokens: int, *, option: str = "max_tokens=") -> tuple[int, str]:
    """The most tokens a map may have, and why: the model's context or the page's bound."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens <= 0:
        raise InputError(f"{option}{max_tokens!r} must be a positive integer")
    if config.max_seq_len <= max_tokens:
        return config.max_seq_len, f"the model's context of {config.max_seq_len} tokens (max_seq_len)"
    return max_tokens, (f"the {max_tokens} tokens the maps are drawn for ({option.rstrip('= ')}; the model's "
                        f"context is {config.max_seq_len})")


def check_layer_head(config, layer: int | None, head: int | None, *, prefix: str = "--") -> None:
    """A layer and head that exist in every attention group of the model."""
    layers = config.n_layers if not config.is_seq2seq else min(config.n_layers, config.n_decoder_layers)
    what = (f"{config.n_layers} layers" if not config.is_seq2seq else
            f"{config.n_layers} encoder and {config.n_decoder_layers} decoder layers")
    sep = " " if prefix else "="
    for option, value, count, noun in (("layer", layer, layers, what), ("head", head, config.n_heads,
                                                                          f"{config.n_heads} heads")):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < count:
            raise InputError(f"{prefix}{option}{sep}{value} is out of range: the model has {noun} "
                             f"(0 to {count - 1})")


def token_ids(text: str | Sequence[int], tokenizer: Any, config, *, what: str) -> list[int]:
    """Token ids of a text (through the tokenizer), or of a list / string of ids (no tokenizer)."""
    if not isinstance(text, str):
        ids = list(text)
    elif tokenizer is not None:
        ids = tokenizer.encode(text)
    else:
        if not re.fullmatch(r"[\s,]*\d+([\s,]+\d+)*[\s,]*", text):
            raise InputError(f"the model has no tokenizer: give the {what} as token ids separated by spaces, "
                             f"e.g. '5 17 42' (got {text[:40]!r})")
        ids = [int(t) for t in re.split(r"[\s,]+", text.strip(" \t\n,"))]
    if not ids:
        raise InputError(f"the {what} has no tokens")
    bad = next((i for i in ids if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < config.vocab_size),
               None)
    if bad is not None:
        raise InputError(f"token id {bad!r} in the {what} is outside [0, vocab_size={config.vocab_size})")
    return ids


def fit_tokens(ids: list[int], limit: int, why: str, *, truncate: bool, what: str,
               option: str = "truncate=True") -> list[int]:
    """ids, or their first `limit` with truncate; longer without it is an InputError saying why."""
    if len(ids) <= limit:
        return ids
    if truncate:
        return ids[:limit]
    raise InputError(f"the {what} is {len(ids)} tokens, longer than {why}; shorten it or pass {option} to keep "
                     f"the first {limit}")


def _target(model: nn.Module, source: list[int], target: str | Sequence[int] | None, tokenizer: Any, limit: int,
            why: str, truncate: bool, max_new_tokens: int) -> list[int]:
    """The decoder's input: its start token, then the given target or the model's greedy output."""
    from anatomy.inference.beam import greedy_search
    from anatomy.inference.engine import engine_for
    from anatomy.inference.engine.seq2seq import start_id
    from anatomy.inference.sampling import SamplingParams

    start = start_id(model.config)
    if target is not None:
        body = token_ids(target, tokenizer, model.config, what="target")
        if isinstance(target, str) and tokenizer is not None and body and body[0] == start:
            body = body[1:]
    else:
        eos = frozenset(tokenizer.eos_ids) if tokenizer is not None else frozenset(
            [model.config.eos_token_id] if model.config.eos_token_id is not None else [])
        steps = max(1, min(max_new_tokens, limit - 1))
        body = greedy_search(engine_for(model), source, SamplingParams(max_new_tokens=steps), eos_ids=eos).ids
    return fit_tokens([start, *body], limit, why, truncate=truncate, what="target")


def token_labels(ids: list[int], tokenizer: Any) -> list[str]:
    """Each token's text (ids as text when there is no tokenizer)."""
    if tokenizer is None:
        return [str(i) for i in ids]
    return [tokenizer.decode([i]) for i in ids]
