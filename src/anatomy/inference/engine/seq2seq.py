"""Seq2SeqEngine: an encoder-decoder model's source encoded once, then decoder steps over a KV cache.

    engine = Seq2SeqEngine(model)                       # or anatomy.engine_for(model)
    run = engine.start(source_ids, rows=K, max_new_tokens=N)
    logprobs = run.step(tokens, slot)                   # tokens [K] at target slot -> [K, V] log-probabilities
    run.reorder(parents)                                # beam search: each row continues from its parent's cache

Each decoder layer's cross-attention keys and values of the source are projected once (`memory_kv`)
and reused at every step, next to the causal self-attention cache of the K target rows: a KVCache,
the paged cache with one block table per row (`reorder` copies each parent's blocks).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from anatomy.errors import InputError
from anatomy.inference.engine.kv_cache import KVCache
from anatomy.inference.engine.view import engine_view


class Seq2SeqEngine:
    """Runs an EncoderDecoder on its own view (the caller's model is never changed); `attention`
    ("sdpa" or "eager") sets the backend of the view's attention layers."""

    def __init__(self, model: nn.Module, *, attention: str | None = None) -> None:
        if not getattr(getattr(model, "config", None), "is_seq2seq", False):
            raise InputError(f"Seq2SeqEngine needs an encoder-decoder anatomy model, got {type(model).__name__}")
        self.model = engine_view(model, attention=attention)

    @property
    def config(self):
        return self.model.config

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def start(self, source: list[int], *, rows: int, max_new_tokens: int) -> Seq2SeqRun:
        return Seq2SeqRun(self, source, rows=rows, max_new_tokens=max_new_tokens)


class Seq2SeqRun:
    """The source encoded once and a decoder step over the self-attention cache of `rows` targets."""

    @torch.inference_mode()
    def __init__(self, engine: Seq2SeqEngine, source: list[int], *, rows: int, max_new_tokens: int) -> None:
        model = self.model = engine.model
        src = torch.tensor([source], dtype=torch.long, device=engine.device)  # [1, S_src]
        memory = model.encode(src)  # [1, S_src, D]
        self.memory_kv = [(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1))
                          for k, v in model.memory_kv(memory)]  # L x 2 x [rows, H_kv, S_src, d_h]
        dtype = next(model.parameters()).dtype
        self.cache = KVCache(model.config, batch=rows, max_len=max_new_tokens, dtype=dtype, device=src.device)
        self.start_id = start_id(model.config)

    @torch.inference_mode()
    def step(self, tokens: Tensor, slot: int) -> Tensor:
        """tokens [rows] at target slot `slot` -> log-probabilities of the next token [rows, V]."""
        input_pos = torch.tensor([slot], device=tokens.device)
        logits = self.model.decode(tokens[:, None], memory_kv=self.memory_kv, cache=self.cache,
                                   input_pos=input_pos, last_only=True)  # [rows, 1, V]
        return logits[:, -1].float().log_softmax(dim=-1)

    def reorder(self, rows: Tensor) -> None:
        """Keep rows `rows` [K] of the target cache (each beam continues from its parent's)."""
        self.cache.reorder(rows)


def start_id(config) -> int:
    """The token a target starts with: decoder_start_token_id, else BOS, else PAD."""
    for value in (config.decoder_start_token_id, config.bos_token_id, config.pad_token_id):
        if value is not None:
            return value
    raise InputError("the model config names no decoder_start_token_id, bos_token_id or pad_token_id "
                     "to start the target with")
