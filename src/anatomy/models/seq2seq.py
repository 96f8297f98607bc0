"""The original encoder-decoder Transformer (Vaswani et al. 2017; Marian is the same shape):
shared embeddings, an encoder Stack, a decoder Stack with cross-attention, a tied output layer."""

from __future__ import annotations

from typing import Sequence

from torch import Tensor, nn

from anatomy.config import ModelConfig
from anatomy.errors import ConfigError, InputError
from anatomy.layers.attention import LayerCache
from anatomy.models.stack import Stack


class EncoderDecoder(nn.Module):
    """model(src_ids [B, S_src], tgt_ids [B, S_tgt], src_mask [B, S_src]) -> logits [B, S_tgt, V]."""

    def __init__(self, config: ModelConfig, *, backend: str = "sdpa") -> None:
        super().__init__()
        if not config.is_seq2seq:
            raise ConfigError(f"EncoderDecoder needs architecture='encoder-decoder', got {config.architecture!r}")
        self.config = config
        self.shared = nn.Embedding(config.vocab_size, config.d_model)
        self.encoder = Stack(config, causal=False, n_layers=config.n_layers, tokens=self.shared, backend=backend,
                             names=("src_ids", "src_mask"))
        self.decoder = Stack(config, causal=True, n_layers=config.n_decoder_layers, cross=True, tokens=self.shared,
                             backend=backend, names=("tgt_ids", "tgt_mask"))
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=config.lm_head_bias)
        if config.tie_embeddings:
            self.lm_head.weight = self.shared.weight

    @property
    def token_embedding(self) -> nn.Embedding:
        return self.shared

    def forward(self, src_ids: Tensor, tgt_ids: Tensor, src_mask: Tensor | None = None,
                tgt_mask: Tensor | None = None) -> Tensor:
        if src_ids.dim() == 2 and tgt_ids.dim() == 2 and src_ids.shape[0] != tgt_ids.shape[0]:
            raise InputError(f"batch sizes differ: src_ids has {src_ids.shape[0]} rows, tgt_ids {tgt_ids.shape[0]}")
        memory = self.encode(src_ids, src_mask)
        return self.decode(tgt_ids, memory, src_mask=src_mask, tgt_mask=tgt_mask)

    def encode(self, src_ids: Tensor, src_mask: Tensor | None = None, *,
               weights: list[Tensor] | None = None) -> Tensor:
        """src_ids [B, S_src] -> memory [B, S_src, D]."""
        return self.encoder(src_ids, attention_mask=src_mask, weights=weights)

    def memory_kv(self, memory: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Each decoder layer's cross-attention keys and values of memory, computed once."""
        return self.decoder.memory_kv(memory)

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
        weights: list[Tensor] | None = None,
    ) -> Tensor:
        """tgt_ids [B, S_tgt] against memory [B, S_src, D] (or its precomputed memory_kv) -> logits."""
        if memory_kv is None:
            if memory is None:
                raise InputError("decode needs memory (the encoder output) or memory_kv")
            memory_kv = self.memory_kv(memory)
        x = self.decoder(tgt_ids, attention_mask=tgt_mask, cache=cache, input_pos=input_pos, memory_kv=memory_kv,
                         memory_mask=src_mask, weights=weights)  # [B, S_tgt, D]
        if last_only:
            x = x[:, -1:]
        return self.lm_head(x)  # [B, S_tgt, V]
