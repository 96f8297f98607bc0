"""Speculative decoding on the roofline: what verifying k proposed tokens in one forward should gain.

A round runs the target once over k + 1 rows (k + 1 times the FLOPs, the weights and KV read once)
and emits E(a, k) = (1 - a^(k+1)) / (1 - a) tokens when each proposal is kept with probability a:

    speedup = E(a, k) * t_step / (t_verify(k + 1) + k * t_draft)

with every t = max(FLOPs / peak, bytes / bandwidth) on the chosen hardware (t_draft = 0 for n-gram).
`anatomy generate --stats` reports the measured counterparts (docs/speculative.md, "The prediction").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from anatomy.analysis import flops, params, roofline
from anatomy.analysis.hardware import Hardware
from anatomy.analysis.memory import kv_bytes_per_token, kv_cache_bytes
from anatomy.config import ModelConfig
from anatomy.inference.speculative.policy import expected_tokens

MAX_K = 32  # the best k is searched up to here


@dataclass(frozen=True)
class SpeculativeOptions:
    """k proposed tokens per round, per-token acceptance a; a draft model's config (None: n-gram,
    free) at `draft_dtype` weights (None: the target's dtype)."""

    k: int
    acceptance: float
    draft: ModelConfig | None = None
    draft_name: str = "n-gram (no model)"
    draft_dtype: str | None = None


@dataclass(frozen=True)
class Costs:
    """The roofline times of one round's parts at a decode context."""

    step: roofline.RooflinePoint  # a plain decode step of the target
    verify: list[roofline.RooflinePoint]  # verify[k] = one target forward over k + 1 rows, k = 0..MAX_K
    draft: roofline.RooflinePoint | None  # one decode step of the draft

    def speedup(self, k: int, a: float) -> float:
        draft_s = self.draft.time_s if self.draft is not None else 0.0
        return expected_tokens(a, k) * self.step.time_s / (self.verify[k].time_s + k * draft_s)


def verify_point(config: ModelConfig, ledger: params.Ledger, hardware: Hardware, *, rows: int, context: int,
                 weight_dtype: str, kv_dtype: str, compute_dtype: str) -> roofline.RooflinePoint:
    """One forward of one sequence over `rows` new tokens at context T: FLOPs of `rows` decode tokens,
    the weights read once, the KV cache read once and `rows` tokens' K/V written."""
    step_flops = flops.decode_flops(config, batch=rows, context=context).total
    moved = (roofline.weights_read_bytes(ledger, weight_dtype, decode=True, tokens=rows)
             + kv_cache_bytes(config, batch=1, tokens=context, kv_dtype=kv_dtype)
             + rows * kv_bytes_per_token(config, kv_dtype))
    return roofline.RooflinePoint("verify", step_flops, moved, rows, hardware.peak(compute_dtype), hardware.bandwidth)


def costs(config: ModelConfig, hardware: Hardware, options: SpeculativeOptions, *, context: int, weight_dtype: str,
          kv_dtype: str, compute_dtype: str) -> Costs:
    ledger = params.parameter_ledger(config)
    common = dict(context=context, weight_dtype=weight_dtype, kv_dtype=kv_dtype, compute_dtype=compute_dtype)
    verify = [verify_point(config, ledger, hardware, rows=k + 1, **common) for k in range(MAX_K + 1)]
    draft = None
    if options.draft is not None:
        dtype = options.draft_dtype or weight_dtype
        from anatomy.analysis.memory import compute_dtype as compute_of

        draft = verify_point(options.draft, params.parameter_ledger(options.draft), hardware, rows=1, context=context,
                             weight_dtype=dtype, kv_dtype=compute_of(dtype), compute_dtype=compute_of(dtype))
    return Costs(verify[0], verify, draft)


def speculative_report(config: ModelConfig, hardware: Hardware, options: SpeculativeOptions, *, context: int,
                       weight_dtype: str, kv_dtype: str, compute_dtype: str) -> dict[str, Any]:
    """The prediction for `inspect --speculative K --acceptance A` (keys in docs/anatomy.md)."""
    c = costs(config, hardware, options, context=context, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
              compute_dtype=compute_dtype)
    k, a = options.k, options.acceptance
    tokens = expected_tokens(a, k)
    speedup = c.speedup(k, a)
    best = max(range(1, MAX_K + 1), key=lambda j: c.speedup(j, a))
    weights = roofline.weights_read_bytes(params.parameter_ledger(config), weight_dtype, decode=True)
    return {
        "k": k, "acceptance": a, "draft": options.draft_name,
        "draft_dtype": (options.draft_dtype or weight_dtype) if options.draft is not None else None,
        "context": context,
        "expected_tokens_per_forward": tokens,
        "expected_acceptance_rate": (tokens - 1) / k,  # kept / proposed, as --stats counts it
        "step": _point(c.step),
        "verify": _point(c.verify[k]),
        "draft_step": _point(c.draft) if c.draft is not None else None,
        "round_time_s": c.verify[k].time_s + k * (c.draft.time_s if c.draft is not None else 0.0),
        "tokens_per_s": speedup * c.step.tokens_per_s,
        "plain_tokens_per_s": c.step.tokens_per_s,
        "speedup": speedup,
        "target_weight_bytes_per_token": weights / tokens,
        "plain_weight_bytes_per_token": weights,
        "best_k": best,
        "best_speedup": c.speedup(best, a),
        "break_even_acceptance": break_even(c, k),
    }


def break_even(c: Costs, k: int) -> float | None:
    """The smallest per-token acceptance at which k proposals per round pay (None: none does)."""
    if c.speedup(k, 1.0) < 1.0:
        return None
    low, high = 0.0, 1.0
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (mid, high) if c.speedup(k, mid) < 1.0 else (low, mid)
    return high


def _point(p: roofline.RooflinePoint) -> dict[str, Any]:
    return {"flops": p.flops, "bytes": p.bytes, "bound": p.bound, "time_s": p.time_s}
