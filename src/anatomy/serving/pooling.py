"""Vectors for /v1/embeddings: a BERT-style encoder's (inference/embed.py), or the served decoder's own
final hidden states (after the final norm) pooled per input, as vLLM's pooling runner does:

    last   the hidden state of the input's last token (vLLM's default for decoders; Qwen3-Embedding)
    mean   the average over the input's tokens
Vectors are L2-normalised; `dimensions` keeps the first d values and normalises again (Matryoshka).
The decoder runs one full pass per batch of inputs (no KV cache), beside the serving loop's steps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from anatomy.errors import InputError
from anatomy.inference.embed import mean_pool, pad_right
from anatomy.serving.protocol import RequestError

POOLINGS = ("last", "mean")
BATCH = 16  # inputs per forward: sorted by length, each batch pads to little more than its longest


class DecoderPasses:
    """Full passes of the served decoder (engine.hidden_states) over lists of token ids."""

    def __init__(self, engine: Any, tokenizer: Any) -> None:
        if not hasattr(engine, "hidden_states"):
            raise InputError(f"pooling the served model needs a one-process engine, got {type(engine).__name__}")
        self.engine, self.tokenizer = engine, tokenizer
        self.context = engine.config.max_seq_len

    def check(self, batch: list[list[int]], *, param: str) -> None:
        """400 naming `param` for an empty input, a token id out of the vocabulary, or one past the context."""
        vocab = self.engine.config.vocab_size
        for i, ids in enumerate(batch):
            if not ids:
                raise RequestError(f"{param} {i} has no tokens", param=param)
            if len(ids) > self.context:
                raise RequestError(f"{param} {i} has {len(ids):,} tokens, more than the model's context of "
                                   f"{self.context:,}", param=param)
            bad = next((t for t in ids if not 0 <= t < vocab), None)
            if bad is not None:
                raise RequestError(f"{param} {i}: token id {bad} is not in [0, {vocab})", param=param)

    def pooled(self, batch: list[list[int]], pool: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
        """pool(hidden [b, S, D], mask [b, S]) of each batch of inputs, in the inputs' order -> [N, D']."""
        out: list[Tensor | None] = [None] * len(batch)
        longest_first = sorted(range(len(batch)), key=lambda i: -len(batch[i]))
        for start in range(0, len(batch), BATCH):
            rows = longest_first[start:start + BATCH]
            # right padding: a causal decoder's real positions never see the pads after them
            ids, mask = pad_right([batch[i] for i in rows], pad_id=0)
            hidden = self.engine.hidden_states(ids.to(self.engine.device)).float()  # [b, S, D]
            for row, vector in zip(rows, pool(hidden, mask.to(hidden.device))):
                out[row] = vector
        return torch.stack(out)

    def last_logits(self, batch: list[list[int]]) -> Tensor:
        """The logits [N, V] that follow each input's last token."""
        hidden = self.pooled(batch, last_token)  # [N, D]
        with torch.inference_mode():
            return self.engine.head(hidden.to(self.engine.dtype)).float()


def last_token(hidden: Tensor, mask: Tensor) -> Tensor:
    """hidden [B, S, D] at each row's last real position (mask [B, S]) -> [B, D]."""
    last = mask.sum(dim=1) - 1  # [B]
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


def decoder_embedder(engine: Any, tokenizer: Any, pooling: str) -> Callable[[list], tuple[Tensor, int]]:
    """inputs (texts, or lists of token ids) -> (unit vectors [N, D] of the decoder, tokens read)."""
    if pooling not in POOLINGS:
        raise InputError(f"--embedding-pooling {pooling!r} is not one of {', '.join(POOLINGS)}")
    passes = DecoderPasses(engine, tokenizer)
    pool = last_token if pooling == "last" else mean_pool

    def run(inputs: list) -> tuple[Tensor, int]:
        batch = [tokenizer.encode(x) if isinstance(x, str) else list(x) for x in inputs]
        passes.check(batch, param="input")
        return F.normalize(passes.pooled(batch, pool), dim=-1), sum(map(len, batch))

    return run


def encoder_embedder(name: str) -> Callable[[list], tuple[Tensor, int]]:
    """texts -> (unit vectors [N, D] of the encoder `name`, tokens read); token ids are refused."""
    from anatomy.inference.embed import embed, load_embedder

    _, tokenizer, max_length = load_embedder(name)

    def run(inputs: list) -> tuple[Tensor, int]:
        if not all(isinstance(x, str) for x in inputs):
            raise RequestError(f"input: token ids are embedded by a decoder (--embedding-model self); {name} "
                               "takes text", param="input")
        tokens = sum(len(ids) for ids in tokenizer.encode_batch(inputs, max_length=max_length))
        return embed(name, inputs), tokens

    return run


def matryoshka(vectors: Tensor, dimensions: int | None) -> Tensor:
    """The first `dimensions` values of each unit vector [N, D], normalised again (None: as they are)."""
    if dimensions is None:
        return vectors
    if not 1 <= dimensions <= vectors.shape[-1]:
        raise RequestError(f"dimensions={dimensions} must be in [1, {vectors.shape[-1]}] (the model's width)",
                           param="dimensions")
    return F.normalize(vectors[:, :dimensions], dim=-1)
