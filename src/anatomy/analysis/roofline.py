"""The roofline of prefill and decode: is a step limited by compute or by memory traffic?

A step doing F FLOPs and moving M bytes takes at least max(F / peak, M / bandwidth); its intensity
F / M against the hardware's ridge point says which bound binds. Bytes are the weights read once
per step plus the KV cache (activations assumed on chip: lower bounds). Decode's intensity grows
with the batch until the KV reads take over; a mixture of experts reads only the experts its tokens
use, a sliding-window layer at most its window. docs/anatomy.md, "What each section computes".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from anatomy.analysis.flops import decode_flops, forward_flops
from anatomy.analysis.hardware import Hardware
from anatomy.analysis.memory import kv_bytes_per_token, kv_cache_bytes, weights_bytes
from anatomy.analysis.params import Ledger
from anatomy.config import ModelConfig


@dataclass(frozen=True)
class RooflinePoint:
    phase: str
    flops: float
    bytes: float
    tokens: int  # tokens the step produces or processes
    peak: float
    bandwidth: float

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    @property
    def ridge(self) -> float:
        return self.peak / self.bandwidth

    @property
    def compute_s(self) -> float:
        return self.flops / self.peak

    @property
    def memory_s(self) -> float:
        return self.bytes / self.bandwidth

    @property
    def time_s(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"

    @property
    def time_per_token_s(self) -> float:
        return self.time_s / self.tokens

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.time_s


def experts_touched(config: ModelConfig, tokens: int) -> float:
    """Expected experts of one mixture layer that `tokens` tokens (k each, routed evenly and
    independently) reach: k for one token, approaching E as tokens grow."""
    E, k = config.n_experts, config.n_experts_per_token
    return E * (1 - (1 - k / E) ** tokens) if E else 0.0


def weights_read_bytes(ledger: Ledger, dtype: str, *, decode: bool = False, tokens: int | None = None) -> int:
    """Weights a step streams from memory: all but the lookup tables; a seq2seq decode step does
    not touch the encoder stack; of the experts only those the step's `tokens` are routed to
    (None: all of them)."""
    params = ledger.total - ledger.lookup_params()
    if decode and ledger.config.is_seq2seq:
        params -= ledger.stack_params("encoder")
    c = ledger.config
    if c.n_experts and tokens is not None:
        resident = ledger.expert_params()
        params -= round(resident * (1 - experts_touched(c, tokens) / c.n_experts))
    return weights_bytes(params, dtype)


def prefill_point(config: ModelConfig, ledger: Ledger, hardware: Hardware, *, batch: int, seq: int,
                  weight_dtype: str, kv_dtype: str, compute_dtype: str) -> RooflinePoint:
    """The prompt pass (LM head on the last position only); an encoder's plain forward."""
    flops = forward_flops(config, batch=batch, seq=seq, last_only=not config.is_encoder).total
    moved = weights_read_bytes(ledger, weight_dtype, tokens=batch * seq) + kv_cache_bytes(
        config, batch=batch, tokens=seq, kv_dtype=kv_dtype)
    return RooflinePoint("prefill", flops, moved, batch * seq, hardware.peak(compute_dtype), hardware.bandwidth)


def decode_point(config: ModelConfig, ledger: Ledger, hardware: Hardware, *, batch: int, context: int,
                 source_len: int, weight_dtype: str, kv_dtype: str, compute_dtype: str) -> RooflinePoint:
    """One decode step of B sequences at context T: B new tokens."""
    flops = decode_flops(config, batch=batch, context=context, source_len=source_len).total
    moved = weights_read_bytes(ledger, weight_dtype, decode=True, tokens=batch) + batch * _kv_read_per_sequence(
        config, context=context, source_len=source_len, kv_dtype=kv_dtype)
    return RooflinePoint("decode", flops, moved, batch, hardware.peak(compute_dtype), hardware.bandwidth)


def _kv_read_per_sequence(config: ModelConfig, *, context: int, source_len: int, kv_dtype: str) -> int:
    """Self-attention K/V of `context` positions (a window's worth on sliding-window layers), plus a
    seq2seq decoder's cross-attention K/V."""
    cross = kv_bytes_per_token(config, kv_dtype) * source_len if config.is_seq2seq else 0
    return kv_cache_bytes(config, batch=1, tokens=context, kv_dtype=kv_dtype) + cross


def decode_compute_bound_batch(config: ModelConfig, ledger: Ledger, hardware: Hardware, *, context: int,
                               source_len: int, weight_dtype: str, kv_dtype: str, compute_dtype: str,
                               weight_bytes: int | None = None) -> int | None:
    """Smallest batch B whose decode step at context T is compute-bound, or None if none is:
    B*f / (W + B*k) >= ridge  <=>  B >= ridge*W / (f - ridge*k), which needs f > ridge*k. With
    experts, W grows with B (more experts touched): the smallest such B is searched for.
    `weight_bytes`: W as measured on a loaded model (compact formats' real bytes), for a dense one."""
    f = decode_flops(config, batch=1, context=context, source_len=source_len).total
    k = _kv_read_per_sequence(config, context=context, source_len=source_len, kv_dtype=kv_dtype)
    ridge = hardware.peak(compute_dtype) / hardware.bandwidth
    if f <= ridge * k:
        return None
    if not config.n_experts:
        w = weight_bytes if weight_bytes is not None else weights_read_bytes(ledger, weight_dtype, decode=True)
        return max(1, math.ceil(ridge * w / (f - ridge * k)))

    def bound(batch: int) -> bool:
        w = weights_read_bytes(ledger, weight_dtype, decode=True, tokens=batch)
        return batch * f >= ridge * (w + batch * k)

    high = 1
    while not bound(high):  # all experts resident bound B from above: the loop ends
        high *= 2
    low = high // 2
    while low + 1 < high:
        mid = (low + high) // 2
        low, high = (low, mid) if bound(mid) else (mid, high)
    return high
