"""RoPE's inverse frequencies, plain and scaled (linear, dynamic NTK, YaRN, Llama 3, LongRoPE).

Each rule maps the plain frequencies theta^(-2i/d), i < d/2 (d = the rotated dims), to the ones a
model was trained with, plus a factor on cos and sin (YaRN and LongRoPE scale the attention
logits that way). Dynamic NTK and LongRoPE depend on how far a pass reaches (`length`, computed
with tensor ops so nothing waits for the device; docs/foundation.md). The arithmetic follows the
published rules in float32, the precision HF transformers and llama.cpp compute them in.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from anatomy.config import RopeScaling


def plain_frequencies(theta: float | Tensor, dim: int) -> Tensor:
    """[dim/2] theta^(-2i/dim), float32 on the CPU."""
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim
    return 1.0 / (theta ** exponents)


def static_frequencies(theta: float, dim: int, scaling: RopeScaling | None) -> tuple[Tensor, float]:
    """(inverse frequencies [dim/2], cos/sin factor) of the rules that do not depend on the length.
    For dynamic and LongRoPE: those of a pass within the original context."""
    if scaling is None or scaling.kind == "dynamic":
        return plain_frequencies(theta, dim), 1.0
    if scaling.kind == "linear":
        return plain_frequencies(theta, dim) / scaling.factor, 1.0
    if scaling.kind == "llama3":
        return _llama3(plain_frequencies(theta, dim), scaling), 1.0
    if scaling.kind == "yarn":
        return _yarn(theta, dim, scaling), scaling.attention_factor
    return _longrope(theta, dim, scaling.short_factor), scaling.attention_factor  # longrope


def long_frequencies(theta: float, dim: int, scaling: RopeScaling) -> Tensor:
    """LongRoPE's frequencies past the original context."""
    return _longrope(theta, dim, scaling.long_factor)


def dynamic_frequencies(theta: float, dim: int, scaling: RopeScaling, length: Tensor) -> Tensor:
    """Dynamic NTK: base * (factor * L / orig - (factor - 1))^(dim / (dim - 2)) for a pass reaching
    L = max(length, orig) positions (at L = orig the base is unchanged)."""
    orig = scaling.original_max_seq_len
    reach = torch.clamp(length, min=orig).float()
    base = theta * ((scaling.factor * reach / orig) - (scaling.factor - 1)) ** (dim / (dim - 2))
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=length.device).float() / dim
    return 1.0 / (base ** exponents)


def _llama3(inv_freq: Tensor, s: RopeScaling) -> Tensor:
    """Wavelengths above orig/low_freq_factor are divided by factor, those below orig/high_freq_factor
    kept, those between blended linearly in orig/wavelength."""
    orig = s.original_max_seq_len
    low_wavelen, high_wavelen = orig / s.low_freq_factor, orig / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (orig / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    blended = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, blended, scaled)


def _yarn(theta: float, dim: int, s: RopeScaling) -> Tensor:
    """Dimensions rotating fewer than beta_slow times over the original context are interpolated
    (/factor), more than beta_fast times extrapolated (kept), a linear ramp between the two."""
    low, high = _yarn_range(theta, dim, s)
    pos_freqs = theta ** (torch.arange(0, dim, 2, device="cpu").float() / dim)
    extrapolated, interpolated = 1.0 / pos_freqs, 1.0 / (s.factor * pos_freqs)
    if low == high:
        high += 0.001  # a zero-width ramp would divide by zero
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low), 0, 1)
    keep = 1 - ramp  # 1: extrapolate, 0: interpolate
    return interpolated * (1 - keep) + extrapolated * keep


def _yarn_range(theta: float, dim: int, s: RopeScaling) -> tuple[float, float]:
    def dim_of(rotations: float) -> float:  # the dimension that turns `rotations` times over orig positions
        return dim * math.log(s.original_max_seq_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(s.beta_fast), dim_of(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def _longrope(theta: float, dim: int, factors: tuple[float, ...]) -> Tensor:
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim
    return 1.0 / (torch.tensor(factors, dtype=torch.float32, device="cpu") * theta ** exponents)


def yarn_mscale(factor: float, m: float = 1.0) -> float:
    """YaRN's magnitude term 0.1 m ln(factor) + 1 (1 for factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


def yarn_attention_factor(factor: float, mscale: float | None = None, mscale_all_dim: float | None = None) -> float:
    """YaRN's cos/sin factor 0.1 ln(factor) + 1 (DeepSeek's variant: the ratio of two such terms)."""
    if mscale and mscale_all_dim:
        return float(yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim))
    return yarn_mscale(factor)


def longrope_attention_factor(factor: float, original: int) -> float:
    """LongRoPE's cos/sin factor sqrt(1 + ln(factor) / ln(original context))."""
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
