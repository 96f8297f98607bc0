"""Decoder-only language models (GPT-2, LLaMA and anything between): embeddings, L causal
blocks, a final norm and the LM head."""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor, nn

from anatomy.config import ModelConfig
from anatomy.layers import Block, make_norm
from anatomy.layers.attention import LayerCache
from anatomy.models.context import PositionContext
from anatomy.models.embedding import Embeddings, check_input_ids, check_positions


class DecoderLM(nn.Module):
    """model(input_ids [B, S]) -> logits [B, S, V].

    With a KV cache, input_pos [S] names the cache slots the new tokens are written to, and
    attention_mask [B, T] marks which cache slots hold real tokens (left padding).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if not config.is_decoder:
            raise ValueError(f"DecoderLM needs architecture='decoder', got {config.architecture!r}")
        self.config = config
        self.embed = Embeddings(config)
        self.context = PositionContext(config, causal=True)
        self.blocks = nn.ModuleList(Block(config, causal=True) for _ in range(config.n_layers))
        self.final_norm = make_norm(config) if config.final_norm else nn.Identity()
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=config.lm_head_bias)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.tokens.weight

    def forward(
        self,
        input_ids: Tensor,
        *,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        cache: Sequence[LayerCache] | None = None,
        input_pos: Tensor | None = None,
        last_only: bool = False,
    ) -> Tensor:
        x = self.hidden_states(input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               cache=cache, input_pos=input_pos)
        if last_only:
            x = x[:, -1:]  # generation needs only the last position's logits
        return self.lm_head(x)  # [B, S, D] -> [B, S, V]

    def hidden_states(
        self,
        input_ids: Tensor,
        *,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        cache: Sequence[LayerCache] | None = None,
        input_pos: Tensor | None = None,
    ) -> Tensor:
        """The final-normed hidden states [B, S, D] (before the LM head)."""
        check_input_ids(input_ids, self.config)
        ctx = self._context(input_ids, attention_mask, position_ids, cache, input_pos)
        x = self.embed(input_ids, ctx.pop("position_ids"))  # [B, S, D]
        for i, block in enumerate(self.blocks):
            x = block(x, **ctx, cache=cache[i] if cache is not None else None, input_pos=input_pos)
        return self.final_norm(x)

    def _context(self, input_ids: Tensor, attention_mask: Tensor | None, position_ids: Tensor | None,
                 cache: Sequence[LayerCache] | None, input_pos: Tensor | None) -> dict[str, Any]:
        B, S = input_ids.shape
        device = input_ids.device
        if cache is None:
            q_slots = k_slots = torch.arange(S, device=device)
        else:
            if input_pos is None:
                raise ValueError("a KV cache needs input_pos, the cache slots of the new tokens")
            q_slots, k_slots = input_pos, torch.arange(cache[0].max_len, device=device)
        if position_ids is None:
            position_ids = q_slots[None].expand(B, S)
        check_positions(position_ids, self.config)
        ctx = self.context(position_ids, q_slots=q_slots, k_slots=k_slots, key_valid=attention_mask,
                           explicit=cache is not None)
        ctx["position_ids"] = position_ids
        return ctx
