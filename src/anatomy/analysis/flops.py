"""Analytic matmul FLOPs of a forward pass, and their reconciliation with FlopCounterMode.

A matmul [m, k] @ [k, n] costs 2*m*k*n FLOPs, the convention of FlopCounterMode and of the 6N rule;
each layer's Q/K/V, scores, values, output and FFN products are counted from the config, for B
sequences of S queries against S_k keys. A causal mask's skippable half and a sliding window's
limit are given as a second figure; a mixture of experts counts the router and the k experts a
token uses; elementwise work is not counted, as in FlopCounterMode. Stacks whose layers differ sum
them one by one. The formulas: docs/anatomy.md, "What each section computes".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from anatomy.analysis.params import parameter_ledger
from anatomy.config import ModelConfig


@dataclass(frozen=True)
class Flops:
    """Matmul FLOPs by part; `total` sums them. `tokens` is the number of positions processed."""

    parts: dict[str, int]
    tokens: int
    per_layer: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    @property
    def projections(self) -> int:
        """Self- and cross-attention projections."""
        return sum(v for k, v in self.parts.items() if k.endswith("projections"))

    @property
    def attention_matmuls(self) -> int:
        """Q K^T and A V, of self- and cross-attention."""
        return sum(v for k, v in self.parts.items() if k.endswith("attention_matmuls"))

    @property
    def per_token(self) -> float:
        return self.total / self.tokens


def attended_pairs(q_len: int, kv_len: int, *, causal: bool, window: int | None = None) -> int:
    """Query-key pairs one head computes: all q_len*kv_len, or under a causal mask only the keys
    at or before each query (queries are the last q_len of kv_len positions), and within a sliding
    window only the last `window` of those."""
    if not causal:
        return q_len * kv_len
    first = kv_len - q_len + 1  # keys the first query sees
    return sum(min(first + i, window or kv_len) for i in range(q_len)) if window else \
        q_len * kv_len - q_len * (q_len - 1) // 2


def ffn_flops(config: ModelConfig, *, tokens: int, moe: bool) -> int:
    """A dense FFN of width d_ff, or a mixture: router + k experts + shared expert (+ its gate)."""
    D, mats = config.d_model, 3 if config.ffn == "glu" else 2
    if not moe:
        return 2 * tokens * D * config.d_ff * mats
    flops = 2 * tokens * D * config.n_experts  # router
    flops += 2 * tokens * config.n_experts_per_token * D * config.d_ff_expert * mats
    flops += 2 * tokens * D * config.d_ff_shared_expert * mats
    return flops + (2 * tokens * D if config.shared_expert_gate else 0)


def layer_flops(config: ModelConfig, *, batch: int, q_len: int, kv_len: int, causal_halving: bool = False,
                causal: bool = True, cross_len: int = 0, cross_kv: bool = True, layer: int = 0,
                windowed: bool = False) -> dict[str, int]:
    """Block `layer`'s matmul FLOPs. cross_len > 0 adds cross-attention against cross_len memory
    positions; cross_kv=False when its K/V were computed once beforehand (decoding). With
    causal_halving masked pairs are skipped (the window's too); with `windowed` a sliding-window
    layer attends to at most its window of cached positions (a window-capped KV cache)."""
    B, D = batch, config.d_model
    H, q_dim, kv_dim, d_h = config.n_heads, config.q_dim, config.kv_dim, config.head_dim
    window = config.layer_window(layer) if causal else None
    if windowed and window:
        kv_len = min(kv_len, window + q_len - 1)
    pairs = attended_pairs(q_len, kv_len, causal=causal and causal_halving, window=window if causal_halving else None)
    parts = {
        "qkv_projection": 2 * B * q_len * D * (q_dim + 2 * kv_dim),
        "attention_scores": 2 * B * H * pairs * d_h,
        "attention_values": 2 * B * H * pairs * d_h,
        "output_projection": 2 * B * q_len * q_dim * D,
        "ffn": ffn_flops(config, tokens=B * q_len, moe=causal and config.layer_is_moe(layer)),
    }
    if config.latent:
        parts.update(_latent_flops(config, batch=B, q_len=q_len, pairs=pairs))
    if cross_len:
        parts["cross_projections"] = 2 * B * q_len * D * q_dim * 2 + (2 * B * cross_len * D * 2 * kv_dim
                                                                      if cross_kv else 0)
        parts["cross_attention_matmuls"] = 2 * 2 * B * H * q_len * cross_len * d_h
    return parts


def _latent_flops(config: ModelConfig, *, batch: int, q_len: int, pairs: int) -> dict[str, int]:
    """Latent attention, absorbed (layers/latent_attention.py): the projections to q, the latent and the
    RoPE key; q_n through W_k and the attended latent through W_v (with the q/o projections); scores
    over R + r dims and values over R, per head."""
    B, D, H, R, r = batch, config.d_model, config.n_heads, config.kv_lora_rank, config.rotary_dim
    n, v, Q = config.head_dim - r, config.v_head_dim or config.head_dim, config.q_lora_rank
    q = D * Q + Q * H * (n + r) if Q else D * H * (n + r)
    return {"qkv_projection": 2 * B * q_len * (q + D * (R + r) + H * n * R),
            "attention_scores": 2 * B * H * pairs * (R + r),
            "attention_values": 2 * B * H * pairs * R,
            "output_projection": 2 * B * q_len * H * (R * v + v * D)}


def _group(layer: dict[str, int], layers: int = 1) -> dict[str, int]:
    grouped = {
        "projections": layer["qkv_projection"] + layer["output_projection"],
        "attention_matmuls": layer["attention_scores"] + layer["attention_values"],
        "ffn": layer["ffn"],
    }
    for key in ("cross_projections", "cross_attention_matmuls"):
        if key in layer:
            grouped[key] = layer[key]
    return {k: v * layers for k, v in grouped.items()}


def _stack(config: ModelConfig, layers: int, **kwargs) -> tuple[dict[str, int], dict[str, int]]:
    """(grouped FLOPs of `layers` blocks, block 0's parts): blocks are summed one kind at a time
    (window or not, mixture or not), so stacks whose layers differ are counted exactly."""
    kinds: dict[tuple, int] = {}
    for i in range(layers):
        key = (config.layer_window(i), config.layer_is_moe(i))
        kinds.setdefault(key, i)
    counts = {key: 0 for key in kinds}
    for i in range(layers):
        counts[(config.layer_window(i), config.layer_is_moe(i))] += 1
    total: dict[str, int] = {}
    for key, first in kinds.items():
        total = _add(total, _group(layer_flops(config, layer=first, **kwargs), counts[key]))
    return total, layer_flops(config, layer=0, **kwargs)


def _add(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: a.get(k, 0) + b.get(k, 0) for k in {**a, **b}}


def forward_flops(config: ModelConfig, *, batch: int, seq: int, head: str = "auto", last_only: bool = False,
                  causal_halving: bool = False) -> Flops:
    """One forward pass over [B, S] with no cache: training (LM head at all S positions) or, with
    last_only, the prefill of generation (LM head at the last position). A seq2seq model reads
    S source and S target tokens."""
    B, S, D, V = batch, seq, config.d_model, config.vocab_size
    head_rows = B * (1 if last_only else S)
    if config.is_encoder:
        layer = layer_flops(config, batch=B, q_len=S, kv_len=S, causal=False)
        parts = _group(layer, config.n_layers)
        if head == "mlm":
            parts["mlm_head"] = 2 * B * S * D * D + 2 * B * S * D * V
        return Flops(parts, B * S, layer)
    if config.is_seq2seq:
        enc = layer_flops(config, batch=B, q_len=S, kv_len=S, causal=False)
        dec = layer_flops(config, batch=B, q_len=S, kv_len=S, causal_halving=causal_halving, cross_len=S)
        parts = _add(_group(enc, config.n_layers), _group(dec, config.n_decoder_layers))
        parts["lm_head"] = 2 * head_rows * D * V
        return Flops(parts, B * S, dec)
    parts, layer = _stack(config, config.n_layers, batch=B, q_len=S, kv_len=S, causal_halving=causal_halving)
    parts["lm_head"] = 2 * head_rows * D * V
    return Flops(parts, B * S, layer)


def decode_flops(config: ModelConfig, *, batch: int, context: int, source_len: int = 0,
                 windowed: bool = True) -> Flops:
    """One decode step: B new tokens, each attending to `context` positions (itself included), or
    on a sliding-window layer (`windowed`) to its window of them; a seq2seq decoder also attends to
    source_len encoder positions whose K/V were cached. windowed=False counts what a cache of all
    `context` positions computes (anatomy's static cache masks the others, it does not skip them)."""
    if config.is_seq2seq:
        layer = layer_flops(config, batch=batch, q_len=1, kv_len=context, cross_len=source_len, cross_kv=False)
        parts = _group(layer, config.n_decoder_layers)
    else:
        parts, layer = _stack(config, config.n_layers, batch=batch, q_len=1, kv_len=context, windowed=windowed)
    parts["lm_head"] = 2 * batch * config.d_model * config.vocab_size
    return Flops(parts, batch, layer)


def training_flops_per_token(config: ModelConfig, *, seq: int) -> dict[str, float]:
    """Training costs about 3x the forward (backward: one matmul for the input gradient and one
    for the weight gradient per forward matmul). 6N is that rule with every parameter a token goes
    through (N active: k of E experts) taken as a matmul weight; 3 x forward counts the matmuls the model really does, attention included
    (dense S^2 as kernels compute it: the PaLM-style 6N + 12*L*H*d_h*S for a decoder)."""
    fwd = forward_flops(config, batch=1, seq=seq)
    return {"six_n": 6.0 * parameter_ledger(config).active, "three_forward": 3.0 * fwd.per_token,
            "attention_term": 3.0 * fwd.attention_matmuls / seq}


@dataclass(frozen=True)
class TrainingTime:
    total_flops: float
    effective_flops_per_gpu: float  # peak * MFU
    gpu_seconds: float
    gpus: int

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600

    @property
    def gpu_days(self) -> float:
        return self.gpu_seconds / 86400

    @property
    def wall_days(self) -> float:
        return self.gpu_days / self.gpus


def training_time(*, total_flops: float, peak_flops: float, mfu: float, gpus: int) -> TrainingTime:
    """Seconds on one GPU = FLOPs / (peak * MFU); wall-clock divides by the number of GPUs."""
    effective = peak_flops * mfu
    return TrainingTime(total_flops, effective, total_flops / effective, gpus)


def count_flops(run: Callable[[], Any]) -> int:
    """What torch.utils.flop_counter.FlopCounterMode counts while `run()` executes."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        run()
    return counter.get_total_flops()
