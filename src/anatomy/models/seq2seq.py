"""The original encoder-decoder Transformer (Vaswani et al. 2017; Marian is the same shape):
shared embeddings, an encoder stack, a decoder stack with cross-attention, a tied output layer."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor, nn

from anatomy.config import ModelConfig
from anatomy.errors import InputError
from anatomy.layers import Block, make_norm
from anatomy.layers.attention import LayerCache
from anatomy.models.context import PositionContext
from anatomy.models.embedding import Embeddings, check_input_ids, check_positions


class EncoderDecoder(nn.Module):
    """model(src_ids [B, S_src], tgt_ids [B, S_tgt], src_mask [B, S_src]) -> logits [B, S_tgt, V]."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if not config.is_seq2seq:
            raise ValueError(f"EncoderDecoder needs architecture='encoder-decoder', got {config.architecture!r}")
        self.config = config
        self.shared = nn.Embedding(config.vocab_size, config.d_model)
        self.src_embed = Embeddings(config, tokens=self.shared)
        self.tgt_embed = Embeddings(config, tokens=self.shared)
        self.encoder_context = PositionContext(config, causal=False)
        self.decoder_context = PositionContext(config, causal=True)
        self.encoder_blocks = nn.ModuleList(Block(config, causal=False) for _ in range(config.n_layers))
        self.decoder_blocks = nn.ModuleList(
            Block(config, causal=True, cross=True) for _ in range(config.n_decoder_layers))
        self.encoder_norm = make_norm(config) if config.final_norm else nn.Identity()
        self.decoder_norm = make_norm(config) if config.final_norm else nn.Identity()
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=config.lm_head_bias)
        if config.tie_embeddings:
            self.lm_head.weight = self.shared.weight

    def forward(self, src_ids: Tensor, tgt_ids: Tensor, src_mask: Tensor | None = None,
                tgt_mask: Tensor | None = None) -> Tensor:
        if src_ids.dim() == 2 and tgt_ids.dim() == 2 and src_ids.shape[0] != tgt_ids.shape[0]:
            raise InputError(f"batch sizes differ: src_ids has {src_ids.shape[0]} rows, tgt_ids {tgt_ids.shape[0]}")
        memory = self.encode(src_ids, src_mask)
        return self.decode(tgt_ids, memory, src_mask=src_mask, tgt_mask=tgt_mask)

    def encode(self, src_ids: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """src_ids [B, S_src] -> memory [B, S_src, D]."""
        check_input_ids(src_ids, self.config, name="src_ids")
        if src_mask is not None and src_mask.shape != src_ids.shape:
            raise InputError(f"src_mask has shape {tuple(src_mask.shape)}, src_ids has {tuple(src_ids.shape)}")
        B, S = src_ids.shape
        slots = torch.arange(S, device=src_ids.device)
        position_ids = slots[None].expand(B, S)
        check_positions(position_ids, self.config)
        ctx = self.encoder_context(position_ids, q_slots=slots, k_slots=slots, key_valid=src_mask)
        x = self.src_embed(src_ids, position_ids)
        for block in self.encoder_blocks:
            x = block(x, **ctx)
        return self.encoder_norm(x)

    def memory_kv(self, memory: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Each decoder layer's cross-attention keys and values of memory, computed once."""
        return [block.cross_attn.project_memory(memory) for block in self.decoder_blocks]

    def decode(
        self,
        tgt_ids: Tensor,
        memory: Tensor | None = None,
        *,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        memory_kv: Sequence[tuple[Tensor, Tensor]] | None = None,
        cache: Sequence[LayerCache] | None = None,
        input_pos: Tensor | None = None,
        last_only: bool = False,
    ) -> Tensor:
        """tgt_ids [B, S_tgt] against memory [B, S_src, D] (or its precomputed memory_kv) -> logits."""
        check_input_ids(tgt_ids, self.config, name="tgt_ids")
        if memory_kv is None:
            if memory is None:
                raise ValueError("decode needs memory (the encoder output) or memory_kv")
            memory_kv = self.memory_kv(memory)
        B, S = tgt_ids.shape
        if memory_kv[0][0].shape[0] != B:
            raise InputError(f"batch sizes differ: tgt_ids has {B} rows, the encoder output {memory_kv[0][0].shape[0]}")
        if cache is None:
            q_slots = k_slots = torch.arange(S, device=tgt_ids.device)
        else:
            q_slots, k_slots = input_pos, torch.arange(cache[0].max_len, device=tgt_ids.device)
        position_ids = q_slots[None].expand(B, S)
        check_positions(position_ids, self.config)
        ctx = self.decoder_context(position_ids, q_slots=q_slots, k_slots=k_slots, key_valid=tgt_mask,
                                   explicit=cache is not None)
        memory_mask = src_mask.bool()[:, None, None, :] if src_mask is not None else None  # [B, 1, 1, S_src]
        x = self.tgt_embed(tgt_ids, position_ids)
        for i, block in enumerate(self.decoder_blocks):
            x = block(x, **ctx, cache=cache[i] if cache is not None else None, input_pos=input_pos,
                      memory_kv=memory_kv[i], memory_mask=memory_mask)
        x = self.decoder_norm(x)
        if last_only:
            x = x[:, -1:]
        return self.lm_head(x)  # [B, S_tgt, V]
