"""The components of the block diagram, read from the report: which parts a model has, what each
computes, its shapes and the ledger rows it holds.

Every ledger row belongs to exactly one part (a seq2seq decoder's token embedding is the
encoder's table, so the decoder's embedding part points at it instead of counting it twice),
so the parts' parameters add up to `params.total`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

NORM_NAMES = {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}
NORM_FORMULAS = {"rmsnorm": "x / sqrt(mean(x²) + ε) · g", "layernorm": "(x − mean(x)) / sqrt(var(x) + ε) · g + b"}
ACTIVATION_NAMES = {"silu": "SiLU", "gelu": "GELU", "gelu_tanh": "GELU (tanh)", "relu": "ReLU"}


@dataclass
class Part:
    """One clickable component of the diagram."""

    id: str  # "decoder.attn"
    title: str  # "self-attention"
    subtitle: str  # "GQA · H 9 · H_kv 3 · d_h 64"
    kind: str  # a ledger kind, for the colour: embedding, attention, cross_attention, ffn, norm, head, position
    what: str  # what it computes
    shapes: list[str] = field(default_factory=list)  # "x [B, S, D] -> ..." lines
    ledger: list[dict[str, Any]] = field(default_factory=list)
    shared_with: str | None = None  # the part whose parameters these are (a shared table)
    flops: list[tuple[str, int]] = field(default_factory=list)  # (what, FLOPs per layer at B, S)

    @property
    def params(self) -> int:
        return sum(c["total"] for c in self.ledger)


def stacks(report: dict[str, Any]) -> list[str]:
    arch = report["model"]["architecture"]
    return {"encoder-decoder": ["encoder", "decoder"], "encoder": ["encoder"]}.get(arch, ["decoder"])


def diagram_parts(report: dict[str, Any]) -> dict[str, Part]:
    """id -> Part, in drawing order; ledger rows assigned to their parts."""
    c = report["model"]["config"]
    components = report["params"]["components"]
    names = {comp["name"] for comp in components}
    seq2seq = report["model"]["architecture"] == "encoder-decoder"
    parts: dict[str, Part] = {}
    for stack in stacks(report):
        prefix = f"{stack}."
        parts[prefix + "embedding"] = _embedding(c, stack, seq2seq)
        if c["position"] != "none":
            parts[prefix + "positions"] = _positions(c, stack)
        if "segment embedding" in names:
            segments = next(comp for comp in components if comp["name"] == "segment embedding")
            size = f"{segments['per_copy'] // c['d_model']:,} × {c['d_model']:,}"
            parts[prefix + "segments"] = Part(prefix + "segments", "segments", f"learned, {size}",
                                              "embedding", "adds a learned vector per segment id (sentence A / B)",
                                              ["token_type_ids [B, S] → [B, S, D]"])
        if "embedding norm" in names:
            parts[prefix + "embedding_norm"] = _norm(c, prefix + "embedding_norm", "embedding norm")
        parts[prefix + "attn_norm"] = _norm(c, prefix + "attn_norm", "attention norm")
        parts[prefix + "attn"] = _attention(c, prefix + "attn", causal=stack == "decoder")
        if seq2seq and stack == "decoder":
            parts[prefix + "cross_norm"] = _norm(c, prefix + "cross_norm", "cross-attention norm")
            parts[prefix + "cross_attn"] = _attention(c, prefix + "cross_attn", cross=True)
        parts[prefix + "ffn_norm"] = _norm(c, prefix + "ffn_norm", "FFN norm")
        parts[prefix + "ffn"] = _ffn(c, prefix + "ffn")
        if f"final norm ({stack})" in names:
            parts[prefix + "final_norm"] = _norm(c, prefix + "final_norm", "final norm")
    head = _head(report)
    if head is not None:
        parts["head"] = head
    _assign_ledger(parts, components, stacks(report))
    _add_flops(parts, report)
    return parts


def _embedding(c: dict[str, Any], stack: str, seq2seq: bool) -> Part:
    scale = " · √D" if c.get("embedding_scale") else ""
    ids = "src_ids" if seq2seq and stack == "encoder" else ("tgt_ids" if seq2seq else "input_ids")
    part = Part(f"{stack}.embedding", "token embedding", f"V {c['vocab_size']:,} × D {c['d_model']:,}{scale}",
                "embedding", "looks up one row of the V × D table per token" + (", scaled by √D" if scale else ""),
                [f"{ids} [B, S] → x [B, S, D]"])
    if seq2seq and stack == "decoder":
        part.shared_with = "encoder.embedding"
        part.what += "; the encoder's table, shared (counted once, under the encoder)"
    return part


def _positions(c: dict[str, Any], stack: str) -> Part:
    pid, D = f"{stack}.positions", c["d_model"]
    kind = c["position"]
    if kind == "rope":
        return Part(pid, "RoPE", f"θ = {c.get('rope_theta', 10000):g} · rotates q, k", "position",
                    "rotates each (i, i + d_h/2) pair of q and k by position · θ^(−2i/d_h): scores depend on "
                    "relative position; no parameters",
                    ["q [B, H, S, d_h], k [B, H_kv, S, d_h] → rotated, same shapes"])
    if kind == "alibi":
        return Part(pid, "ALiBi", "linear bias per head", "position",
                    "adds −slope_h · distance to every score of head h; no parameters",
                    ["bias [1, H, S, S_k] added to the scores"])
    if kind == "sinusoidal":
        return Part(pid, "positions", f"sinusoidal, {c['max_seq_len']:,} × {D:,}", "position",
                    "adds sin/cos of position · 10000^(−2i/D) to the token embeddings; a fixed table, no parameters",
                    ["position_ids [B, S] → [B, S, D], added to x"])
    return Part(pid, "positions", f"learned, {c['max_seq_len']:,} × {D:,}", "embedding",
                "adds a learned vector per position to the token embeddings",
                ["position_ids [B, S] → [B, S, D], added to x"])


def _norm(c: dict[str, Any], pid: str, title: str) -> Part:
    name = NORM_NAMES.get(c["norm"], c["norm"])
    return Part(pid, title, name, "norm", f"{name}: {NORM_FORMULAS.get(c['norm'], c['norm'])}, over D",
                ["[B, S, D] → [B, S, D]"])


def _attention(c: dict[str, Any], pid: str, *, causal: bool = False, cross: bool = False) -> Part:
    H, H_kv, d_h = c["n_heads"], c["n_kv_heads"], c["head_dim"]
    kind = "MHA" if H == H_kv else ("MQA" if H_kv == 1 else "GQA")
    subtitle = f"{kind} · H {H} · H_kv {H_kv} · d_h {d_h}"
    share = "" if H == H_kv else f"; each K/V head serves {H // H_kv} query heads"
    if cross:
        return Part(pid, "cross-attention", subtitle, "cross_attention",
                    f"queries from the decoder, keys and values from the encoder output (memory){share}: "
                    "softmax(Q Kᵀ / √d_h + padding mask) V",
                    ["x [B, S, D] → q [B, H, S, d_h]", "memory [B, S_src, D] → k, v [B, H_kv, S_src, d_h]",
                     "scores, weights [B, H, S, S_src]", "→ [B, S, H·d_h] → out [B, S, D]"])
    mask = "causal mask" if causal else "padding mask"
    return Part(pid, "self-attention" + (" (causal)" if causal else ""), subtitle, "attention",
                f"softmax(Q Kᵀ / √d_h + {mask}) V over {H} heads{share}",
                ["x [B, S, D] → q [B, H, S, d_h], k, v [B, H_kv, S, d_h]", "scores, weights [B, H, S, S]",
                 "→ [B, S, H·d_h] → out [B, S, D]"])


def _ffn(c: dict[str, Any], pid: str) -> Part:
    act = ACTIVATION_NAMES.get(c["activation"], c["activation"])
    D, F = c["d_model"], c["d_ff"]
    if c["ffn"] == "glu":
        return Part(pid, f"FFN: {act} GLU", f"D {D:,} → F {F:,} → D", "ffn",
                    f"down({c['activation']}(gate(x)) ⊙ up(x)): three D × F matrices",
                    ["x [B, S, D] → gate, up [B, S, F] → [B, S, F] → [B, S, D]"])
    return Part(pid, f"FFN: {act} MLP", f"D {D:,} → F {F:,} → D", "ffn",
                f"down({c['activation']}(up(x))): two D × F matrices",
                ["x [B, S, D] → [B, S, F] → [B, S, D]"])


def _head(report: dict[str, Any]) -> Part | None:
    c = report["model"]["config"]
    names = {comp["name"] for comp in report["params"]["components"]}
    if report["model"]["architecture"] == "encoder":
        if "pooler (dense + tanh)" in names:
            return Part("head", "pooler", "dense D × D + tanh", "head",
                        "tanh(dense(hidden of the first token)): a sentence vector", ["[B, S, D] → [B, D]"])
        if "MLM decoder" in names:
            return Part("head", "MLM head", "dense + norm + decoder to V", "head",
                        "predicts the masked tokens", ["[B, S, D] → logits [B, S, V]"])
        return None
    tied = c["tie_embeddings"]
    return Part("head", "LM head", f"D {c['d_model']:,} × V {c['vocab_size']:,}" + (" · tied" if tied else ""),
                "head", "logits = x Wᵀ" + (": the token embedding's matrix, no parameters of its own" if tied
                                            else ": its own D × V matrix"),
                ["[B, S, D] → logits [B, S, V]"])


# ledger row name -> the part that holds it (per stack for the block parts)
_BY_NAME = {"token embedding": "embedding", "position embedding": "positions", "segment embedding": "segments",
            "embedding norm": "embedding_norm", "attention norm": "attn_norm", "FFN norm": "ffn_norm",
            "cross-attention norm": "cross_norm"}
_BY_KIND = {"attention": "attn", "cross_attention": "cross_attn", "ffn": "ffn"}


def _assign_ledger(parts: dict[str, Part], components: list[dict[str, Any]], stack_names: list[str]) -> None:
    for comp in components:
        parts[_owner(comp, parts, stack_names)].ledger.append(comp)


def _owner(comp: dict[str, Any], parts: dict[str, Part], stack_names: list[str]) -> str:
    stack = comp.get("stack", stack_names[-1])
    if stack not in stack_names:  # "embed" or "head": the first stack holds the shared tables
        stack = stack_names[0]
    name, kind = comp["name"], comp["kind"]
    candidates = []
    if name.startswith("final norm"):
        candidates.append(f"{stack}.final_norm")
    if name in _BY_NAME:
        candidates.append(f"{stack}.{_BY_NAME[name]}")
    if kind in _BY_KIND:
        candidates.append(f"{stack}.{_BY_KIND[kind]}")
    if kind == "head" or comp.get("stack") == "head":
        candidates.append("head")
    candidates += [f"{stack}.embedding", "head"]  # anything new lands somewhere visible
    return next(p for p in candidates if p in parts)


def _add_flops(parts: dict[str, Part], report: dict[str, Any]) -> None:
    per_layer = report["flops"]["per_layer"]
    for stack in stacks(report):
        attn, ffn = parts.get(f"{stack}.attn"), parts.get(f"{stack}.ffn")
        labels = {"qkv_projection": "Q/K/V projection", "attention_scores": "scores Q Kᵀ",
                  "attention_values": "weights · V", "output_projection": "output projection"}
        if attn is not None:
            attn.flops = [(label, per_layer[key]) for key, label in labels.items() if key in per_layer]
        if ffn is not None and "ffn" in per_layer:
            ffn.flops = [("FFN matmuls", per_layer["ffn"])]
    cross = parts.get("decoder.cross_attn")
    if cross is not None:
        labels = {"cross_projections": "Q, K/V and output projections",
                  "cross_attention_matmuls": "Q Kᵀ and weights · V"}
        cross.flops = [(label, per_layer[key]) for key, label in labels.items() if key in per_layer]
