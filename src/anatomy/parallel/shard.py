"""One rank's shard of a decoder: the same DecoderLM classes over its slice of every tensor.

    shard = shard_model(model, place)      # place: the layout, this rank, its process groups (world.py)
    engine = DecoderEngine(shard)          # planned like any model: each local linear gets its kernels

The shard is built on the meta device from the rank's config (layout.local_config); its tensors are
the model's, cut (cuts.py) and put in place by assign_tensors, which checks every name and shape;
the parallel modules then go where the collectives are (layers.py, stages.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from anatomy.checkpoints.assign import assign_tensors, expected_shapes
from anatomy.config import ModelConfig
from anatomy.errors import InputError
from anatomy.layers.ffn import GLU, MLP
from anatomy.layers.moe import MoE
from anatomy.models import build_model
from anatomy.parallel.collectives import Comm
from anatomy.parallel.cuts import cut_format, cut_tensor, tensor_cuts
from anatomy.parallel.layers import ReducedMoE, RowParallelLinear, VocabParallelEmbedding, VocabParallelHead
from anatomy.parallel.layout import (Layout, check_layout, local_config, query_heads, shard_config, stage_holds,
                                     stage_layers, vocab_rows)
from anatomy.parallel.stages import LOGITS_TO_RANK_0, NoHead, ReceivedLogits, StageInput, StageOutput, boundary
from anatomy.weights.modules import compact_modules


@dataclass(frozen=True)
class Place:
    """A rank of a layout and the group of its stage's tensor-parallel ranks."""

    layout: Layout
    rank: int
    tp: Comm

    @property
    def stage(self) -> int:
        return self.layout.coords(self.rank)[0]

    @property
    def tp_rank(self) -> int:
        return self.layout.coords(self.rank)[1]

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.layout.pp - 1


def shard_model(model: nn.Module, place: Place) -> nn.Module:
    """The shard of `model` (a DecoderLM, left as it was) that rank `place.rank` runs."""
    config = model.config
    check_layout(config, place.layout)
    local = local_config(config, place.layout, place.rank)
    shell = _shell(place, config, dtype=model.stack.embed.dtype)
    tensors, compact = _tensors(model, shell, place)
    shape = shell.config
    shard = assign_tensors(shell, tensors, source=f"the shard of rank {place.rank}", compact=compact)
    shard.shape_config = shape  # the config of its tensors' shapes (a shape trace of what the rank computes)
    shard.runs_alone = False  # its forward needs the other ranks: the kernel plan's accuracy check cannot run it
    for module in shard.modules():  # the shell was built for the vocabulary shard's rows; the shard takes all ids
        if getattr(module, "config", None) is shell.config:
            module.config = local
    _slice_alibi(shard, model, place)
    layers = stage_layers(config.n_layers, place.layout.pp, place.stage)
    _parallel_modules(shard, place, model.stack.embed.dtype, layers)
    return shard.eval()


def _shell(place: Place, config: ModelConfig, *, dtype: torch.dtype) -> nn.Module:
    """The shard's structure on the meta device, its vocabulary the rows of the rank's shard."""
    return build_model(shard_config(config, place.layout, place.rank), device="meta", dtype=dtype)


def _tensors(model: nn.Module, shell: nn.Module, place: Place) -> tuple[dict[str, Tensor], dict[str, object]]:
    """(dense tensors, compact formats) by the shell's names: each the model's tensor under the full
    name, cut for this rank; the meta tensor itself for a part this stage does not hold."""
    layers = stage_layers(model.config.n_layers, place.layout.pp, place.stage)
    cuts = tensor_cuts(model, tp=place.layout.tp, tp_rank=place.tp_rank)
    full = model.state_dict()
    compact = compact_modules(model)
    held = _held(shell, place)
    tensors, formats = {}, {}
    for name in expected_shapes(shell):
        source = _full_name(name, layers)
        module = source.removesuffix(".weight")
        if not held(name):
            tensors[name] = shell.get_parameter(name) if _is_parameter(shell, name) else shell.get_buffer(name)
        elif source.endswith(".weight") and module in compact:
            fmt = compact[module].compact
            formats[name] = cut_format(fmt, cuts[source], label=source) if source in cuts else fmt
        elif source in compact:  # a mixture's compact experts: each rank's slice of them, dense
            stacked = compact[source].compact.dequantize(model.stack.embed.dtype)
            tensors[name] = cut_tensor(stacked, cuts[source]) if source in cuts else stacked
        else:
            tensors[name] = cut_tensor(full[source], cuts[source]) if source in cuts else full[source]
    return tensors, formats


def _held(shell: nn.Module, place: Place):
    """Does this stage hold the tensor `name` (else another stage's modules stand in for it)?"""
    tied = shell.config.tie_embeddings
    return lambda name: stage_holds(name, first=place.first, last=place.last, tied=tied)


def _is_parameter(module: nn.Module, name: str) -> bool:
    return name in dict(module.named_parameters())


def _full_name(name: str, layers: range) -> str:
    """A shard name -> the whole model's: block j of the stage is block layers[j]."""
    if not name.startswith("stack.blocks."):
        return name
    _, _, j, rest = name.split(".", 3)
    return f"stack.blocks.{layers[int(j)]}.{rest}"


def _slice_alibi(shard: nn.Module, model: nn.Module, place: Place) -> None:
    """ALiBi's slopes are per query head: the shard keeps its heads' (the shell computed them for H / N heads)."""
    slopes = model.stack.position_rules.slopes
    if slopes is not None:
        heads = query_heads(model.config, place.layout.tp, place.tp_rank)
        shard.stack.position_rules.slopes = slopes[heads.start:heads.stop].clone()


# -- the parallel modules ------------------------------------------------------------------------

def _parallel_modules(shard: nn.Module, place: Place, dtype: torch.dtype, layers: range) -> None:
    """The collectives put in: row-parallel projections, a reduced mixture, the vocabulary's table and
    head (tensor parallelism); the stage modules where this stage holds no embeddings, final norm or
    head (pipeline parallelism)."""
    layout = place.layout
    if layout.tp > 1:
        _tensor_parallel(shard, place, dtype, layers)
    if not place.first:
        shard.stack.embed = StageInput(src=layout.rank(place.stage - 1, place.tp_rank), d_model=shard.config.d_model,
                                       dtype=dtype, where=boundary(place.stage - 1))
    if not place.last:
        shard.stack.final_norm = StageOutput(dst=layout.rank(place.stage + 1, place.tp_rank),
                                             where=boundary(place.stage))
    shard.lm_head = _head(shard, place, dtype)


def _tensor_parallel(shard: nn.Module, place: Place, dtype: torch.dtype, layers: range) -> None:
    """The collectives are named by the whole model's block numbers (the communication model's)."""
    comm = place.tp
    for j, block in zip(layers, shard.stack.blocks):
        prefix = f"stack.blocks.{j}"
        block.attn.out = _row_parallel(block.attn.out, comm, f"{prefix}.attn.out", dtype)
        if isinstance(block.ffn, MoE):
            if block.ffn.shared is not None and comm.index != 0:
                _drop_bias(_down(block.ffn.shared))  # the shared expert's bias is added by one rank only
            block.ffn = ReducedMoE(block.ffn, comm=comm, where=f"{prefix}.ffn")
        else:
            block.ffn.down = _row_parallel(_down(block.ffn), comm, f"{prefix}.ffn.down", dtype)
    if place.first:
        rows, _ = vocab_rows(shard.config.vocab_size, place.layout.tp, place.tp_rank)
        shard.stack.embed.tokens = VocabParallelEmbedding(shard.stack.embed.tokens, rows=rows, comm=comm,
                                                          where="stack.embed.tokens")


def _head(shard: nn.Module, place: Place, dtype: torch.dtype) -> nn.Module:
    layout = place.layout
    if place.last:
        to = 0 if place.rank != 0 and place.tp_rank == 0 else None  # the driver, global rank 0, needs the logits
        return VocabParallelHead(shard.lm_head, vocab_size=shard.config.vocab_size, comm=place.tp, where="lm_head",
                                 to=to, to_where=LOGITS_TO_RANK_0)
    if place.rank == 0:
        return ReceivedLogits(src=layout.rank(layout.pp - 1, 0), vocab_size=shard.config.vocab_size, dtype=dtype,
                              where=LOGITS_TO_RANK_0)
    return NoHead()


def _row_parallel(module: nn.Module, comm: Comm, where: str, dtype: torch.dtype) -> RowParallelLinear:
    bias = module.bias
    _drop_bias(module)
    return RowParallelLinear(module, bias=bias, comm=comm, where=where, dtype=dtype)


def _drop_bias(module: nn.Module) -> None:
    if module.bias is not None:
        module.bias = None


def _down(ffn: nn.Module) -> nn.Module:
    if isinstance(ffn, (GLU, MLP)):
        return ffn.down
    raise InputError(f"no tensor-parallel rule for the FFN {type(ffn).__name__}")

