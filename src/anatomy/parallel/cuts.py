"""Which slice of each of a decoder's tensors one tensor-parallel rank keeps (layout.py has the rules).

    cuts = tensor_cuts(model, tp=2, tp_rank=0)     # {full parameter name: Cut}; a name not in it is replicated
    cut_tensor(t, cuts[name])                       # a dense tensor's slice (a copy: the full one can go)
    cut_format(fmt, cuts[name])                     # a compact weight's (int4/int8 groups cut along whole groups)

Heads, FFN columns, experts and vocabulary rows are cut as docs/parallel.md, "What each rank holds", says.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from anatomy.config import ModelConfig
from anatomy.layers.ffn import GLU, MLP
from anatomy.layers.moe import MoE
from anatomy.parallel.layout import columns, kv_heads, query_heads, vocab_rows
from anatomy.weights.formats import WeightFormat


@dataclass(frozen=True)
class Cut:
    """Keep `index` along `dim` (dim 0: rows of a matrix; the last dim: its columns, a contiguous range)."""

    dim: int
    index: tuple[int, ...] | range


def cut_tensor(t: Tensor, cut: Cut) -> Tensor:
    if isinstance(cut.index, range):
        return t.narrow(cut.dim, cut.index.start, len(cut.index)).clone(memory_format=torch.contiguous_format)
    return t.index_select(cut.dim, torch.tensor(cut.index, dtype=torch.long, device=t.device))


def cut_format(fmt: WeightFormat, cut: Cut, *, label: str) -> WeightFormat:
    if cut.dim == 0:
        out = fmt.take_rows(torch.tensor(list(cut.index), dtype=torch.long))
        out.label = label
        return out
    return fmt.take_columns(cut.index.start, cut.index.stop, label=label)


def tensor_cuts(model: nn.Module, *, tp: int, tp_rank: int) -> dict[str, Cut]:
    """{full parameter name (weights and biases, by the dense names): Cut} for one rank:

        attn.qkv   rows     the local query heads' rows, then the local kv heads' k rows and v rows
        attn.out   columns  the local query heads' d_h columns each (row-parallel: an all-reduce follows)
        GLU        gate_up rows of the local FFN columns (gate part and up part); down: those columns
        MLP        up rows; down columns
        MoE        every expert's gate_up [E, 2F_e, D] rows and down [E, D, F_e] columns alike; the router
                   is replicated; the shared expert is cut like a dense FFN
        vocabulary the token table's and the LM head's rows (and bias) of the rank's vocabulary shard
    """
    if tp == 1:
        return {}
    config = model.config
    out = _vocab_cuts(config, tp, tp_rank)
    for i, block in enumerate(model.stack.blocks):
        prefix = f"stack.blocks.{i}"
        qkv = _qkv_rows(config, tp, tp_rank)
        out |= {f"{prefix}.attn.qkv.weight": Cut(0, qkv), f"{prefix}.attn.qkv.bias": Cut(0, qkv),
                f"{prefix}.attn.out.weight": Cut(1, _head_columns(config, tp, tp_rank))}
        out |= _ffn_cuts(block.ffn, f"{prefix}.ffn", tp, tp_rank)
    return out


def _vocab_cuts(config: ModelConfig, tp: int, tp_rank: int) -> dict[str, Cut]:
    rows, per = vocab_rows(config.vocab_size, tp, tp_rank)
    padded = tuple(rows) + (config.vocab_size - 1,) * (per - len(rows))  # pads: copies of the last row
    return {name: Cut(0, padded) for name in ("stack.embed.tokens.weight", "lm_head.weight", "lm_head.bias")}


def _qkv_rows(config: ModelConfig, tp: int, tp_rank: int) -> tuple[int, ...]:
    d, H, H_kv = config.head_dim, config.n_heads, config.n_kv_heads
    heads = lambda first, hs: [first + h * d + j for h in hs for j in range(d)]  # noqa: E731
    kv = kv_heads(config, tp, tp_rank)
    return tuple(heads(0, query_heads(config, tp, tp_rank)) + heads(H * d, kv) + heads((H + H_kv) * d, kv))


def _head_columns(config: ModelConfig, tp: int, tp_rank: int) -> range:
    heads = query_heads(config, tp, tp_rank)
    return range(heads.start * config.head_dim, heads.stop * config.head_dim)


def _ffn_cuts(ffn: nn.Module, prefix: str, tp: int, tp_rank: int) -> dict[str, Cut]:
    """A dense FFN's, or a mixture's (each expert cut alike, the shared expert as a dense FFN)."""
    if isinstance(ffn, MoE):
        cols = columns(ffn.d_ff, tp, tp_rank)
        rows = tuple(cols) + tuple(ffn.d_ff + c for c in cols) if ffn.glu else tuple(cols)
        out = {f"{prefix}.gate_up": Cut(1, rows), f"{prefix}.down": Cut(2, cols)}
        if ffn.shared is not None:
            out |= _ffn_cuts(ffn.shared, f"{prefix}.shared", tp, tp_rank)
        return out
    if isinstance(ffn, GLU):
        cols = columns(ffn.d_ff, tp, tp_rank)
        rows = tuple(cols) + tuple(ffn.d_ff + c for c in cols)
        return {f"{prefix}.gate_up.weight": Cut(0, rows), f"{prefix}.gate_up.bias": Cut(0, rows),
                f"{prefix}.down.weight": Cut(1, cols)}
    if isinstance(ffn, MLP):
        cols = columns(ffn.up.out_features, tp, tp_rank)
        return {f"{prefix}.up.weight": Cut(0, cols), f"{prefix}.up.bias": Cut(0, cols),
                f"{prefix}.down.weight": Cut(1, cols)}
    raise TypeError(f"no tensor-parallel rule for the FFN {type(ffn).__name__} at {prefix}")
