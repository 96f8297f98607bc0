"""Decoder-only language models (GPT-2, LLaMA and anything between): a causal Stack and the LM head."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor, nn

from anatomy.config import ModelConfig
from anatomy.errors import ConfigError
from anatomy.layers.attention import LayerCache
from anatomy.models.stack import Stack


class DecoderLM(nn.Module):
    """model(input_ids [B, S]) -> logits [B, S, V].

    With a KV cache, input_pos [S] names the cache slots the new tokens are written to, and
    attention_mask [B, T] marks which cache slots hold real tokens (left padding).
    """

    def __init__(self, config: ModelConfig, *, backend: str = "sdpa") -> None:
        super().__init__()
        if not config.is_decoder:
            raise ConfigError(f"DecoderLM needs architecture='decoder', got {config.architecture!r}")
        self.config = config
        self.stack = Stack(config, causal=True, n_layers=config.n_layers, backend=backend)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=config.lm_head_bias)
        if config.tie_embeddings:
            self.lm_head.weight = self.token_embedding.weight

    @property
    def token_embedding(self) -> nn.Embedding:
        return self.stack.embed.tokens

    def forward(
        self,
        input_ids: Tensor,
        *,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        cache: Sequence[LayerCache] | None = None,
        input_pos: Tensor | None = None,
        last_only: bool = False,
        weights: list[Tensor] | None = None,
        router_logits: list[Tensor] | None = None,
    ) -> Tensor:
        """`last_only` computes the logits of the last position only (generation needs no others);
        a `weights` list receives each block's attention weights [B, H, S, S_k], a `router_logits`
        list each mixture-of-experts layer's router logits [B*S, E] (for the load-balancing loss)."""
        x = self.stack(input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                       input_pos=input_pos, weights=weights, router_logits=router_logits)  # [B, S, D]
        if last_only:
            x = x[:, -1:]
        return self.logits(x)  # [B, S, V]

    def logits(self, hidden: Tensor) -> Tensor:
        """Final hidden states [..., D] -> logits [..., V]: the LM head, then the soft cap
        cap * tanh(logits / cap) when the config has one (Gemma 2). Every path that makes logits
        (this forward, the engine's steps, NLL) calls this one."""
        logits = self.lm_head(hidden)
        cap = self.config.logit_softcap
        return torch.tanh(logits / cap) * cap if cap is not None else logits
