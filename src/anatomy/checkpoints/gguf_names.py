"""Our parameter names <-> llama.cpp's GGUF tensor names, and llama.cpp's rotary row order.

A `Part` is one GGUF tensor (`blk.{i}.attn_q`, `ffn_gate`, ...) filling a range of rows of one of
our fused tensors (`attn.qkv`, `ffn.gate_up`; for stacked experts, of every expert). llama.cpp's
llama and smollm3 RoPE rotates adjacent pairs, ours (and HF's) halves, so their q/k rows are
reordered per head: `from_gguf_rows` undoes that, `to_gguf_rows` applies it. A Part can also
carry Gemma's stored 1 + w (`offset`) and latent attention's per-head, transposed kv_b halves
(`per_head`, `transposed`). The row order: docs/gguf.md, "Loading".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from anatomy.config import ModelConfig
from anatomy.errors import ConfigError

# GGUF architectures whose converter reorders Q/K rows for llama.cpp's interleaved RoPE
ROTARY_REORDERED = {"llama", "smollm3"}
# GGUF architectures that keep Q, K, V fused in one `attn_qkv` tensor
FUSED_QKV = {"gpt2", "phi3"}
# ... and gate, up fused in `ffn_up` (rows: gate, up)
FUSED_GATE_UP = {"phi3"}
# ... whose norm tensors hold 1 + w
NORM_PLUS_ONE = {"gemma", "gemma2", "gemma3"}
# ... that name the norm before the FFN `post_attention_norm` (gpt-oss)
FFN_NORM_AS_POST_ATTENTION = {"gpt-oss"}

_TOP = {"stack.embed.tokens": "token_embd", "stack.embed.positions": "position_embd",
        "stack.final_norm": "output_norm", "lm_head": "output"}
_BLOCK = {"attn_norm": "attn_norm", "ffn_norm": "ffn_norm", "attn.out": "attn_output",
          "ffn.down": "ffn_down", "ffn.up": "ffn_up", "attn.q_norm": "attn_q_norm", "attn.k_norm": "attn_k_norm",
          "attn_out_norm": "post_attention_norm", "ffn_out_norm": "post_ffw_norm", "ffn.router": "ffn_gate_inp",
          "ffn.shared.down": "ffn_down_shexp", "ffn.shared_gate": "ffn_gate_inp_shexp",
          # latent attention (deepseek2)
          "attn.q": "attn_q", "attn.q_a": "attn_q_a", "attn.q_a_norm": "attn_q_a_norm", "attn.q_b": "attn_q_b",
          "attn.kv_a": "attn_kv_a_mqa", "attn.kv_a_norm": "attn_kv_a_norm"}
_BLOCK_NAME = re.compile(r"stack\.blocks\.(\d+)\.(.+)\.(weight|bias)")
_EXPERTS_NAME = re.compile(r"stack\.blocks\.(\d+)\.ffn\.(gate_up|down)(_bias)?")  # stacked experts, no suffix
_SINKS_NAME = re.compile(r"stack\.blocks\.(\d+)\.attn\.sinks")
_LATENT_KV_NAME = re.compile(r"stack\.blocks\.(\d+)\.attn\.kv_b")
_SCORE_BIAS_NAME = re.compile(r"stack\.blocks\.(\d+)\.ffn\.score_bias")
_TOP_NAME = re.compile(r"(.+)\.(weight|bias)")


@dataclass(frozen=True)
class Part:
    """GGUF tensor `name` fills the next `rows` rows of one of our tensors (of each expert's block
    when `experts`; of each of `per_head` heads' groups of rows when that is set, each head's block stored
    [C, rows] when `transposed`); `heads` > 0 means its rows are in llama.cpp's rotary order over that
    many heads; the file holds our values + `offset`."""

    name: str
    rows: int
    heads: int = 0
    experts: int = 0
    offset: float = 0.0
    per_head: int = 0
    transposed: bool = False


def tensor_parts(shapes: dict[str, torch.Size], config: ModelConfig, arch: str) -> dict[str, list[Part]]:
    """For each of our tensors (name -> shape), the GGUF tensors that make it, in row order."""
    return {name: _parts(name, shape, config, arch) for name, shape in shapes.items()}


def _parts(name: str, shape: torch.Size, config: ModelConfig, arch: str) -> list[Part]:
    experts = _EXPERTS_NAME.fullmatch(name)
    if experts is not None:
        kind = "bias" if experts.group(3) else "weight"
        return _expert_parts(f"blk.{experts.group(1)}.", experts.group(2), config, kind)
    sinks = _SINKS_NAME.fullmatch(name)
    if sinks is not None:
        return [Part(f"blk.{sinks.group(1)}.attn_sinks.weight", shape[0])]
    score_bias = _SCORE_BIAS_NAME.fullmatch(name)
    if score_bias is not None:
        return [Part(f"blk.{score_bias.group(1)}.exp_probs_b.bias", shape[0])]
    latent = _LATENT_KV_NAME.fullmatch(name)
    if latent is not None:
        H, n = config.n_heads, config.head_dim - config.rotary_dim
        prefix = f"blk.{latent.group(1)}."
        return [Part(f"{prefix}attn_k_b.weight", n, per_head=H, transposed=True),
                Part(f"{prefix}attn_v_b.weight", config.v_head_dim or config.head_dim, per_head=H)]
    rows = shape[0]
    offset = 1.0 if arch in NORM_PLUS_ONE and _is_norm(name) else 0.0
    block = _BLOCK_NAME.fullmatch(name)
    if block is None:
        top = _TOP_NAME.fullmatch(name)
        if top is None or top.group(1) not in _TOP:
            raise _no_tensor(name)
        return [Part(f"{_TOP[top.group(1)]}.{top.group(2)}", rows, offset=offset)]
    i, module, kind = block.groups()
    prefix = f"blk.{i}."
    if module == "ffn_norm" and arch in FFN_NORM_AS_POST_ATTENTION:
        return [Part(f"{prefix}post_attention_norm.{kind}", rows)]
    if module == "ffn.gate_up" and arch in FUSED_GATE_UP:
        return [Part(f"{prefix}ffn_up.{kind}", rows)]
    if module in _BLOCK:
        return [Part(f"{prefix}{_BLOCK[module]}.{kind}", rows, offset=offset)]
    if module in ("ffn.gate_up", "ffn.shared.gate_up"):
        suffix, width = ("_shexp", config.d_ff_shared_expert) if "shared" in module else ("", rows // 2)
        return [Part(f"{prefix}ffn_gate{suffix}.{kind}", width), Part(f"{prefix}ffn_up{suffix}.{kind}", width)]
    if module == "attn.qkv":
        return _qkv_parts(prefix, kind, rows, config, arch)
    raise _no_tensor(name)


def _is_norm(name: str) -> bool:
    return name.rpartition(".")[0].endswith("norm")


def _no_tensor(name: str) -> ConfigError:
    return ConfigError(f"llama.cpp has no tensor for parameter {name!r}")


def _expert_parts(prefix: str, which: str, config: ModelConfig, kind: str) -> list[Part]:
    """Stacked experts: GGUF keeps gate, up and down of all experts as [E, F, D] / [E, D, F] (their
    biases, gpt-oss's, as [E, F] / [E, D])."""
    E, F = config.n_experts, config.d_ff_expert
    if which == "down":
        return [Part(f"{prefix}ffn_down_exps.{kind}", config.d_model, experts=E)]
    if config.ffn != "glu":
        return [Part(f"{prefix}ffn_up_exps.{kind}", F, experts=E)]
    return [Part(f"{prefix}ffn_gate_exps.{kind}", F, experts=E), Part(f"{prefix}ffn_up_exps.{kind}", F, experts=E)]


def _qkv_parts(prefix: str, kind: str, rows: int, config: ModelConfig, arch: str) -> list[Part]:
    if arch in FUSED_QKV:
        return [Part(f"{prefix}attn_qkv.{kind}", rows)]
    reordered = arch in ROTARY_REORDERED and config.position == "rope"
    return [Part(f"{prefix}attn_q.{kind}", config.q_dim, config.n_heads if reordered else 0),
            Part(f"{prefix}attn_k.{kind}", config.kv_dim, config.n_kv_heads if reordered else 0),
            Part(f"{prefix}attn_v.{kind}", config.kv_dim)]


def from_gguf_rows(t: Tensor, heads: int) -> Tensor:
    """Rows [heads * d_h, ...] in llama.cpp's pairwise rotary order -> HF's half-split order."""
    rest = t.shape[1:]
    return t.reshape(heads, -1, 2, *rest).transpose(1, 2).reshape(t.shape)  # [H, d_h/2, 2] -> [H, 2, d_h/2]


def to_gguf_rows(t: Tensor, heads: int) -> Tensor:
    """The inverse of from_gguf_rows: HF's half-split rows -> llama.cpp's pairwise order."""
    rest = t.shape[1:]
    return t.reshape(heads, 2, -1, *rest).transpose(1, 2).reshape(t.shape)  # [H, 2, d_h/2] -> [H, d_h/2, 2]


def part_bytes(raw: np.ndarray, part: Part) -> np.ndarray:
    """A part's raw bytes `raw` with its rows [rows, bytes per row] put back in HF's rotary order
    when llama.cpp reordered them: a row of a quantized tensor is whole blocks, so rows move as bytes."""
    if not part.heads:
        return raw
    rows = raw.reshape(part.rows, -1)  # [rows, bytes per row]
    order = from_gguf_rows(torch.arange(part.rows), part.heads).numpy()
    return rows[order].reshape(-1)
