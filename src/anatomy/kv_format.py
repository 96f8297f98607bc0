"""What a KV cache holds its keys and values in (llama.cpp's -ctk/-ctv q8_0, vLLM's --kv-cache-dtype
fp8); `kv_bytes_per_token` is the one place their size is computed.

    kv_dtype      stored per value    per token and head    value
    f32/f16/bf16  the float           -                     x
    int8          int8 code q         float16 scale s       q * s,  s = max|x| / 127
    fp8_e4m3      fp8 code (e4m3)     float16 scale s       fp8(x / s) * s,  s = max|x| / 448
    fp8_e5m2      fp8 code (e5m2)     float16 scale s       fp8(x / s) * s,  s = max|x| / 57344
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from anatomy import dtypes
from anatomy.config import ModelConfig
from anatomy.errors import InputError

CODES = ("int8", "fp8_e4m3", "fp8_e5m2")  # the 8-bit kinds
SCALE_BYTES = 2  # each token and head's scale is a float16
LIMITS = {"int8": 127.0, "fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}  # the largest code magnitude


@dataclass(frozen=True)
class Codes:
    """8-bit keys or values as a cache returns them to attention: codes [B, H_kv, T, d_h] (int8, or an
    fp8 code's byte as uint8: torch writes no fp8 tensor in place on a CPU), scale
    float16 [B, H_kv, T], the table lut float32 [256] of each code byte's value (value = lut[code] *
    scale), and `reader`, attention that reads codes as they are (kernels/native: the engine's caches
    set it), or None: attention turns them into floats first."""

    codes: Tensor
    scale: Tensor
    lut: Tensor
    reader: Callable | None = None

    def dequantize(self, dtype: torch.dtype) -> Tensor:
        """The values [B, H_kv, T, d_h] in `dtype` (a full copy: what a reader avoids)."""
        values = self.lut[self.codes.long()] if self.codes.dtype == torch.uint8 else self.codes.float()
        return (values * self.scale.float()[..., None]).to(dtype)


@dataclass(frozen=True)
class Pages:
    """Float keys or values as a paged cache returns them to attention, where they lie: the layer's
    pool [N + 1, bs, H_kv, d_h] and the blocks each row reads, tables [B, nb] (row b's key slot t is
    pool[tables[b, t // bs], t % bs]); `reader`, attention that reads them in place (kernels/native:
    the engine's paged caches set it where it measures faster), or None: attention gathers them."""

    pool: Tensor
    tables: Tensor
    reader: Callable | None = None

    def gather(self) -> Tensor:
        """Every row's [B, H_kv, nb * bs, d_h] (a copy of each row's blocks: what a reader avoids)."""
        B, nb = self.tables.shape
        rows = self.pool.index_select(0, self.tables.reshape(-1))  # [B * nb, bs, H_kv, d_h]
        return rows.view(B, nb * self.pool.shape[1], *self.pool.shape[2:]).transpose(1, 2)


def available() -> tuple[str, ...]:
    """The KV dtypes this machine's torch can hold (fp8 needs its float8 dtypes and their casts)."""
    return tuple(name for name in dtypes.KV if name not in ("fp8_e4m3", "fp8_e5m2") or _fp8_works(name))


def parse_kv_dtype(value: str | torch.dtype | None, *, option: str = "kv_dtype") -> str | None:
    """The canonical name of a KV dtype (None stays None: the branches' dtype); InputError naming the
    option, the value and what is available otherwise."""
    if value is None:
        return None
    if isinstance(value, str) and value in CODES and value not in available():
        raise InputError(f"{dtypes._shown(option, value)}: this torch ({torch.__version__}) has no {value} on this "
                         f"machine; available: {', '.join(available())}")
    return dtypes.parse(value, option=option, choices=available()).name


def kv_bytes_per_token(config: ModelConfig, kv_dtype: str) -> int:
    """Bytes one token's keys and values take in every cached layer, an 8-bit cache's scales included
    (any dtype anatomy names: the anatomy also sizes caches anatomy does not run, such as int4)."""
    dtype = dtypes.parse(kv_dtype, option="kv_dtype", choices=dtypes.ALL)
    scales = config.kv_scales_per_token * SCALE_BYTES if dtype.name in CODES else 0
    return dtype.nbytes(config.kv_values_per_token) + scales


def code_dtype(kind: str) -> torch.dtype:
    """The dtype an 8-bit cache's codes are stored in: int8 as int8; an fp8 code as its byte (uint8:
    index_copy_ has no fp8 on a CPU), which reinterpreting makes a captured step fall back to eager."""
    return torch.int8 if kind == "int8" else torch.uint8


def quantize(x: Tensor, kind: str) -> tuple[Tensor, Tensor]:
    """x [..., d] -> (codes [..., d] in code_dtype(kind), scale float16 [...]): one scale per row of d
    values. The scale is rounded to float16 first and the codes computed with the rounded one; they are
    clamped to the code's largest magnitude (float16 rounding may put max|x| / scale a hair above it,
    which fp8 e4m3 would turn into NaN)."""
    limit = LIMITS[kind]
    amax = x.float().abs().amax(dim=-1)  # [...]
    scale = (amax / limit).to(torch.float16)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row: any scale, codes 0
    y = (x.float() / scale.float()[..., None]).clamp_(-limit, limit)
    if kind == "int8":
        return y.round_().to(torch.int8), scale
    return y.to(dtypes.DTYPES[kind].torch).view(torch.uint8), scale


def table(kind: str, device: torch.device | str = "cpu") -> Tensor:
    """float32 [256]: the value of each code byte (int8: the integer; fp8: its float), for a kernel that
    reads the codes' bytes."""
    byte = torch.arange(256, dtype=torch.uint8, device=device)
    return byte.view(torch.int8 if kind == "int8" else dtypes.DTYPES[kind].torch).float()


def _fp8_works(name: str) -> bool:
    kind = dtypes.DTYPES[name].torch
    if kind is None:
        return False
    try:
        return bool(torch.ones(2).to(kind).float().eq(1).all())
    except (RuntimeError, TypeError):
        return False
