"""The `parallel` section of `anatomy inspect` as tables (analysis/parallel.py makes it)."""

from __future__ import annotations

from typing import Any

from anatomy.analysis.tables import TableSpec, count, nbytes, si

MAX_RANK_ROWS = 16  # a larger layout's ranks are shown per stage


def parallel_tables(p: dict[str, Any]) -> list[TableSpec]:
    return [_ranks(p), *(_collectives(p, phase) for phase in ("prefill", "decode")), _roofline(p)]


def _span(pair: list[int]) -> str:
    return f"{pair[0]}..{pair[1] - 1}" if pair[1] - pair[0] > 1 else str(pair[0])


def _ranks(p: dict[str, Any]) -> TableSpec:
    lay = p["layout"]
    t = TableSpec(f"Per rank: tensor-parallel {lay['tensor_parallel']} x pipeline-parallel {lay['pipeline_parallel']}",
                  ["rank", "stage", "blocks", "query heads", "kv heads", "vocab rows", "parameters", "weights",
                   "KV cache at (B, T)", "KV per token"])
    ranks = p["ranks"]
    shown = ranks if len(ranks) <= MAX_RANK_ROWS else [r for r in ranks if r["tp_rank"] == 0]
    for r in shown:
        t.rows.append([str(r["rank"]), str(r["stage"]), _span(r["blocks"]), _span(r["query_heads"]),
                       _span(r["kv_heads"]), _span(r["vocab_rows"]), count(r["params"]), nbytes(r["weights_bytes"]),
                       nbytes(r["kv_cache_bytes"]), nbytes(r["kv_cache_bytes_per_token"])])
    if len(shown) < len(ranks):
        t.notes.append(f"the first tensor-parallel rank of each stage shown; its {lay['tensor_parallel']} ranks hold "
                       "the same shapes")
    t.notes.append("kv heads fewer than the tensor-parallel ranks are replicated (each rank keeps the one its query "
                   "heads read); the vocabulary is split in ceil(V / N) rows (the last shard padded)")
    return t


def _collectives(p: dict[str, Any], phase: str) -> TableSpec:
    link = _links(p)
    t = TableSpec(f"Collectives of one {phase} step on {link}",
                  ["what", "collective", "per step", "shape", "dtype", "ranks", "message", "per token",
                   "wire bytes per rank", "time each", "time per step"])
    for c in p[phase]["collectives"]:
        t.rows.append([c["role"], c["kind"].replace("_", "-"), str(c["count"]), str(c["shape"]), c["dtype"],
                       str(c["ranks"]), nbytes(c["message_bytes"]), nbytes(c["message_bytes_per_token"]),
                       nbytes(c["wire_bytes"]), si(c["time_s"], "s"), si(c["total_time_s"], "s")])
    step = p[phase]
    t.notes.append(f"{step['collectives_per_step']} collectives per step, {nbytes(step['message_bytes_per_token'])} "
                   "of messages per token; a ring all-reduce moves 2 (N - 1) / N of its message per rank")
    return t


def _links(p: dict[str, Any]) -> str:
    within, between = p["interconnect"]["name"], p["between_stages"]["name"]
    return within if within == between else f"{within} (between stages: {between})"


def _roofline(p: dict[str, Any]) -> TableSpec:
    t = TableSpec(f"Roofline with communication on {_links(p)}",
                  ["phase", "stage", "FLOPs", "bytes", "compute", "memory", "communication", "stage time", "bound"])
    for phase in ("prefill", "decode"):
        for s in p[phase]["stages"]:
            t.rows.append([phase, str(s["stage"]), si(s["flops"]), si(s["bytes"], "B"), si(s["compute_s"], "s"),
                           si(s["memory_s"], "s"), si(s["communication_s"], "s"), si(s["time_s"], "s"), s["bound"]])
        step = p[phase]
        t.rows.append([phase, "step", "", "", "", "", si(step["communication_s"], "s"), si(step["time_s"], "s"),
                       f"{step['communication_share']:.0%} talking; {step['tokens_per_s']:,.1f} tok/s"])
        if p["layout"]["pipeline_parallel"] > 1:
            t.rows.append([phase, "pipelined", "", "", "", "", "", si(step["pipelined_time_s"], "s"),
                           f"{step['pipelined_tokens_per_s']:,.1f} tok/s with one sequence per stage in flight"])
    t.notes.append("a stage's time = max(compute, memory) of one of its ranks + its collectives, which nothing "
                   "overlaps: the next block needs the all-reduce's result")
    links = [p["interconnect"]] + ([p["between_stages"]] if p["between_stages"] != p["interconnect"] else [])
    for link in links:
        t.notes.append(f"{link['name']}: {si(link['bandwidth'], 'B/s')} each way per rank, "
                       f"{si(link['base_latency_s'], 's')} + {si(link['step_latency_s'], 's')} per ring step; "
                       f"{link['source']}")
    return t
