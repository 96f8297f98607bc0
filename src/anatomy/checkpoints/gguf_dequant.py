"""ggml tensor types to torch tensors: float types as zero-copy views, quantized blocks expanded
to float32 with whole-tensor (vectorized) torch operations.

Covers Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, IQ4_NL, IQ4_XS and MXFP4, with
the arithmetic of llama.cpp's reference dequantization. The block layouts and formulas:
docs/gguf.md, "Block layouts".
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from anatomy.checkpoints.gguf_types import TensorType

_FLOAT_VIEWS = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def supported_types() -> list[str]:
    """The ggml tensor types anatomy can load."""
    return [*_FLOAT_VIEWS, *_DEQUANT]


def dequantize(raw: np.ndarray, ttype: TensorType, shape: tuple[int, ...], *, out: Tensor | None = None) -> Tensor:
    """The tensor `shape` stored in `raw` (uint8 bytes of type `ttype`).

    Without `out`, float types come back as views of `raw` in their own dtype (no copy) and
    quantized types as new float32 tensors; with `out` (a contiguous tensor of `shape`) the values
    are written into it, straight from the blocks when `out` is float32.

    The block arithmetic is numpy writing into the float32 output (ufuncs with `out=`), faster than
    the same steps in torch on uint8 tensors.
    """
    if raw.ctypes.data % 4:
        raw = raw.copy()  # a view of another dtype needs aligned bytes; GGUF's alignment normally gives them
    if ttype.name in _FLOAT_VIEWS:
        x = torch.from_numpy(raw).view(_FLOAT_VIEWS[ttype.name]).view(shape)
        return x if out is None else out.copy_(x)
    blocks = raw.reshape(-1, ttype.type_size)  # [N blocks, bytes per block]
    if out is None or out.dtype != torch.float32:
        x = torch.from_numpy(_DEQUANT[ttype.name](blocks, _empty(blocks, ttype))).view(shape)
        return x if out is None else out.copy_(x)
    _DEQUANT[ttype.name](blocks, out.numpy().reshape(blocks.shape[0], ttype.block_size))
    return out


def _empty(blocks: np.ndarray, ttype: TensorType) -> np.ndarray:
    return np.empty((blocks.shape[0], ttype.block_size), dtype=np.float32)


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The float16 at byte `start` of every block, as float32 [N, 1]."""
    return blocks[:, start:start + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, out: np.ndarray) -> np.ndarray:
    """[N, 16] bytes -> out [N, 32] float32: low nibbles are values 0..15, high nibbles 16..31."""
    halves = out.reshape(-1, 2, 16)
    np.bitwise_and(qs, 0x0F, out=halves[:, 0], casting="unsafe")
    np.right_shift(qs, 4, out=halves[:, 1], casting="unsafe")
    return out  # [N, 32]


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """[N, 4] bytes of a little-endian uint32 -> [N, 32] float32 holding 16 * bit j."""
    return np.unpackbits(qh, axis=1, bitorder="little").astype(np.float32) * 16  # [N, 32]


def _q8_0(blocks: np.ndarray, out: np.ndarray) -> np.ndarray:
    return np.multiply(blocks[:, 2:].view(np.int8), _f16(blocks, 0), out=out)


def _q4_0(blocks: np.ndarray, out: np.ndarray) -> np.ndarray:
    q = _nibbles(blocks[:, 2:], out)
    q -= 8
    q *= _f16(blocks, 0)
    return q


def _q4_1(blocks: np.ndarray, out: np.ndarray) -> np.ndarray:
    q = _nibbles(blocks[:, 4:], out)
    q *= _f16(blocks, 0)
    q += _f16(blocks, 2)
    return q


def _q5_0(blocks: np.ndarray, out: np.ndarray) -> np.ndarray:
    q = _nibbles(blocks[:, 6:], out)
    q += _high_bits(blocks[:, 2:6])
    q -= 16
    q *= _f16(blocks, 0)
    return q


def _q5_1(blocks: np.ndarray, out: np.ndarray) -> np.ndarray:
    q = _nibbles(blocks[:, 8:], out)
    q += _high_bits(blocks[:, 4:8])
    q *= _f16(blocks, 0)
    q += _f16(blocks, 2)
    return q


def k4_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's 12 bytes [N, 12] -> 6-bit scales and mins [N, 8] of the 8 groups."""
    lo, mid, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    scales = np.concatenate([lo & 63, (hi & 0x0F) | ((lo >> 6) << 4)], axis=1)
    mins = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=1)
    return scales.astype(np.float32), mins.astype(np.float32)


def _q4_k(blocks: np.ndarray, out: np.ndarray) -> np.ndarray:
    q = _k_nibbles(blocks[:, 16:], out)
    return _k_scale(q, blocks)


def _q5_k(blocks: np.ndarray, out: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    q = _k_nibbles(blocks[:, 48:], out)
    high = np.unpackbits(blocks[:, 16:48], axis=1, bitorder="little").reshape(n, 32, 8)  # [N, j, group]
    q += 16 * high.transpose(0, 2, 1).astype(np.float32)
    return _k_scale(q, blocks)


def _k_nibbles(qs: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K nibbles [N, 128] -> out as [N, 8 groups, 32]: each 32 bytes hold group 2c in their
    low nibbles and group 2c + 1 in their high ones."""
    n = qs.shape[0]
    qs = qs.reshape(n, 4, 32)  # 4 chunks of 32 bytes
    q = out.reshape(n, 4, 2, 32)
    np.bitwise_and(qs, 0x0F, out=q[:, :, 0], casting="unsafe")  # group 2c
    np.right_shift(qs, 4, out=q[:, :, 1], casting="unsafe")  # group 2c + 1
    return q.reshape(n, 8, 32)  # [N, groups, 32]


def _k_scale(q: np.ndarray, blocks: np.ndarray) -> np.ndarray:
    """q [N, 8, 32] -> d * scale_g * q - dmin * min_g, in place, from the d, dmin and 12 scale bytes."""
    scales, mins = k4_scales(blocks[:, 4:16])  # [N, 8]
    q *= (_f16(blocks, 0) * scales)[:, :, None]
    q -= (_f16(blocks, 2) * mins)[:, :, None]
    return q.reshape(q.shape[0], -1)


def _q6_k(blocks: np.ndarray, out: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    ql = blocks[:, 0:128].reshape(n, 2, 64)  # two halves of 128 values
    qh = blocks[:, 128:192].reshape(n, 2, 1, 32)
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=2)  # [N, 2, 128]: values 0-31, 32-63, 64-95, 96-127
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8)[None, None, :, None]
    high = ((qh >> shifts) & 3).reshape(n, 2, 128)  # [N, 2, 4, 32] -> [N, 2, 128]
    q = out.reshape(n, 16, 16)  # [N, 16 groups of 16]
    q[...] = (low | (high << 4)).reshape(n, 16, 16)
    q -= 32
    q *= (blocks[:, 192:208].view(np.int8) * _f16(blocks, 208))[:, :, None]  # d * scale [N, 16, 1]
    return out


def _crumbs(qs: np.ndarray) -> np.ndarray:
    """K-quant 2-bit fields [N, 64] -> [N, 16, 16] uint8: byte j of each 32 holds value j of 4 groups of 32."""
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8)[None, None, :, None]
    return ((qs.reshape(-1, 2, 1, 32) >> shifts) & 3).reshape(-1, 16, 16)  # [N, 2, 4, 32]


def _q2_k(blocks: np.ndarray, out: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    q = out.reshape(n, 16, 16)
    q[...] = _crumbs(blocks[:, 16:80])
    scales = blocks[:, 0:16]
    q *= (_f16(blocks, 80) * (scales & 0x0F))[:, :, None]
    q -= (_f16(blocks, 82) * (scales >> 4))[:, :, None]
    return out


def _q3_k_scales(s: np.ndarray) -> np.ndarray:
    """Q3_K's 12 bytes [N, 12] -> the 16 signed 6-bit scales (stored + 32) as float32."""
    low = np.concatenate([s[:, 0:8] & 0x0F, s[:, 0:8] >> 4], axis=1)  # [N, 16]
    high = (s[:, None, 8:12] >> np.array([0, 2, 4, 6], dtype=np.uint8)[None, :, None]) & 3  # [N, 4, 4]
    return (low | (high.reshape(-1, 16) << 4)).astype(np.float32) - 32


def _q3_k(blocks: np.ndarray, out: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    q = out.reshape(n, 16, 16)
    q[...] = _crumbs(blocks[:, 32:96])
    high = np.unpackbits(blocks[:, 0:32], axis=1, bitorder="little").reshape(n, 32, 8)  # [N, j, group of 32]
    q -= 4 * (1 - high.transpose(0, 2, 1).reshape(n, 16, 16).astype(np.float32))  # offset 4 when the bit is 0
    q *= (_f16(blocks, 108) * _q3_k_scales(blocks[:, 96:108]))[:, :, None]
    return out


IQ4_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)
FP4_LEVELS = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)  # e2m1, doubled


def nibble_codes(qs: np.ndarray) -> np.ndarray:
    """[..., 16] bytes -> [..., 32] uint8 in Q4_0's order: low nibbles are values 0..15, high 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def iq4_xs_scales(blocks: np.ndarray) -> np.ndarray:
    """IQ4_XS blocks [..., 136] -> the 8 signed scales ls - 32 [..., 8] (int8) of their groups of 32."""
    high = blocks[..., 2:4].copy().view(np.uint16)  # [..., 1]
    high = (high >> np.arange(0, 16, 2, dtype=np.uint16)) & 3  # [..., 8]
    low = blocks[..., 4:8, None] >> np.array([0, 4], dtype=np.uint8)  # [..., 4, 2]
    low = low.reshape(*blocks.shape[:-1], 8) & 0x0F
    return (low | (high.astype(np.uint8) << 4)).astype(np.int8) - 32


def mxfp4_scales(e: np.ndarray) -> np.ndarray:
    """MXFP4's e8m0 bytes -> float32 2^(e - 128): half the block's scale, as its levels are doubled."""
    return np.ldexp(np.float32(1), e.astype(np.int32) - 128).astype(np.float32)


def _iq4_nl(blocks: np.ndarray, out: np.ndarray) -> np.ndarray:
    np.take(IQ4_LEVELS.astype(np.float32), nibble_codes(blocks[:, 2:]), out=out)
    out *= _f16(blocks, 0)
    return out


def _iq4_xs(blocks: np.ndarray, out: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    q = out.reshape(n, 8, 32)
    np.take(IQ4_LEVELS.astype(np.float32), nibble_codes(blocks[:, 8:].reshape(n, 8, 16)), out=q)
    q *= (_f16(blocks, 0) * iq4_xs_scales(blocks))[:, :, None]
    return out


def _mxfp4(blocks: np.ndarray, out: np.ndarray) -> np.ndarray:
    np.take(FP4_LEVELS.astype(np.float32), nibble_codes(blocks[:, 1:]), out=out)
    with np.errstate(over="ignore"):  # 2^127 * 12 is inf in float32, as in ggml
        out *= mxfp4_scales(blocks[:, 0:1])
    return out


_DEQUANT = {"Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q2_K": _q2_k,
            "Q3_K": _q3_k, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k, "IQ4_NL": _iq4_nl,
            "IQ4_XS": _iq4_xs, "MXFP4": _mxfp4}
