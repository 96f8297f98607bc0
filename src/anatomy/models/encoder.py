"""Encoder-only models (BERT): a bidirectional Stack over token, position and segment embeddings;
MaskedLM adds the masked-language-model head."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from anatomy.config import ModelConfig
from anatomy.errors import ConfigError, InputError
from anatomy.layers import make_norm
from anatomy.layers.ffn import ACTIVATIONS
from anatomy.models.stack import Stack


class Encoder(nn.Module):
    """model(input_ids [B, S], attention_mask [B, S], token_type_ids [B, S]) -> hidden [B, S, D]."""

    def __init__(self, config: ModelConfig, *, pooler: bool | None = None, backend: str = "sdpa") -> None:
        super().__init__()
        if not config.is_encoder:
            raise ConfigError(f"Encoder needs architecture='encoder', got {config.architecture!r}")
        self.config = config
        self.stack = Stack(config, causal=False, n_layers=config.n_layers, backend=backend)
        with_pooler = config.pooler if pooler is None else pooler
        self.pooler = nn.Linear(config.d_model, config.d_model) if with_pooler else None

    @property
    def token_embedding(self) -> nn.Embedding:
        return self.stack.embed.tokens

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                *, weights: list[Tensor] | None = None) -> Tensor:
        return self.stack(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, weights=weights)

    def pool(self, hidden: Tensor) -> Tensor:
        """BERT's pooler: tanh(dense(hidden of the first token)) [B, D]."""
        if self.pooler is None:
            raise InputError("this encoder was built without a pooler (config.pooler=False)")
        return torch.tanh(self.pooler(hidden[:, 0]))


class MaskedLM(nn.Module):
    """Encoder + MLM head: dense -> activation -> norm -> tied decoder + bias. Returns logits [B, S, V]."""

    def __init__(self, config: ModelConfig, *, backend: str = "sdpa") -> None:
        super().__init__()
        self.config = config
        self.encoder = Encoder(config, pooler=False, backend=backend)
        self.transform = nn.Linear(config.d_model, config.d_model)
        self.act = ACTIVATIONS[config.activation]
        self.transform_norm = make_norm(config)
        self.decoder = nn.Linear(config.d_model, config.vocab_size, bias=True)
        if config.tie_embeddings:
            self.decoder.weight = self.token_embedding.weight

    @property
    def token_embedding(self) -> nn.Embedding:
        return self.encoder.token_embedding

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                *, weights: list[Tensor] | None = None) -> Tensor:
        hidden = self.encoder(input_ids, attention_mask, token_type_ids, weights=weights)  # [B, S, D]
        return self.decoder(self.transform_norm(self.act(self.transform(hidden))))  # [B, S, V]
