"""The input end of every model: token ids -> vectors, with positions, segments, scale and norm."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from anatomy.config import ModelConfig
from anatomy.errors import InputError
from anatomy.layers import LearnedPositions, SinusoidalPositions, make_norm


class Embeddings(nn.Module):
    """tokens(ids) * scale + positions(pos) + token_types(segment), then norm and dropout."""

    def __init__(self, config: ModelConfig, *, tokens: nn.Embedding | None = None) -> None:
        super().__init__()
        self.config = config
        self.tokens = tokens if tokens is not None else nn.Embedding(config.vocab_size, config.d_model)
        self.scale = math.sqrt(config.d_model) if config.embedding_scale else 1.0
        position_tables = {"learned": LearnedPositions, "sinusoidal": SinusoidalPositions}
        table = position_tables.get(config.position)
        self.positions = table(config) if table else None
        self.token_types = nn.Embedding(config.type_vocab_size, config.d_model) if config.type_vocab_size else None
        self.norm = make_norm(config) if config.embedding_norm else None

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the vectors this produces (the activations' dtype): the token table's, or
        the output dtype of a table that says its own (a compact one, weights/modules.py; a
        vocabulary-parallel one, parallel/layers.py)."""
        table = self.tokens
        return table.dtype if isinstance(getattr(table, "dtype", None), torch.dtype) else table.weight.dtype

    def forward(self, input_ids: Tensor, position_ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        x = self.tokens(input_ids)  # [B, S] -> [B, S, D]
        if self.scale != 1.0:
            x = x * self.scale
        if self.positions is not None:
            x = x + self.positions(position_ids)
        if self.token_types is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            x = x + self.token_types(token_type_ids)
        if self.norm is not None:
            x = self.norm(x)
        return F.dropout(x, self.config.dropout, self.training) if self.config.dropout else x


def check_input_ids(input_ids: Tensor, config: ModelConfig, *, name: str = "input_ids") -> None:
    """Token ids must be a 2-D integer tensor with values in [0, vocab_size), no longer than the
    position table allows."""
    if input_ids.dim() != 2 or input_ids.dtype.is_floating_point:
        raise InputError(f"{name} must be an integer tensor [B, S], got {tuple(input_ids.shape)} {input_ids.dtype}")
    if input_ids.shape[1] == 0:
        raise InputError(f"{name} is empty: sequences need at least one token")
    if torch.compiler.is_compiling() or input_ids.is_meta:  # meta tensors hold no values to check
        return
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= config.vocab_size:
        bad = low if low < 0 else high
        raise InputError(f"{name} holds token id {bad}, outside [0, vocab_size={config.vocab_size})")


def check_positions(position_ids: Tensor, config: ModelConfig) -> None:
    """Learned and sinusoidal tables end at max_seq_len: a later position has no vector."""
    if config.position not in ("learned", "sinusoidal") or torch.compiler.is_compiling() or position_ids.is_meta:
        return
    last = int(position_ids.max())
    if last >= config.max_seq_len:
        raise InputError(
            f"position {last} is past max_seq_len={config.max_seq_len} "
            f"(position={config.position!r} has a table of max_seq_len entries)")
