"""Encoder-only models (BERT): bidirectional blocks over token, position and segment
embeddings; MaskedLM adds the masked-language-model head."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from anatomy.config import ModelConfig
from anatomy.layers import Block, make_norm
from anatomy.layers.ffn import ACTIVATIONS
from anatomy.models.context import PositionContext
from anatomy.models.embedding import Embeddings, check_input_ids, check_positions
from anatomy.errors import InputError


class Encoder(nn.Module):
    """model(input_ids [B, S], attention_mask [B, S], token_type_ids [B, S]) -> hidden [B, S, D]."""

    def __init__(self, config: ModelConfig, *, pooler: bool | None = None) -> None:
        super().__init__()
        if not config.is_encoder:
            raise ValueError(f"Encoder needs architecture='encoder', got {config.architecture!r}")
        self.config = config
        self.embed = Embeddings(config)
        self.context = PositionContext(config, causal=False)
        self.blocks = nn.ModuleList(Block(config, causal=False) for _ in range(config.n_layers))
        self.final_norm = make_norm(config) if config.final_norm else nn.Identity()
        with_pooler = config.pooler if pooler is None else pooler
        self.pooler = nn.Linear(config.d_model, config.d_model) if with_pooler else None

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None) -> Tensor:
        check_input_ids(input_ids, self.config)
        B, S = input_ids.shape
        _check_same_shape(input_ids, attention_mask, "attention_mask")
        _check_same_shape(input_ids, token_type_ids, "token_type_ids")
        if token_type_ids is not None and self.embed.token_types is not None:
            check_input_ids(token_type_ids, self.config.replace(vocab_size=self.config.type_vocab_size),
                            name="token_type_ids")
        slots = torch.arange(S, device=input_ids.device)
        position_ids = slots[None].expand(B, S)
        check_positions(position_ids, self.config)
        ctx = self.context(position_ids, q_slots=slots, k_slots=slots, key_valid=attention_mask)
        x = self.embed(input_ids, position_ids, token_type_ids)  # [B, S, D]
        for block in self.blocks:
            x = block(x, **ctx)
        return self.final_norm(x)

    def pool(self, hidden: Tensor) -> Tensor:
        """BERT's pooler: tanh(dense(hidden of the first token)) [B, D]."""
        if self.pooler is None:
            raise ValueError("this encoder was built without a pooler (config.pooler=False)")
        return torch.tanh(self.pooler(hidden[:, 0]))


class MaskedLM(nn.Module):
    """Encoder + MLM head: dense -> activation -> norm -> tied decoder + bias. Returns logits [B, S, V]."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = Encoder(config, pooler=False)
        self.transform = nn.Linear(config.d_model, config.d_model)
        self.act = ACTIVATIONS[config.activation]
        self.transform_norm = make_norm(config)
        self.decoder = nn.Linear(config.d_model, config.vocab_size, bias=True)
        if config.tie_embeddings:
            self.decoder.weight = self.encoder.embed.tokens.weight

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None) -> Tensor:
        hidden = self.encoder(input_ids, attention_mask, token_type_ids)  # [B, S, D]
        return self.decoder(self.transform_norm(self.act(self.transform(hidden))))  # [B, S, V]


def _check_same_shape(input_ids: Tensor, other: Tensor | None, name: str) -> None:
    if other is not None and other.shape != input_ids.shape:
        raise InputError(f"{name} has shape {tuple(other.shape)}, input_ids has {tuple(input_ids.shape)}")
