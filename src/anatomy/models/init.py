"""Weight initialisation per family, so that a freshly built model trains.

- decoder (GPT-2): N(0, 0.02) everywhere, residual output projections N(0, 0.02/sqrt(2L));
- encoder (BERT): N(0, 0.02), biases zero;
- encoder-decoder (Vaswani et al.): Xavier uniform for matrices, embeddings N(0, D^-1/2).
A tied output layer is the embedding matrix: it keeps the embedding's initialisation.
Norm weights start at one (zero where they are offsets from one, norm_unit_offset) and biases at
zero in every family; stacked expert weights are initialised like the linears they stand for.
"""

from __future__ import annotations

import math

from torch import nn

from anatomy.config import ModelConfig
from anatomy.layers.moe import MoE


def init_weights(model: nn.Module, config: ModelConfig) -> None:
    embedding_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            tied = id(module.weight) in embedding_weights  # a tied output layer keeps the embedding's init
            _init_linear(name, module, config, tied=tied)
        elif isinstance(module, nn.Embedding):
            std = config.d_model ** -0.5 if config.is_seq2seq else 0.02
            nn.init.normal_(module.weight, std=std)
        elif isinstance(module, MoE):
            nn.init.normal_(module.gate_up, std=0.02)
            nn.init.normal_(module.down, std=0.02 / math.sqrt(2 * config.n_layers))
        elif hasattr(module, "weight") and name.split(".")[-1].endswith("norm"):
            (nn.init.zeros_ if getattr(module, "unit_offset", False) else nn.init.ones_)(module.weight)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
    for name, param in model.named_parameters():
        if name.endswith("positions.weight"):
            nn.init.normal_(param, std=0.02)


def _init_linear(name: str, module: nn.Linear, config: ModelConfig, *, tied: bool) -> None:
    if module.bias is not None:
        nn.init.zeros_(module.bias)
    if tied:
        return
    if config.is_seq2seq:
        nn.init.xavier_uniform_(module.weight)
        return
    residual = config.is_decoder and (name.endswith("attn.out") or name.endswith("ffn.down"))
    nn.init.normal_(module.weight, std=0.02 / math.sqrt(2 * config.n_layers) if residual else 0.02)
