"""The positions of seed 003's map of a decoder, and which module (or op) of a model sits at each.

The positions: embedding, qkv_ffn_gemm, rope_attention, kv_cache, residual_norm, blocks, lm_head,
sampling, decode_loop and communication (docs/profile.md, "The positions of the map", says what
sits where). A module's position follows from its class and its place, never from its name: a
linear inside a block is a GEMM, one outside the blocks a head. A parallel module that
`communicates` has no row of its own: the module it wraps takes its path, so that it meets its row
of the shape trace (`profiled_paths`); the parts of a SplitLinear have no range either, their ops are
its linear's.
"""

from __future__ import annotations

from torch import nn

from anatomy.layers.attention import Attention
from anatomy.layers.block import Block
from anatomy.layers.latent_attention import LatentAttention
from anatomy.layers.ffn import GLU, MLP
from anatomy.layers.moe import MoE
from anatomy.kernels.norm import NativeRMSNorm
from anatomy.weights.modules import SplitLinear
from anatomy.layers.norm import LayerNorm, RMSNorm
from anatomy.models.position_rules import PositionRules
from anatomy.models.embedding import Embeddings
from anatomy.models.stack import Stack

POSITIONS: dict[str, tuple[str, str]] = {
    "embedding": ("Embedding", "the token table: a lookup, B x S rows read"),
    "qkv_ffn_gemm": ("QKV / FFN GEMM", "Tensor Cores, quantization, tensor parallelism"),
    "rope_attention": ("RoPE + attention", "kernel fusion, FlashAttention (the KV cache is read here)"),
    "kv_cache": ("KV cache writes", "PagedAttention, GQA/MQA, KV-cache quantization"),
    "residual_norm": ("Residual + norm", "fused residual-add + norm kernels: fewer trips to memory"),
    "blocks": ("The stack of blocks", "pipeline parallelism, activation recomputation"),
    "lm_head": ("LM head", "the vocabulary projection: one more GEMM (tied or not)"),
    "sampling": ("Sampling", "the next token from the logits"),
    "decode_loop": ("Token-by-token decode", "continuous batching, speculative decoding (the engine's own ops)"),
    "communication": ("Between devices", "tensor parallelism's all-reduces, pipeline stages' sends and the waits "
                                         "for them (NVLink, InfiniBand, NCCL)"),
}
COMMUNICATION = "engine:communication"  # the range parallel/collectives.py puts every collective in
KV_WRITES = ("index_copy_", "index_copy", "copy_", "index_put_")
ABSORBED_PRODUCTS = ("einsum",)  # an attention module's own GEMMs: latent attention's absorbed kv_b
_ATTENTIONS = (Attention, LatentAttention, PositionRules)
_NORMS = (LayerNorm, RMSNorm, NativeRMSNorm, nn.LayerNorm)
_FFNS = (GLU, MLP, MoE)


def module_positions(model: nn.Module) -> dict[str, str]:
    """{module path as profiled (the root is "(model)"): position} for every module of `model`."""
    out = {"(model)": "lm_head"}
    paths = profiled_paths(model)
    for path, module in model.named_modules():
        if path:
            out.setdefault(paths[path] or path, _position(module, _ancestors(model, path)))
    return out


def profiled_paths(model: nn.Module) -> dict[str, str | None]:
    """{module path: the path it is profiled under, or None for a communicating wrapper or a split
    linear's part (no range of its own)}: a wrapper's child and its descendants take the wrapper's
    path in place of the child's."""
    wrappers = [path for path, m in model.named_modules() if path and getattr(m, "communicates", False)]
    splits = [path for path, m in model.named_modules() if isinstance(m, SplitLinear)]
    out: dict[str, str | None] = {}
    for path, _ in model.named_modules():
        label = path
        for wrapper in wrappers:
            if path.startswith(wrapper + "."):
                _, _, tail = path[len(wrapper) + 1:].partition(".")
                label = wrapper + ("." + tail if tail else "")
        inside_split = any(path.startswith(split + ".") for split in splits)
        out[path] = None if path in wrappers or inside_split else label
    return out


def _ancestors(model: nn.Module, path: str) -> list[nn.Module]:
    parts = path.split(".")
    found, module = [], model
    for part in parts[:-1]:
        module = getattr(module, part) if not part.isdigit() else module[int(part)]
        found.append(module)
    return found


def _position(module: nn.Module, ancestors: list[nn.Module]) -> str:
    def inside(kinds) -> bool:
        return any(isinstance(a, kinds) for a in ancestors)

    if isinstance(module, Embeddings) or inside(Embeddings) or isinstance(module, nn.Embedding):
        return "embedding"
    if isinstance(module, _ATTENTIONS) or inside(_ATTENTIONS):
        return "qkv_ffn_gemm" if _is_linear(module) else "rope_attention"
    if isinstance(module, _FFNS) or inside(_FFNS):
        return "qkv_ffn_gemm"
    if isinstance(module, _NORMS):
        return "residual_norm" if inside((Block, Stack)) else "lm_head"
    if isinstance(module, Block):
        return "residual_norm"  # a block's own ops are its residual adds
    if isinstance(module, Stack):
        return "blocks"
    return "qkv_ffn_gemm" if inside(Block) else "lm_head"


def _is_linear(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear) or hasattr(module, "in_features") and hasattr(module, "out_features")


def position_of(owner: str, op: str, modules: dict[str, str]) -> str:
    """The position of an op of `owner` (a module path, "(engine)" or "engine:<stage>")."""
    if owner == "engine:sampling":
        return "sampling"
    if owner == COMMUNICATION:
        return "communication"
    if owner.startswith("engine:") or owner == "(engine)":
        return "decode_loop"
    position = modules.get(owner, "decode_loop")
    if position == "rope_attention" and op in KV_WRITES:
        return "kv_cache"
    if position == "rope_attention" and op in ABSORBED_PRODUCTS:
        return "qkv_ffn_gemm"
    return position
