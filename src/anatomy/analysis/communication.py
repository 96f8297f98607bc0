"""The collectives of one step of a tensor- and pipeline-parallel decoder, and what they cost on a link.

Tensor parallel: an all-reduce [B, S, D] after the token table, each block's attention output and
FFN down, and a gather of the LM head's vocabulary shards; pipeline parallel: a send [B, S, D] at
each stage boundary and of the logits to rank 0 (parallel/ issues exactly these; tests check it).
Each is timed by NCCL's alpha-beta model with a ring on a hardware.Interconnect. They sit on the
critical path of every step (nothing here overlaps them with compute), so they add to the
roofline's time. The list and the formulas: docs/parallel.md, "The anatomy of communication".
"""

from __future__ import annotations

from dataclasses import dataclass

from anatomy import dtypes
from anatomy.analysis.hardware import Interconnect
from anatomy.config import ModelConfig
from anatomy.parallel.layout import Layout, stage_layers, vocab_rows
from anatomy.parallel.stages import LOGITS_TO_RANK_0, boundary


@dataclass(frozen=True)
class Collective:
    """One collective of a step: `shape` is the tensor each taking part gives (a send: the sender)."""

    kind: str  # all_reduce, gather, send
    where: str  # the module (the whole model's names) or stage boundary
    role: str  # what it is, for grouping: "attention output", "FFN down", ...
    shape: tuple[int, ...]
    dtype: str
    ranks: tuple[int, ...]  # global ranks taking part; a send's are (src, dst)

    @property
    def message_bytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return dtypes.parse(self.dtype).nbytes(n)

    @property
    def wire_bytes(self) -> float:
        """Bytes the busiest rank moves in one direction."""
        N, M = len(self.ranks), self.message_bytes
        if self.kind == "all_reduce":
            return 2 * (N - 1) / N * M
        if self.kind == "gather":
            return (N - 1) * M
        return M

    def time_s(self, link: Interconnect) -> float:
        steps = {"all_reduce": 2 * (len(self.ranks) - 1), "gather": len(self.ranks) - 1}.get(self.kind, 1)
        return link.base_latency_s + steps * link.step_latency_s + self.wire_bytes / link.bandwidth


def step_collectives(config: ModelConfig, layout: Layout, *, batch: int, tokens: int, rows: tuple[int, ...],
                     dtype: str) -> list[Collective]:
    """Every collective of one step over `batch` rows of `tokens` new tokens, in the order issued;
    `rows` is the shape of the LM head's input before D ((B,) generating, (B, S) a full pass)."""
    out: list[Collective] = []
    x = (batch, tokens, config.d_model)
    for stage in range(layout.pp):
        group = tuple(layout.rank(stage, r) for r in range(layout.tp))
        if layout.tp > 1:
            out += _tensor_parallel(config, layout, stage, group, x, rows, dtype)
        if stage < layout.pp - 1:
            out += [Collective("send", boundary(stage), "stage boundary", x, dtype,
                               (layout.rank(stage, r), layout.rank(stage + 1, r))) for r in range(layout.tp)]
    if layout.pp > 1:
        out.append(Collective("send", LOGITS_TO_RANK_0, "logits to rank 0", (*rows, config.vocab_size), dtype,
                              (layout.rank(layout.pp - 1, 0), 0)))
    return out


def _tensor_parallel(config: ModelConfig, layout: Layout, stage: int, group: tuple[int, ...], x: tuple[int, ...],
                     rows: tuple[int, ...], dtype: str) -> list[Collective]:
    out = []
    if stage == 0:
        out.append(Collective("all_reduce", "stack.embed.tokens", "token table", x, dtype, group))
    for i in stage_layers(config.n_layers, layout.pp, stage):
        ffn = ("stack.blocks.{}.ffn", "mixture of experts") if config.layer_is_moe(i) else \
            ("stack.blocks.{}.ffn.down", "FFN down")
        out.append(Collective("all_reduce", f"stack.blocks.{i}.attn.out", "attention output", x, dtype, group))
        out.append(Collective("all_reduce", ffn[0].format(i), ffn[1], x, dtype, group))
    if stage == layout.pp - 1:
        _, per = vocab_rows(config.vocab_size, layout.tp, 0)
        out.append(Collective("gather", "lm_head", "LM head", (*rows, per), dtype, group))
    return out


def issued_by(ops: list[Collective], rank: int) -> list[tuple[str, str, tuple[int, ...], int]]:
    """(kind, where, shape, bytes) of each collective as rank `rank` issues it: a send is a "send" on
    its source and a "recv" on its destination."""
    out = []
    for op in ops:
        if rank not in op.ranks:
            continue
        kind = ("send" if rank == op.ranks[0] else "recv") if op.kind == "send" else op.kind
        out.append((kind, op.where, op.shape, op.message_bytes))
    return out


def by_role(ops: list[Collective], link: Interconnect | None, *, tokens: int) -> list[dict]:
    """The step's collectives grouped by role: count, shape, bytes (per op, per token), time."""
    groups: dict[tuple, list[Collective]] = {}
    for op in ops:
        groups.setdefault((op.role, op.kind, op.shape, len(op.ranks)), []).append(op)
    rows = []
    for (role, kind, shape, ranks), members in groups.items():
        first = members[0]
        concurrent = len({m.where for m in members})  # a stage boundary's sends go at once, one per tp rank
        row = {"role": role, "kind": kind, "count": concurrent, "shape": list(shape), "dtype": first.dtype,
               "ranks": ranks, "message_bytes": first.message_bytes, "wire_bytes": first.wire_bytes,
               "message_bytes_per_token": first.message_bytes / tokens}
        if link is not None:
            row["time_s"] = first.time_s(link)
            row["total_time_s"] = first.time_s(link) * concurrent
        rows.append(row)
    return rows


def step_time_s(ops: list[Collective], link: Interconnect) -> float:
    """The communication on a step's critical path: every collective one after another (the
    concurrent sends of one stage boundary, one per tp rank, count once)."""
    seen: dict[str, float] = {}
    for op in ops:
        seen[op.where] = max(seen.get(op.where, 0.0), op.time_s(link))
    return sum(seen.values())
