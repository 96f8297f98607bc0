"""GGUF blocks as weight formats, carried over without requantizing: each type's bytes in the format
that holds them exactly (weights/formats.py, weights/int6.py), the codes copied, not unpacked.

    format_from_gguf(raw, ttype, shape)  Q4_0 / Q4_1 / Q4_K -> Int4Weight, Q5_0 / Q5_1 / Q5_K -> Int5Weight,
                                         Q6_K -> Int6Weight, Q8_0 / IQ4_NL / IQ4_XS / MXFP4 -> Int8GroupWeight
                                         (the IQ4/FP4 levels as int8 codes), F32 / F16 / BF16 -> FloatWeight
                                         (a view, no copy); else InputError
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from anatomy.checkpoints.gguf_dequant import (
    FP4_LEVELS,
    IQ4_LEVELS,
    iq4_xs_scales,
    k4_scales,
    mxfp4_scales,
    nibble_codes,
)
from anatomy.checkpoints.gguf_types import TensorType
from anatomy.errors import InputError
from anatomy.weights.formats import (
    FloatWeight,
    Int4Weight,
    Int5Weight,
    Int8GroupWeight,
    WeightFormat,
    compact_float,
)
from anatomy.weights.int6 import from_q6_k

_FLOAT_TYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def has_lossless_format(ttype: TensorType) -> bool:
    """Does GGUF type `ttype` have a format here that holds it exactly?"""
    return ttype.name in _FLOAT_TYPES or ttype.name in _BLOCKS


def format_from_gguf(raw: np.ndarray, ttype: TensorType, shape: tuple[int, int], *,
                     label: str = "weight") -> WeightFormat:
    """The weight [N, K] stored in `raw` (uint8 bytes of GGUF type `ttype`), in the format that
    holds it losslessly: F32/F16/BF16 -> FloatWeight (a view of `raw`), Q8_0/IQ4_NL/IQ4_XS/MXFP4 ->
    Int8GroupWeight, Q4_0/Q4_1/Q4_K -> Int4Weight, Q5_0/Q5_1/Q5_K -> Int5Weight, Q6_K -> Int6Weight. Other
    types raise InputError (dequantize them instead)."""
    if len(shape) != 2:
        raise InputError(f"{label}: a linear weight is a matrix [N, K], got shape {list(shape)}")
    N, K = shape
    if not has_lossless_format(ttype):
        raise InputError(f"{label}: GGUF type {ttype.name} has no lossless compact format here (supported: "
                         f"{', '.join([*_FLOAT_TYPES, *_BLOCKS])}); dequantize it to float instead")
    if K % ttype.block_size or raw.size != ttype.nbytes(N * K):
        raise InputError(f"{label} {list(shape)}: {raw.size} bytes of {ttype.name} do not hold it "
                         f"(K must be a multiple of {ttype.block_size}; {ttype.nbytes(N * K)} bytes expected)")
    if raw.ctypes.data % 4:
        raw = raw.copy()  # views of wider dtypes need aligned bytes
    if ttype.name in _FLOAT_TYPES:
        return FloatWeight(torch.from_numpy(raw).view(_FLOAT_TYPES[ttype.name]).view(N, K), label=label)
    blocks = raw.reshape(N, K // ttype.block_size, ttype.type_size)  # [N, blocks per row, bytes]
    return _BLOCKS[ttype.name](blocks, label)


def _f16(blocks: np.ndarray, start: int) -> Tensor:
    """The float16 at byte `start` of every block [N, nb, bytes] -> float16 [N, nb]."""
    return torch.from_numpy(np.ascontiguousarray(blocks[..., start:start + 2]).view(np.float16)[..., 0])


def _q32_codes(qs: np.ndarray) -> Tensor:
    """Q4_0/Q4_1 nibbles [N, nb, 16] -> codes [N, nb * 16]: the same order, copied out of the blocks."""
    return torch.from_numpy(np.ascontiguousarray(qs).reshape(qs.shape[0], -1))


def _q8_0(blocks: np.ndarray, label: str) -> Int8GroupWeight:
    codes = torch.from_numpy(np.ascontiguousarray(blocks[..., 2:]).view(np.int8))  # [N, nb, 32]
    return Int8GroupWeight(codes.reshape(blocks.shape[0], -1), _f16(blocks, 0), label=label)


def _q4_0(blocks: np.ndarray, label: str) -> Int4Weight:
    d = _f16(blocks, 0).float()  # [N, nb]
    return Int4Weight(_q32_codes(blocks[..., 2:]), _f16(blocks, 0), compact_float(-8 * d), symmetric=None,
                      label=label)  # exact


def _q4_1(blocks: np.ndarray, label: str) -> Int4Weight:
    return Int4Weight(_q32_codes(blocks[..., 4:]), _f16(blocks, 0), _f16(blocks, 2), label=label)


def _q4_k(blocks: np.ndarray, label: str) -> Int4Weight:
    """Q4_K super-blocks of 256 = 8 groups of 32: scale_g = d * sc_g, offset_g = -dmin * min_g (exact in
    float32: factored per 256 inputs, as the weight claims where d and dmin are finite)."""
    N, nb, _ = blocks.shape
    sc, mn = (torch.from_numpy(a) for a in k4_scales(blocks[..., 4:16].reshape(N * nb, 12)))  # [N*nb, 8]
    d, dmin = _f16(blocks, 0).float().reshape(-1, 1), _f16(blocks, 2).float().reshape(-1, 1)
    scale, offset = (d * sc).reshape(N, nb * 8), (-(dmin * mn)).reshape(N, nb * 8)
    finite = bool(torch.isfinite(d).all() and torch.isfinite(dmin).all())
    return Int4Weight(_k4_codes(blocks[..., 16:]), compact_float(scale), compact_float(offset),
                      factored=True if finite else None, label=label)


def _k4_codes(qs: np.ndarray) -> Tensor:
    """Q4_K nibbles [N, nb, 128] -> codes [N, nb * 128] in ggml's Q4_0 order.

    Each 32 bytes b of a super-block hold group 2c in their low nibbles and group 2c + 1 in their
    high ones (value j of a group in byte j); Q4_0's order puts values j and j + 16 in byte j."""
    N = qs.shape[0]
    b = torch.from_numpy(np.ascontiguousarray(qs)).view(N, -1, 4, 2, 16)  # [N, nb, chunk, bytes 0-15 / 16-31, 16]
    first, second = b[:, :, :, 0], b[:, :, :, 1]
    out = torch.empty_like(b)  # torch's elementwise loops run on every thread
    torch.bitwise_or(first & 0x0F, (second & 0x0F) << 4, out=out[:, :, :, 0])  # group 2c
    torch.bitwise_or(first >> 4, second & 0xF0, out=out[:, :, :, 1])  # group 2c + 1
    return out.view(N, -1)


def _q6_k(blocks: np.ndarray, label: str) -> WeightFormat:
    return from_q6_k(blocks, label)


def _iq4_nl(blocks: np.ndarray, label: str) -> Int8GroupWeight:
    """IQ4_NL: W = d * IQ4[q], d float16 per 32: the int8 level is the code, d the scale."""
    return Int8GroupWeight(_level_codes(IQ4_LEVELS, blocks[..., 2:]), _f16(blocks, 0), levels=_levels(IQ4_LEVELS),
                           label=label)


def _iq4_xs(blocks: np.ndarray, label: str) -> Int8GroupWeight:
    """IQ4_XS super-blocks of 256 = 8 groups of 32: W = (d * (ls - 32)) * IQ4[q]; d * (ls - 32) needs up
    to 16 bits (float32 when a float16 cannot hold every one)."""
    N, nb, _ = blocks.shape
    scale = _f16(blocks, 0).float()[..., None] * torch.from_numpy(iq4_xs_scales(blocks)).float()  # [N, nb, 8]
    codes = _level_codes(IQ4_LEVELS, blocks[..., 8:].reshape(N, nb, 8, 16))
    return Int8GroupWeight(codes, compact_float(scale.reshape(N, nb * 8)), levels=_levels(IQ4_LEVELS), label=label)


def _mxfp4(blocks: np.ndarray, label: str) -> Int8GroupWeight:
    """MXFP4: W = 2^(e - 128) * FP4[q] (the e2m1 levels doubled); the power of two is exact in float32."""
    scale = torch.from_numpy(mxfp4_scales(blocks[..., 0]))  # [N, nb]
    return Int8GroupWeight(_level_codes(FP4_LEVELS, blocks[..., 1:]), compact_float(scale), levels=_levels(FP4_LEVELS),
                           label=label)


def _levels(levels: np.ndarray) -> Tensor:
    """The table a format's codes come from (Int8GroupWeight.levels: a layout holds them as 4-bit indices)."""
    return torch.from_numpy(levels.copy())


def _level_codes(levels: np.ndarray, qs: np.ndarray) -> Tensor:
    """Nibbles [N, ..., 16] in Q4_0's order, looked up in an int8 table -> codes int8 [N, K] in value order."""
    return torch.from_numpy(levels[nibble_codes(qs)].reshape(qs.shape[0], -1))


def _q5_0(blocks: np.ndarray, label: str) -> Int5Weight:
    """Q5_0 blocks: d, 4 bytes of fifth bits, 16 bytes of nibbles; x = d * (q - 16) = q * d - 16 d (exact)."""
    d = _f16(blocks, 0)
    return Int5Weight(_q32_codes(blocks[..., 6:]), _q32_codes(blocks[..., 2:6]), d, compact_float(-16 * d.float()),
                      symmetric=None, label=label)


def _q5_1(blocks: np.ndarray, label: str) -> Int5Weight:
    """Q5_1 blocks: d, m, 4 bytes of fifth bits, 16 bytes of nibbles; x = q * d + m."""
    return Int5Weight(_q32_codes(blocks[..., 8:]), _q32_codes(blocks[..., 4:8]), _f16(blocks, 0), _f16(blocks, 2),
                      label=label)


def _q5_k(blocks: np.ndarray, label: str) -> Int5Weight:
    """Q5_K super-blocks of 256: Q4_K's d, dmin, 6-bit scales and mins and nibbles (at byte 48), and 32
    bytes of fifth bits at byte 16 (bit g of byte j: value j of group g)."""
    N, nb, _ = blocks.shape
    sc, mn = (torch.from_numpy(a) for a in k4_scales(blocks[..., 4:16].reshape(N * nb, 12)))  # [N*nb, 8]
    d, dmin = _f16(blocks, 0).float().reshape(-1, 1), _f16(blocks, 2).float().reshape(-1, 1)
    scale, offset = (d * sc).reshape(N, nb * 8), (-(dmin * mn)).reshape(N, nb * 8)
    qh = blocks[..., 16:48]  # [N, nb, 32]
    bits = (qh[:, :, None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1  # [N, nb, group, 32]
    high = np.packbits(bits, axis=-1, bitorder="little").reshape(N, nb * 32)  # per group 4 bytes, Q5_0's order
    return Int5Weight(_k4_codes(blocks[..., 48:]), torch.from_numpy(high), compact_float(scale), compact_float(offset),
                      label=label)


_BLOCKS = {"Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1, "Q4_K": _q4_k, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q5_K": _q5_k,
           "Q6_K": _q6_k, "IQ4_NL": _iq4_nl, "IQ4_XS": _iq4_xs, "MXFP4": _mxfp4}
