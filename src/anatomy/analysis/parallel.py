"""The anatomy of a model split over tensor-parallel x pipeline-parallel ranks: what each rank holds,
what the ranks say to each other, and where a step's time goes once the talking is counted.

    report = parallel_report(config, Layout(tp=8), hardware=get_hardware("h100-sxm"),
                             link=get_interconnect("nvlink4"), batch=1, seq=512, context=2048)

Per rank: its blocks, heads, vocabulary rows and the bytes of its weights and KV cache. Per step:
each rank's roofline time plus the step's collectives (communication.py); a pipeline's latency sums
its stages, its throughput is set by the slowest. docs/parallel.md, "The anatomy of communication".
"""

from __future__ import annotations

import functools
from typing import Any

from anatomy.analysis import communication
from anatomy.analysis.flops import decode_flops, forward_flops
from anatomy.analysis.hardware import Hardware, Interconnect
from anatomy.analysis.memory import kv_bytes_per_token, kv_cache_bytes, weights_bytes
from anatomy.analysis.roofline import experts_touched
from anatomy.config import ModelConfig
from anatomy.parallel.layout import (Layout, check_layout, columns, kv_heads, query_heads, shard_config, stage_holds,
                                     stage_layers, vocab_rows)


def parallel_report(config: ModelConfig, layout: Layout, *, hardware: Hardware, link: Interconnect, batch: int,
                    seq: int, context: int, weight_dtype: str, kv_dtype: str, compute_dtype: str,
                    stage_link: Interconnect | None = None) -> dict[str, Any]:
    """The `parallel` section of `anatomy inspect --tensor-parallel N --pipeline-parallel M` (docs/parallel.md):
    `link` joins the ranks of a stage, `stage_link` (default: `link`) the stages."""
    stage_link = stage_link or link
    check_layout(config, layout)
    ranks = [_rank(config, layout, r, batch=batch, context=context, weight_dtype=weight_dtype, kv_dtype=kv_dtype)
             for r in range(layout.world)]
    phases = {"prefill": dict(tokens=seq, flops_of=lambda c: forward_flops(c, batch=batch, seq=seq, last_only=True)),
              "decode": dict(tokens=1, flops_of=lambda c: decode_flops(c, batch=batch, context=context))}
    steps = {}
    for phase, spec in phases.items():
        ops = communication.step_collectives(config, layout, batch=batch, tokens=spec["tokens"], rows=(batch,),
                                             dtype=compute_dtype)
        steps[phase] = _step(config, layout, ops, spec, hardware=hardware, link=link, stage_link=stage_link,
                             batch=batch,
                             weight_dtype=weight_dtype, kv_dtype=kv_dtype, compute_dtype=compute_dtype,
                             context=context if phase == "decode" else None)
    return {
        "layout": {"tensor_parallel": layout.tp, "pipeline_parallel": layout.pp, "ranks": layout.world},
        "interconnect": _link(link),
        "between_stages": _link(stage_link),
        "ranks": ranks,
        "prefill": steps["prefill"],
        "decode": steps["decode"],
    }


def _rank(config: ModelConfig, layout: Layout, rank: int, *, batch: int, context: int, weight_dtype: str,
          kv_dtype: str) -> dict[str, Any]:
    stage, tp_rank = layout.coords(rank)
    layers = stage_layers(config.n_layers, layout.pp, stage)
    local = shard_config(config, layout, rank)
    rows, _ = vocab_rows(config.vocab_size, layout.tp, tp_rank)
    heads, kv = query_heads(config, layout.tp, tp_rank), kv_heads(config, layout.tp, tp_rank)
    out = {"rank": rank, "stage": stage, "tp_rank": tp_rank, "blocks": [layers.start, layers.stop],
           "query_heads": [heads.start, heads.stop], "kv_heads": [kv.start, kv.stop],
           "vocab_rows": [rows.start, rows.stop], "params": held_params(config, layout, rank),
           "kv_cache_bytes_per_token": kv_bytes_per_token(local, kv_dtype),
           "kv_cache_bytes": kv_cache_bytes(local, batch=batch, tokens=context, kv_dtype=kv_dtype)}
    if config.n_experts:
        ffn = columns(config.d_ff_expert, layout.tp, tp_rank)
        out["expert_columns"] = [ffn.start, ffn.stop]
    out["weights_bytes"] = weights_bytes(out["params"], weight_dtype)
    return out


def held_params(config: ModelConfig, layout: Layout, rank: int) -> int:
    """Parameters rank `rank` holds, counted on its shard's structure built on the meta device (a tied
    table and head once; a tied model's last stage holds its table shard for the head)."""
    return sum(n for name, n in _shell_params(config, layout, rank) if _holds(config, layout, rank, name))


@functools.lru_cache(maxsize=64)
def _shell_params(config: ModelConfig, layout: Layout, rank: int) -> tuple[tuple[str, int], ...]:
    """(name, numel) of every parameter of the rank's shard structure (before the stage's cut)."""
    from anatomy.models import build_model

    shell = build_model(shard_config(config, layout, rank), device="meta")
    return tuple((name, p.numel()) for name, p in shell.named_parameters())


def _holds(config: ModelConfig, layout: Layout, rank: int, name: str) -> bool:
    stage, _ = layout.coords(rank)
    return stage_holds(name, first=stage == 0, last=stage == layout.pp - 1, tied=config.tie_embeddings)


def _read_params(config: ModelConfig, layout: Layout, rank: int, *, tokens: int) -> float:
    """Parameters a step of `tokens` tokens reads on the rank: what it holds, less the tables read by
    index (the token table unless it is the head, learned positions) and the experts no token reaches."""
    last = layout.coords(rank)[0] == layout.pp - 1
    head_table = "stack.embed.tokens.weight" if config.tie_embeddings and last else None
    local = shard_config(config, layout, rank)
    read = 0.0
    for name, n in _shell_params(config, layout, rank):
        if not _holds(config, layout, rank, name):
            continue
        if name.startswith("stack.embed.") and name != head_table and (name.endswith("tokens.weight") or
                                                                        ".positions." in name):
            continue  # a lookup: B x S rows read
        read += n * (experts_touched(local, tokens) / local.n_experts if _is_expert(name) else 1.0)
    return read


def _is_expert(name: str) -> bool:
    return name.endswith(".ffn.gate_up") or name.endswith(".ffn.down")


def _link(link: Interconnect) -> dict[str, Any]:
    return {"name": link.name, "bandwidth": link.bandwidth, "base_latency_s": link.base_latency_s,
            "step_latency_s": link.step_latency_s, "source": link.source, "notes": link.notes}


def _step(config: ModelConfig, layout: Layout, ops, spec: dict, *, hardware: Hardware, link: Interconnect,
          stage_link: Interconnect, batch: int, weight_dtype: str, kv_dtype: str, compute_dtype: str,
          context: int | None) -> dict[str, Any]:
    """Each stage's roofline time (its slowest rank's), the communication, and the step's time."""
    peak, tokens = hardware.peak(compute_dtype), spec["tokens"]
    stages = []
    for stage in range(layout.pp):
        rank = layout.rank(stage, 0)  # the tp ranks of a stage do the same work
        local = shard_config(config, layout, rank)
        parts = spec["flops_of"](local).parts
        flops = sum(v for k, v in parts.items() if k != "lm_head" or stage == layout.pp - 1)
        weights = weights_bytes(round(_read_params(config, layout, rank, tokens=batch * tokens)), weight_dtype)
        kv = kv_cache_bytes(local, batch=batch, tokens=context or tokens, kv_dtype=kv_dtype)
        comm = communication.step_time_s([op for op in ops if op.kind != "send" and rank in op.ranks], link)
        compute_s, memory_s = flops / peak, (weights + kv) / hardware.bandwidth
        stages.append({"stage": stage, "flops": flops, "bytes": weights + kv, "compute_s": compute_s,
                       "memory_s": memory_s, "communication_s": comm, "time_s": max(compute_s, memory_s) + comm,
                       "bound": "compute" if compute_s >= memory_s else "memory"})
    sends = [op for op in ops if op.kind == "send"]
    send_s = communication.step_time_s(sends, stage_link)
    latency = sum(s["time_s"] for s in stages) + send_s
    pipelined = max(s["time_s"] for s in stages) + max((op.time_s(stage_link) for op in sends), default=0.0)
    comm_total = sum(s["communication_s"] for s in stages) + send_s
    produced = batch * tokens if context is None else batch
    return {
        "stages": stages,
        "collectives": (communication.by_role([op for op in ops if op.kind != "send"], link, tokens=batch * tokens)
                        + communication.by_role(sends, stage_link, tokens=batch * tokens)),
        "collectives_per_step": len(ops),
        "message_bytes_per_token": sum(op.message_bytes for op in ops) / (batch * tokens),
        "communication_s": comm_total, "send_s": send_s,
        "time_s": latency, "tokens_per_s": produced / latency, "communication_share": comm_total / latency,
        "pipelined_time_s": pipelined, "pipelined_tokens_per_s": produced / pipelined,
    }
