"""The block as built: a Mermaid flowchart and a text diagram, read off the model's modules
(norm class and placement, attention heads, FFN class and activation, positional scheme)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from anatomy.config import ModelConfig


@dataclass(frozen=True)
class BlockShape:
    norm: str  # the norm class the block holds
    pre_norm: bool
    attention: str  # MHA / GQA / MQA with head counts
    cross: bool
    ffn: str  # the FFN class and activation
    position: str  # where positions enter
    out_norm: bool = False  # a norm on each branch's output too (sandwich)


def describe(config: ModelConfig) -> BlockShape:
    """Build the model on the meta device and read its first block."""
    from anatomy.layers import Block
    from anatomy.models import build_model

    model = build_model(config, device="meta")
    blocks = [m for m in model.modules() if isinstance(m, Block)]
    block = blocks[-1]  # a seq2seq model's last block is a decoder block (with cross-attention)
    heads = _heads(config) + _attention_extras(config)
    ffn = f"{type(block.ffn).__name__} {config.activation} D={config.d_model} F={config.d_ff}"
    if config.n_experts:
        ffn = _moe(config)
    norm = type(block.attn_norm).__name__ + (" (1 + w)" if config.norm_unit_offset else "")
    return BlockShape(norm, block.pre_norm, heads, block.cross_attn is not None, ffn, _position(model),
                      block.attn_out_norm is not None)


def _heads(config: ModelConfig) -> str:
    if config.latent:
        rope = config.rotary_dim
        return (f"latent MLA H={config.n_heads} d_h={config.head_dim - rope}+{rope} (RoPE) v={config.v_head_dim}, "
                f"cached per token: latent {config.kv_lora_rank} + RoPE key {rope}")
    kind = "MHA" if config.n_kv_heads == config.n_heads else ("MQA" if config.n_kv_heads == 1 else "GQA")
    return f"{kind} H={config.n_heads} H_kv={config.n_kv_heads} d_h={config.head_dim}"


def _attention_extras(config: ModelConfig) -> str:
    extras = []
    if config.attn_sinks:
        extras.append("a sink logit per head")
    if config.nope_layers:
        extras.append(f"no RoPE on {len(config.nope_layers)} of {config.n_layers} layers")
    if config.qk_norm:
        extras.append("q/k RMSNorm per head")
    if config.attn_softcap:
        extras.append(f"scores soft-capped at {config.attn_softcap:g}")
    windowed = sum(config.layer_window(i) is not None for i in range(config.n_layers)) if config.is_decoder else 0
    if windowed:
        extras.append(f"sliding window {config.sliding_window} on {windowed} of {config.n_layers} layers")
    return f" ({'; '.join(extras)})" if extras else ""


def _moe(config: ModelConfig) -> str:
    kind = "GLU" if config.ffn == "glu" else "MLP"
    text = (f"MoE: router -> {config.n_experts_per_token} of {config.n_experts} experts ({config.activation} {kind} "
            f"D={config.d_model} F_e={config.d_ff_expert})")
    if config.d_ff_shared_expert:
        text += f" + {'gated ' if config.shared_expert_gate else ''}shared expert F={config.d_ff_shared_expert}"
    dense = config.n_layers - config.n_moe_layers
    return text + (f"; {dense} of {config.n_layers} layers dense F={config.d_ff}" if dense else "")


def _position(model: nn.Module) -> str:
    from anatomy.layers import LearnedPositions, Rotary, SinusoidalPositions

    kinds = {type(m) for m in model.modules()}
    if Rotary in kinds:
        return "RoPE (rotates q and k in every attention)"
    if LearnedPositions in kinds:
        return "learned table added to the token embeddings"
    if SinusoidalPositions in kinds:
        return "sinusoidal table added to the token embeddings"
    if any(getattr(m, "alibi", False) for m in model.modules()):
        return "ALiBi (a per-head linear bias on the scores)"
    return "none"


def _steps(shape: BlockShape) -> list[tuple[str, str]]:
    """(id, label) of the sublayers in order, residual adds included."""
    sublayers = [("attn", f"self-attention {shape.attention}")]
    if shape.cross:
        sublayers.append(("cross", f"cross-attention {shape.attention}"))
    sublayers.append(("ffn", shape.ffn))
    steps = []
    for key, label in sublayers:
        norm = (f"{key}_norm", shape.norm)
        add = (f"{key}_add", "+ residual")
        out = [(f"{key}_out_norm", shape.norm)] if shape.out_norm else []
        steps += [norm, (key, label), *out, add] if shape.pre_norm else [(key, label), add, norm]
    return steps


def mermaid(shape: BlockShape) -> str:
    placement = "Pre-Norm: x + f(norm(x))" if shape.pre_norm else "Post-Norm: norm(x + f(x))"
    lines = ["flowchart TB", '  in["x [B, S, D]"]', f'  note["{placement}; positions: {shape.position}"]']
    previous, branch_start = "in", "in"
    for node, label in _steps(shape):
        lines.append(f'  {node}["{label}"]')
        lines.append(f"  {previous} --> {node}")
        if node.endswith("_add"):
            lines.append(f"  {branch_start} -. residual .-> {node}")
        previous = node
        if node.endswith("_add") and shape.pre_norm or node.endswith("_norm") and not shape.pre_norm \
                and not node.endswith("_out_norm"):
            branch_start = node
    lines += ['  out["x [B, S, D]"]', f"  {previous} --> out"]
    return "\n".join(lines)


def text(shape: BlockShape) -> str:
    placement = "Pre-Norm: x + f(norm(x))" if shape.pre_norm else "Post-Norm: norm(x + f(x))"
    which = "decoder block (the encoder block is the same without cross-attention)" if shape.cross else "block"
    lines = [f"{which} ({placement}); positions: {shape.position}", "  x [B, S, D]"]
    lines += [f"  -> {label}" for _, label in _steps(shape)]
    lines.append("  -> x [B, S, D]")
    return "\n".join(lines)
