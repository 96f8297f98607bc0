"""The modules a tensor-parallel shard has where a whole model has a row-parallel linear layer, a token
table, a mixture of experts or an LM head (a column-parallel one, attn.qkv or the FFN's gate_up or up,
is the local linear itself). Each holds its local part as an ordinary module, so the engine plans its
kernels like any other layer's, and issues the collective that makes the part whole:

    RowParallelLinear     y = all_reduce(x_r @ W_r^T) + b        x_r [..., K/N] the rank's inputs; b added once
    ReducedMoE            y = all_reduce(the rank's slice of every expert (+ shared expert))
    VocabParallelEmbedding x = all_reduce(rows of the rank's vocabulary shard, zeros for the others)
    VocabParallelHead     logits = gather(x @ W_r^T) along V on the group's first rank (cut to V)
"""

from __future__ import annotations

from torch import Tensor, nn

from anatomy.parallel.collectives import Comm, communicating, send


class RowParallelLinear(nn.Module):
    """The output projection or FFN down projection of a shard: the local columns' product, summed over the ranks.
    The partial sums are added in `dtype` (the residual stream's), the same on every rank whatever kernels
    each rank's plan chose."""

    communicates = True

    def __init__(self, local: nn.Module, *, bias: Tensor | None, comm: Comm, where: str, dtype) -> None:
        super().__init__()
        self.local, self.comm, self.where, self.dtype = local, comm, where, dtype
        self.in_features, self.out_features = local.in_features, local.out_features
        self.bias = nn.Parameter(bias.detach(), requires_grad=False) if bias is not None else None

    def forward(self, x: Tensor) -> Tensor:
        y = self.local(x)  # [..., D]: this rank's part of the sum
        with communicating():  # the sum, and the bias added once after it
            y = self.comm.all_reduce(y.to(self.dtype).contiguous(), where=self.where)
            return y + self.bias.to(y.dtype) if self.bias is not None else y

    def extra_repr(self) -> str:
        return f"all-reduce over {self.comm.size} ranks in {self.dtype}"


class ReducedMoE(nn.Module):
    """A mixture whose experts each hold the rank's d_ff_expert / N columns: its output summed over the ranks."""

    communicates = True

    def __init__(self, moe: nn.Module, *, comm: Comm, where: str) -> None:
        super().__init__()
        self.moe, self.comm, self.where = moe, comm, where

    def forward(self, x: Tensor, router_logits: list[Tensor] | None = None) -> Tensor:
        y = self.moe(x, router_logits).contiguous()  # [B, S, D]
        return self.comm.all_reduce(y, where=self.where)


class VocabParallelEmbedding(nn.Module):
    """The rows [start, start + count) of the token table; an id outside them contributes zeros."""

    communicates = True

    def __init__(self, local: nn.Module, *, rows: range, comm: Comm, where: str) -> None:
        super().__init__()
        self.local, self.comm, self.where = local, comm, where
        self.start, self.count = rows.start, len(rows)

    @property
    def dtype(self):
        """The vectors' dtype (models/embedding.py reads it)."""
        local = self.local
        return local.dtype if hasattr(local, "compact") else local.weight.dtype

    def forward(self, ids: Tensor) -> Tensor:
        local = ids - self.start  # [B, S]
        hit = (local >= 0) & (local < self.count)
        x = self.local(local.where(hit, 0))  # [B, S, D]
        x = x.masked_fill(~hit[..., None], 0).contiguous()
        return self.comm.all_reduce(x, where=self.where)


class VocabParallelHead(nn.Module):
    """The LM head's rows of the rank's vocabulary shard; the logits [..., V] come whole on the group's
    first rank (and are sent on to global rank `to` when the driver is elsewhere: pipeline stages)."""

    communicates = True

    def __init__(self, local: nn.Module, *, vocab_size: int, comm: Comm, where: str, to: int | None = None,
                 to_where: str = "") -> None:
        super().__init__()
        self.local, self.comm, self.where = local, comm, where
        self.vocab_size, self.to, self.to_where = vocab_size, to, to_where
        self.in_features, self.out_features = local.in_features, vocab_size

    def forward(self, hidden: Tensor) -> Tensor:
        local = self.local(hidden)  # [..., V_r]
        with communicating():
            logits = self.comm.gather_last(local, where=self.where)  # [..., N * V_r] on the group's first rank
            if self.comm.index != 0:
                return logits  # this rank's shard: only the first rank's logits are used
            logits = logits[..., :self.vocab_size]  # [..., V]: the padding rows' logits cut off
            if self.to is not None:
                send(logits, self.to, where=self.to_where)
            return logits
