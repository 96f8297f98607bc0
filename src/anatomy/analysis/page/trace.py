"""The shape trace in groups: consecutive rows of one block (or of the embeddings, the memory K/V
projection, the final norm and head) form one collapsible group per phase."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_BLOCK = re.compile(r"^(?:(\w+)\.)?blocks\.(\d+)(?:\.|$)")
_MEMORY = re.compile(r"blocks\.\d+\.cross_attn\.kv$")
_OUTPUT = re.compile(r"(^|\.)final_norm(\.|$)|^(lm_head|pooler)(\.|$)")


@dataclass
class TraceGroup:
    phase: str
    key: str
    label: str
    detail: str = ""  # "× 30 layers" etc.
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def flops(self) -> int:
        return sum(r["flops"] for r in self.rows)

    @property
    def bytes(self) -> int:
        return sum(r["bytes"] for r in self.rows)

    @property
    def is_block(self) -> bool:
        return self.key.startswith("block:")


def trace_groups(report: dict[str, Any], phase: str) -> list[TraceGroup]:
    rows = [r for r in report["trace"] if r["phase"] == phase]
    groups: list[TraceGroup] = []
    previous = "embeddings"
    for row in rows:
        key = _key(row["module"], previous)
        if not groups or groups[-1].key != key:
            groups.append(TraceGroup(phase, key, ""))
        groups[-1].rows.append(row)
        previous = key
    for group in groups:
        group.label, group.detail = _label(group, report)
    return groups


def _key(module: str, previous: str) -> str:
    if module == "(model)":  # the model's own code between modules: part of what it continues
        return previous
    if _MEMORY.search(module):
        return "memory"
    match = _BLOCK.match(module)
    if match:
        return f"block:{match.group(1) or ''}:{match.group(2)}"
    if _OUTPUT.search(module):
        return "output"
    return "embeddings"


def _label(group: TraceGroup, report: dict[str, Any]) -> tuple[str, str]:
    arch = report["model"]["architecture"]
    c = report["model"]["config"]
    roots = {r["module"].split(".")[0] for r in group.rows} - {"(model)", "shared"}
    if group.is_block:
        _, stack, index = group.key.split(":")
        name = {"stack": "encoder" if arch == "encoder" else "decoder"}.get(stack, stack)
        layers = c["n_decoder_layers"] if arch == "encoder-decoder" and stack == "decoder" else c["n_layers"]
        return f"{name} block {index}", f"one of {layers} identical blocks"
    if group.key == "memory":
        return "memory K/V for cross-attention", "projected once per source, reused at every decoder step"
    if group.key == "output":
        modules = {r["module"] for r in group.rows}
        norm = any(m.endswith("final_norm") for m in modules)
        head = any(m.startswith(("lm_head", "pooler")) for m in modules)
        return ("final norm and head" if norm and head else "final norm" if norm else "head"), ""
    where = f" ({', '.join(sorted(roots))})" if arch == "encoder-decoder" and roots else ""
    return f"embeddings{where}", ""
