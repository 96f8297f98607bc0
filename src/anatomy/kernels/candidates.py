"""The candidate implementations of y = x @ W^T for each weight format.

A `Form` is a layout built from a WeightFormat when a model is prepared for inference (torch's
packed int4, a dense f16 copy, FBGEMM's packed fp16, oneDNN's reordered bf16, anatomy's native
rows and tiles). A `Kernel` runs on one form with activations of one dtype; `kernel.bind(prepared)`
gives the function `x [M, K] -> y [M, N]` (no bias) that a PlannedLinear calls.

`candidates(fmt)` lists the kernels available for a format on this machine; which is fastest is
never assumed here: kernels.plan measures them. COMPILABLE_KERNELS are those that work inside
torch.compile. The table of kernels: docs/inference.md, "The candidate kernels".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from anatomy.errors import InputError
from anatomy.kernels import native
from anatomy.weights.formats import FloatWeight, Int4Weight, Int5Weight, Int8GroupWeight, Int8Weight, WeightFormat
from anatomy.weights.int6 import SUPER, Int6Weight

Prepared = tuple[Any, ...]  # what a form builds: tensors (and FBGEMM's packed-parameter object)
CHUNKED_MAX_ROWS = 16  # the chunk-parallel bmm is for decode products; above this a GEMM is threaded anyway
INT4PACK_GROUPS = (32, 64, 128, 256)
INT4PACK_N_MULTIPLE = 16


@dataclass(frozen=True)
class Form:
    """A layout built from a WeightFormat: `build(fmt) -> Prepared`, valid for the formats `accepts` takes."""

    name: str
    build: Callable[[WeightFormat], Prepared]
    accepts: Callable[[WeightFormat], bool]
    nbytes: Callable[[WeightFormat], int]  # bytes the built form holds
    keeps: Callable[[WeightFormat], bool] = lambda fmt: True  # holds a float weight without rounding it
    rows: Callable[[Prepared], Callable[[Tensor], Tensor]] | None = None  # layout -> (ids [n] -> W[ids] [n, K]), exact
    piece_rows: int = 0  # > 0: each built tensor's dim 0 holds W's rows in order, this many per index (piecewise.py)


@dataclass(frozen=True)
class Kernel:
    """One implementation of x [M, K] @ W^T on one form; `bind(prepared)` -> fn(x [M, K] act_dtype) -> [M, N]."""

    name: str
    form: Form
    act_dtype: torch.dtype | None  # None: any float dtype, the output in the input's
    bind: Callable[[Prepared], Callable[[Tensor], Tensor]]
    max_rows: int | None = None  # None: any number of rows
    accepts: Callable[[WeightFormat], bool] = lambda fmt: True  # beyond what the form accepts
    compiles: bool = True  # works inside torch.compile(fullgraph=True) (torch 2.13, checked by a slow test)
    # the integer products x is rounded for: "int8" or "int16" (AVX-512 VNNI), "amx" (AMX's int8 tiles on
    # int16 halves); None: x is taken as floats
    products: str | None = None

    def supports(self, fmt: WeightFormat) -> bool:
        return self.form.accepts(fmt) and self.accepts(fmt)


# -- forms ---------------------------------------------------------------------------------------

def _dense_form(dtype: torch.dtype) -> Form:
    def build(fmt: WeightFormat) -> Prepared:
        if isinstance(fmt, FloatWeight) and fmt.weight.dtype == dtype:
            return (fmt.weight.contiguous(),)  # no copy
        return (fmt.dequantize(dtype).contiguous(),)  # [N, K]

    name = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}[dtype]
    return Form(name, build, lambda fmt: True, lambda fmt: fmt.shape[0] * fmt.shape[1] * dtype.itemsize,
                keeps=lambda fmt: _holds(dtype, fmt))


def _holds(dtype: torch.dtype, fmt: WeightFormat) -> bool:
    """Does a `dtype` layout hold every value of `fmt` exactly? (float32 holds every float format;
    a narrower one only its own; quantized formats are rounded already.)"""
    return not isinstance(fmt, FloatWeight) or dtype in (torch.float32, fmt.weight.dtype)


def _int4pack_ok(fmt: WeightFormat) -> bool:
    return (_has_op("_weight_int4pack_mm_for_cpu") and fmt.group in INT4PACK_GROUPS
            and fmt.shape[0] % INT4PACK_N_MULTIPLE == 0)


def _build_int4pack(fmt: Int4Weight) -> Prepared:
    """torch's layout: packed codes, and [K/g, N, 2] (scale, zero) with W = (q - 8) * scale + zero."""
    q = fmt.codes_unpacked().to(torch.int32)  # [N, K]
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2)
    scale, offset = fmt.scale.float(), fmt.offset.float()  # [N, K/g]
    zero = offset + 8 * scale  # q * s + o == (q - 8) * s + (o + 8s)
    return packed, _scales_and_zeros(scale, zero)


def _scales_and_zeros(scale: Tensor, zero: Tensor) -> Tensor:
    """[N, K/g] twice -> [K/g, N, 2] bfloat16 (the activation dtype: the op takes no other)."""
    return torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)


INT4X2_ROWS = 4096  # rows converted at a time (torch packs blocks of 64 rows): its int32 input is 8x the layout


def _build_int4x2(fmt: Int8GroupWeight) -> Prepared:
    """int8 codes c = 16 * hi + lo (hi = c >> 4 in -8..7, lo = c & 15) as one int4 weight over 2K inputs:
    [hi | lo] with scales (16 d, 0) and (d, 8 d), so that x [M, K] -> [x | x] [M, 2K] gives x @ W^T."""
    packed = torch.cat([_int4x2_codes(fmt.codes[i:i + INT4X2_ROWS]) for i in range(0, fmt.shape[0], INT4X2_ROWS)])
    d = fmt.scale.float()  # [N, K/g]
    scale = torch.cat([16 * d, d], dim=1)  # [N, 2K/g]
    zero = torch.cat([torch.zeros_like(d), 8 * d], dim=1)
    return packed, _scales_and_zeros(scale, zero)


def _int4x2_codes(codes: Tensor) -> Tensor:
    """int8 codes [n, K] -> torch's packed int4 codes of [hi + 8 | lo] [n, 2K]."""
    c = codes.to(torch.int32)
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.cat([(c >> 4) + 8, c & 15], dim=1), 2)


def _build_int8pack(fmt: Int8Weight) -> Prepared:
    return fmt.codes.contiguous(), fmt.scale.to(torch.bfloat16)  # [N, K] int8, [N]


def _build_fbgemm(fmt: WeightFormat) -> Prepared:
    return (torch.ops.quantized.linear_prepack_fp16(fmt.dequantize(torch.float32), None),)


def _build_onednn(fmt: WeightFormat) -> Prepared:
    return (torch.ops.mkldnn._reorder_linear_weight(fmt.dequantize(torch.bfloat16).contiguous()),)


FBGEMM_ROW_BLOCK = 512  # FBGEMM's fp16 packing tiles the inputs (K) 512 at a time, zero-padding the last tile
FBGEMM_COL_BLOCKS = 2  # and the outputs (N) two vector widths at a time


def _fbgemm_bytes(fmt: WeightFormat) -> int:
    """Bytes FBGEMM's packed fp16 weight holds: both dimensions padded up to its tiles (K = 576 holds
    1024 rows, 1.78x the 2 bytes per weight), plus the 1 KiB its kernels read past the end."""
    N, K = fmt.shape
    lanes = 16 if "AVX512" in str(torch.backends.cpu.get_cpu_capability()) else 8  # floats per vector
    cols = lanes * FBGEMM_COL_BLOCKS
    return -(-K // FBGEMM_ROW_BLOCK) * FBGEMM_ROW_BLOCK * -(-N // cols) * cols * 2 + 1024


def _fbgemm_ok(fmt: WeightFormat) -> bool:
    return "fbgemm" in torch.backends.quantized.supported_engines


def _onednn_ok(fmt: WeightFormat) -> bool:
    return torch.backends.mkldnn.is_available() and _has_op("_is_mkldnn_bf16_supported", "mkldnn") and \
        bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def _has_op(name: str, namespace: str = "aten") -> bool:
    try:
        getattr(getattr(torch.ops, namespace), name)
    except (AttributeError, RuntimeError):
        return False
    return True


def _numel(fmt: WeightFormat) -> int:
    return fmt.shape[0] * fmt.shape[1]


NATIVE_BLOCK = 64  # they read the inputs 64 at a time


def _native_ok(fmt: WeightFormat) -> bool:
    return native.available() and fmt.shape[1] % NATIVE_BLOCK == 0


def _per_32(t: Tensor, group: int) -> Tensor:
    """Group scales [N, K/g] as scales per 32 inputs [N, K/32] (the same value over a group's sub-blocks)."""
    return t.float() if group == 32 else t.float().repeat_interleave(group // 32, dim=1)


def _build_q4x(fmt: Int4Weight) -> Prepared:
    scale, offset = _per_32(fmt.scale, fmt.group), _per_32(fmt.offset, fmt.group)
    return (torch.ops.anatomy.pack_q4(fmt.codes, scale, offset),)


def _build_q5x(fmt: Int5Weight) -> Prepared:
    scale, offset = _per_32(fmt.scale, fmt.group), _per_32(fmt.offset, fmt.group)
    return (torch.ops.anatomy.pack_q5(fmt.codes, fmt.high, scale, offset),)


def _build_q8x(fmt: Int8GroupWeight) -> Prepared:
    return (torch.ops.anatomy.pack_q8(fmt.codes, _per_32(fmt.scale, fmt.group)),)


def _build_q6x(fmt: Int6Weight) -> Prepared:
    return (torch.ops.anatomy.pack_q6(fmt.low, fmt.high, fmt.scale, fmt.d),)  # [N, K/256 * 210]


def _tiles_ok(fmt: WeightFormat) -> bool:
    """Tiles of 16 output rows: where AVX-512 VNNI runs them, for N a multiple of 16."""
    return _native_ok(fmt) and native.runs("avx512-vnni") and fmt.shape[0] % 16 == 0


def _build_q4t(fmt: Int4Weight) -> Prepared:
    return (torch.ops.anatomy.pack_q4_tiles(_build_q4x(fmt)[0], fmt.symmetric),)


def _build_q5t(fmt: Int5Weight) -> Prepared:
    return (torch.ops.anatomy.pack_q5_tiles(_build_q5x(fmt)[0], fmt.symmetric),)


def _k4t_ok(fmt: WeightFormat) -> bool:
    return isinstance(fmt, Int4Weight) and _tiles_ok(fmt) and fmt.factored


def _build_k4t(fmt: Int4Weight) -> Prepared:
    fmt.check_held()  # a released weight has no factors to find: say so, not that they do not exist
    factors = fmt.factors()
    if factors is None:
        raise InputError(f"{fmt.label} {fmt.signature}: its scales and offsets do not factor per 256 inputs "
                         "(Int4Weight.factors); k4 tiles cannot hold it")
    return (torch.ops.anatomy.pack_k4_tiles(fmt.codes, *factors),)  # [N/16, K/32, 296]


def _tile_bytes(fmt: Int4Weight | Int5Weight) -> int:
    """Bytes a q4 or q5 tile holds per 16 rows and 32 inputs (tiles.cpp): 32 fewer without the offsets."""
    full = 320 if isinstance(fmt, Int4Weight) else 384
    return full - 32 if fmt.symmetric else full


def _build_q6t(fmt: Int6Weight) -> Prepared:
    return (torch.ops.anatomy.pack_q6_tiles(_build_q6x(fmt)[0]),)  # [N/16, K/256, 3360]


def _build_q8t(fmt: Int8GroupWeight) -> Prepared:
    return (torch.ops.anatomy.pack_q8_tiles(fmt.codes, _per_32(fmt.scale, fmt.group)),)


def _l4t_ok(fmt: WeightFormat) -> bool:
    return isinstance(fmt, Int8GroupWeight) and fmt.levels is not None and fmt.group % 32 == 0 and _tiles_ok(fmt)


def _build_l4t(fmt: Int8GroupWeight) -> Prepared:
    return (torch.ops.anatomy.pack_l4_tiles(fmt.codes, _per_32(fmt.scale, fmt.group), fmt.levels),)


def _l4t_rows(p: Prepared) -> Callable[[Tensor], Tensor]:
    """Rows of W from l4 tiles [N/16, K/32, 336] (tiles.cpp: per tile and group d [16] float32, the 16
    levels, then the codes' indices as q4 tiles hold them: byte 64 v + 4 r + i of the 256 the index of row
    r, input 4 v + i in its low nibble, of input 4 (v + 4) + i in its high one): level * d, exact."""
    (tiles,) = p
    T, G, _ = tiles.shape
    d = tiles[..., :64].view(torch.float32)  # [T, G, 16]
    levels = tiles[0, 0, 64:80].view(torch.int8).float() if T else torch.zeros(16)  # one table for every tile
    nibbles = tiles[..., 80:].view(T, G, 4, 16, 4)  # [T, G, v, r, i]

    def rows(ids: Tensor) -> Tensor:
        t, r = ids // 16, ids % 16
        packed = nibbles[t, :, :, r, :]  # [n, G, 4, 4]
        index = torch.cat([packed & 15, packed >> 4], dim=2).long()  # [n, G, 8 (input 4 j + i), 4]
        return (levels[index] * d[t, :, r].float()[:, :, None, None]).reshape(ids.shape[0], G * 32)

    return rows


def _q8t_rows(p: Prepared) -> Callable[[Tensor], Tensor]:
    """Rows of W from q8 tiles [N/16, K/32, 544] (tiles.cpp: per tile and group, d [16] float16, then
    byte 64 j + 4 r + i of the codes the int8 code of row r, input 4 j + i): codes * d, exact. The dtype
    views are made here, once (a traced step cannot hold one)."""
    (tiles,) = p
    T, G, _ = tiles.shape
    d = tiles[..., :32].view(torch.float16)  # [T, G, 16], views of the tiles
    codes = tiles[..., 32:].view(torch.int8).view(T, G, 8, 16, 4)  # [T, G, j, r, i]

    def rows(ids: Tensor) -> Tensor:
        t, r = ids // 16, ids % 16
        scale = d[t, :, r].float()  # [n, G]
        q = codes[t, :, :, r, :]  # [n, G, 8, 4]
        return (q.float() * scale[:, :, None, None]).reshape(ids.shape[0], G * 32)

    return rows


def _q6x_rows(p: Prepared) -> Callable[[Tensor], Tensor]:
    """Rows of W from the q6 layout [N, K/256 * 210] (q6k.cpp: per super-block d float16, 16 int8
    sub-scales, then the code planes L0, L1 (chunks' low 4 bits, two chunks a byte) and H (each
    chunk's top 2 bits); input k is byte byte_of(k) of chunk chunk_of(k)): (q - 32) * sc * d, exact.
    The dtype views and the inputs' order are made here, once."""
    (layout,) = p
    N = layout.shape[0]
    blocks = layout.view(N, -1, 210)
    d, sc = blocks[..., 0:2].view(torch.float16), blocks[..., 2:18].view(torch.int8)  # [N, S, 1], [N, S, 16]
    planes = blocks[..., 18:82], blocks[..., 82:146], blocks[..., 146:210]  # L0, L1, H: [N, S, 64] each
    k = torch.arange(SUPER)
    order = (k % 32 // 8) * 64 + 4 * (2 * (k // 32) + k % 32 // 4 % 2) + k % 4  # input k -> chunk * 64 + byte
    shifts = torch.tensor([0, 4, 0, 4], dtype=torch.uint8).view(4, 1), torch.tensor([0, 2, 4, 6], dtype=torch.uint8)

    def rows(ids: Tensor) -> Tensor:
        low, high, top = (plane[ids] for plane in planes)  # [n, S, 64]
        lows = torch.stack([low, low, high, high], dim=2) >> shifts[0] & 0x0F  # [n, S, 4 chunks, 64]
        tops = (top[:, :, None, :] >> shifts[1].view(4, 1)) & 3
        q = (lows | tops << 4).reshape(ids.shape[0], -1, SUPER)[..., order].float() - 32  # [n, S, 256]
        scale = (d[ids].float() * sc[ids].float()).repeat_interleave(SUPER // 16, dim=-1)  # [n, S, 256]
        return (q * scale).reshape(ids.shape[0], -1)

    return rows


def _q6t_rows(p: Prepared) -> Callable[[Tensor], Tensor]:
    """Rows of W from q6 tiles [N/16, K/256, 3360] (q6_tiles.cpp: per tile and super-block d [16] float16,
    sc [16 sub-blocks, 16 rows] int8, then per group of 32 inputs 256 bytes of low nibbles as q4 tiles hold
    their codes and 128 of top bits: byte 64 u + 4 r + i, bits 2 c, 2 c + 1 those of input 4 (4 u + c) + i):
    (q - 32) * sc * d, exact. The dtype views are made here, once."""
    (tiles,) = p
    T, S, _ = tiles.shape
    d = tiles[..., :32].view(torch.float16)  # [T, S, 16]
    sc = tiles[..., 32:288].view(torch.int8).view(T, S, 16, 16)  # [T, S, sub-block, row]
    groups = tiles[..., 288:].view(T, S, 8, 384)
    low = groups[..., :256].view(T, S, 8, 4, 16, 4)  # [T, S, g, v, r, i]
    top = groups[..., 256:].view(T, S, 8, 2, 16, 4)  # [T, S, g, u, r, i]
    j = torch.arange(8)
    shifts = (2 * (j % 4)).to(torch.uint8).view(8, 1)  # code vector j: top bits at 2 (j % 4) of vector j / 4

    def rows(ids: Tensor) -> Tensor:
        t, r = ids // 16, ids % 16
        nibbles = low[t, :, :, :, r, :]  # [n, S, 8, 4, 4]
        lows = torch.cat([nibbles & 15, nibbles >> 4], dim=3)  # [n, S, g, j, i]
        tops = top[t, :, :, :, r, :][:, :, :, j // 4] >> shifts & 3
        q = (lows | tops << 4).reshape(ids.shape[0], S, SUPER).float() - 32
        scale = (d[t, :, r].float()[..., None] * sc[t, :, :, r].float()).repeat_interleave(16, dim=-1)  # [n, S, 256]
        return (q * scale).reshape(ids.shape[0], -1)

    return rows


DENSE = {dt: _dense_form(dt) for dt in (torch.float32, torch.float16, torch.bfloat16)}
INT4PACK = Form("int4pack", _build_int4pack, lambda f: isinstance(f, Int4Weight) and _int4pack_ok(f),
                lambda f: _numel(f) // 2 + _numel(f) // f.group * 4)
INT4X2 = Form("int4x2", _build_int4x2, lambda f: isinstance(f, Int8GroupWeight) and _int4pack_ok(f),
              lambda f: _numel(f) + _numel(f) // f.group * 8)
INT8PACK = Form("int8pack", _build_int8pack, lambda f: isinstance(f, Int8Weight) and _has_op("_weight_int8pack_mm"),
                lambda f: _numel(f) + f.shape[0] * 2)
FBGEMM_F16 = Form("fbgemm-f16", _build_fbgemm, _fbgemm_ok, _fbgemm_bytes,
                  keeps=lambda f: _holds(torch.float16, f))
ONEDNN_BF16 = Form("onednn-bf16", _build_onednn, _onednn_ok, lambda f: _numel(f) * 2,
                   keeps=lambda f: _holds(torch.bfloat16, f))
Q4X = Form("q4x", _build_q4x, lambda f: isinstance(f, Int4Weight) and f.group % 32 == 0 and _native_ok(f),
           lambda f: _numel(f) // NATIVE_BLOCK * 40, piece_rows=1)
Q5X = Form("q5x", _build_q5x, lambda f: isinstance(f, Int5Weight) and f.group % 32 == 0 and _native_ok(f),
           lambda f: _numel(f) // NATIVE_BLOCK * 48, piece_rows=1)
Q8X = Form("q8x", _build_q8x, lambda f: isinstance(f, Int8GroupWeight) and f.group % 32 == 0 and _native_ok(f),
           lambda f: _numel(f) // NATIVE_BLOCK * 72, piece_rows=1)
Q6X = Form("q6x", _build_q6x, lambda f: isinstance(f, Int6Weight) and f.shape[1] % SUPER == 0 and _native_ok(f),
           lambda f: _numel(f) // SUPER * 210, rows=_q6x_rows, piece_rows=1)
Q4T = Form("q4t", _build_q4t, lambda f: isinstance(f, Int4Weight) and f.group % 32 == 0 and _tiles_ok(f),
           lambda f: _numel(f) // 512 * _tile_bytes(f), piece_rows=16)
Q5T = Form("q5t", _build_q5t, lambda f: isinstance(f, Int5Weight) and f.group % 32 == 0 and _tiles_ok(f),
           lambda f: _numel(f) // 512 * _tile_bytes(f), piece_rows=16)
Q8T = Form("q8t", _build_q8t, lambda f: isinstance(f, Int8GroupWeight) and f.group % 32 == 0 and _tiles_ok(f),
           lambda f: _numel(f) // 512 * 544, rows=_q8t_rows, piece_rows=16)
Q6T = Form("q6t", _build_q6t, lambda f: isinstance(f, Int6Weight) and f.shape[1] % SUPER == 0 and _tiles_ok(f),
           lambda f: _numel(f) // SUPER * 210, rows=_q6t_rows, piece_rows=16)
L4T = Form("l4t", _build_l4t, _l4t_ok, lambda f: _numel(f) // 512 * 336, rows=_l4t_rows, piece_rows=16)
K4T = Form("k4t", _build_k4t, _k4t_ok, lambda f: _numel(f) // 512 * 296, piece_rows=16)


# -- kernels -------------------------------------------------------------------------------------

def _bind_linear(p: Prepared) -> Callable[[Tensor], Tensor]:
    (w,) = p
    return lambda x: F.linear(x, w)


def _bind_chunked(p: Prepared) -> Callable[[Tensor], Tensor]:
    """Chunk-parallel few-row product. MKL's matrix-vector product can run on one thread however
    many torch is given; viewing W [N, K] as c chunks of rows, one bmm gives each chunk a thread:
    x [c, M, K] (the same rows, expanded) @ W.view(c, N/c, K).transpose(1, 2) -> [c, M, N/c], no
    weight copied, each output the same dot product."""
    (w,) = p
    N, K = w.shape
    c = _chunks(N)
    wt = w.view(c, N // c, K).transpose(1, 2)  # [c, K, N/c], a view

    def run(x: Tensor) -> Tensor:
        M = x.shape[0]
        return torch.bmm(x.expand(c, M, K), wt).transpose(0, 1).reshape(M, N)  # [c, M, N/c] -> [M, N]

    return run


def _chunks(N: int) -> int:
    c = torch.get_num_threads()
    return c if c >= 2 and N % c == 0 else 1


def _bind_int4pack(p: Prepared) -> Callable[[Tensor], Tensor]:
    packed, sz = p
    group = _group_of(packed, sz)
    return lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x.contiguous(), packed, group, sz)


def _bind_int4x2(p: Prepared) -> Callable[[Tensor], Tensor]:
    packed, sz = p
    group = _group_of(packed, sz)
    return lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(torch.cat([x, x], dim=1), packed, group, sz)


def _group_of(packed: Tensor, sz: Tensor) -> int:
    return packed.shape[1] * 2 // sz.shape[0]  # K / (K / g); packed is [N, K/2] uint8


def _bind_int8pack(p: Prepared) -> Callable[[Tensor], Tensor]:
    codes, scale = p
    return lambda x: torch._weight_int8pack_mm(x.contiguous(), codes, scale)


def _bind_fbgemm(p: Prepared) -> Callable[[Tensor], Tensor]:
    (packed,) = p
    return lambda x: torch.ops.quantized.linear_dynamic_fp16(x, packed)


def _bind_onednn(p: Prepared) -> Callable[[Tensor], Tensor]:
    (w,) = p
    return lambda x: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")


def _bind_q4x(p: Prepared) -> Callable[[Tensor], Tensor]:
    (w,) = p
    return lambda x: torch.ops.anatomy.q4_linear(x, w)


def _bind_q5x(p: Prepared) -> Callable[[Tensor], Tensor]:
    (w,) = p
    return lambda x: torch.ops.anatomy.q5_linear(x, w)


def _bind_q8x(p: Prepared) -> Callable[[Tensor], Tensor]:
    (w,) = p
    return lambda x: torch.ops.anatomy.q8_linear(x, w)


def _bind_q6x(p: Prepared) -> Callable[[Tensor], Tensor]:
    (w,) = p
    return lambda x: torch.ops.anatomy.q6_linear(x, w)


def _bind_q4f(p: Prepared) -> Callable[[Tensor], Tensor]:
    (w,) = p
    return lambda x: torch.ops.anatomy.q4f_linear(x, w)


def _bind_q5f(p: Prepared) -> Callable[[Tensor], Tensor]:
    (w,) = p
    return lambda x: torch.ops.anatomy.q5f_linear(x, w)


def _bind_q6f(p: Prepared) -> Callable[[Tensor], Tensor]:
    (w,) = p
    return lambda x: torch.ops.anatomy.q6f_linear(x, w)


def _bind_q6s(p: Prepared) -> Callable[[Tensor], Tensor]:
    (w,) = p
    return lambda x: torch.ops.anatomy.q6s_linear(x, w)


def _avx512(fmt: WeightFormat) -> bool:
    return native.runs("avx512")


def _bind_q8f(p: Prepared) -> Callable[[Tensor], Tensor]:
    (w,) = p
    return lambda x: torch.ops.anatomy.q8f_linear(x, w)


def _bind_tiles(op: str, bits: int) -> Callable[[Prepared], Callable[[Tensor], Tensor]]:
    """A binder for anatomy's tiles product `op` (q4, q5, q6, q8, l4) with activations of `bits` (8 or 16)."""
    def bind(p: Prepared) -> Callable[[Tensor], Tensor]:
        (w,) = p
        product = getattr(torch.ops.anatomy, op)
        return lambda x: product(x, w, False, bits)

    return bind


def _amx(fmt: WeightFormat) -> bool:
    return native.runs("amx")


def _bind_amx(p: Prepared) -> Callable[[Tensor], Tensor]:
    """AMX's int8 tiles on q4, q5, q8 or l4 tiles, x rounded to int16 as for q4t16 (the same outputs)."""
    (w,) = p
    return lambda x: torch.ops.anatomy.tiles_amx_linear(x, w)


def _amx_tiles(fmt: WeightFormat) -> bool:
    return native.runs("amx") and fmt.shape[0] % 16 == 0


def _bind_q6_amx(p: Prepared) -> Callable[[Tensor], Tensor]:
    """Q6_K's product on AMX's int8 tiles, x rounded to int16 per 32 (q6s: per 256), 16 output rows at a time."""
    (w,) = p
    return lambda x: torch.ops.anatomy.q6_amx_linear(x, w)


def _chunkable(fmt: WeightFormat) -> bool:
    return _chunks(fmt.shape[0]) > 1


KERNELS: tuple[Kernel, ...] = (
    Kernel("f32", DENSE[torch.float32], torch.float32, _bind_linear),
    Kernel("f32/chunked", DENSE[torch.float32], torch.float32, _bind_chunked, CHUNKED_MAX_ROWS, _chunkable),
    Kernel("f16", DENSE[torch.float16], torch.float16, _bind_linear),
    Kernel("f16/chunked", DENSE[torch.float16], torch.float16, _bind_chunked, CHUNKED_MAX_ROWS, _chunkable),
    Kernel("bf16", DENSE[torch.bfloat16], torch.bfloat16, _bind_linear),
    Kernel("bf16/chunked", DENSE[torch.bfloat16], torch.bfloat16, _bind_chunked, CHUNKED_MAX_ROWS, _chunkable),
    Kernel("bf16/onednn", ONEDNN_BF16, torch.bfloat16, _bind_onednn, compiles=False),  # inductor lowering fails
    Kernel("f16/fbgemm", FBGEMM_F16, torch.float32, _bind_fbgemm, compiles=False),  # an opaque packed object
    Kernel("int4pack", INT4PACK, torch.bfloat16, _bind_int4pack),
    Kernel("int8g/int4x2", INT4X2, torch.bfloat16, _bind_int4x2),
    Kernel("int8pack", INT8PACK, torch.bfloat16, _bind_int8pack),
    Kernel("q4x", Q4X, None, _bind_q4x, compiles=False, products="int8"),  # an operator without a compiled form
    Kernel("q8x", Q8X, None, _bind_q8x, compiles=False, products="int8"),
    Kernel("q5x", Q5X, None, _bind_q5x, compiles=False, products="int8"),
    Kernel("q6x", Q6X, None, _bind_q6x, compiles=False, products="int8"),
    Kernel("q4f", Q4X, None, _bind_q4f, compiles=False),
    Kernel("q8f", Q8X, None, _bind_q8f, compiles=False),
    Kernel("q5f", Q5X, None, _bind_q5f, compiles=False),
    Kernel("q6f", Q6X, None, _bind_q6f, compiles=False),
    Kernel("q6s", Q6X, None, _bind_q6s, accepts=_avx512, compiles=False, products="int16"),
    Kernel("q4t", Q4T, None, _bind_tiles("q4_tiles_linear", 8), compiles=False, products="int8"),
    Kernel("q4t16", Q4T, None, _bind_tiles("q4_tiles_linear", 16), compiles=False, products="int16"),
    Kernel("q5t", Q5T, None, _bind_tiles("q5_tiles_linear", 8), compiles=False, products="int8"),
    Kernel("q5t16", Q5T, None, _bind_tiles("q5_tiles_linear", 16), compiles=False, products="int16"),
    Kernel("q8t", Q8T, None, _bind_tiles("q8_tiles_linear", 8), compiles=False, products="int8"),
    Kernel("q8t16", Q8T, None, _bind_tiles("q8_tiles_linear", 16), compiles=False, products="int16"),
    Kernel("k4t", K4T, None, _bind_tiles("q4_tiles_linear", 8), compiles=False, products="int8"),
    Kernel("k4t16", K4T, None, _bind_tiles("q4_tiles_linear", 16), compiles=False, products="int16"),
    Kernel("q4t16/amx", Q4T, None, _bind_amx, accepts=_amx, compiles=False, products="amx"),
    Kernel("k4t16/amx", K4T, None, _bind_amx, accepts=_amx, compiles=False, products="amx"),
    Kernel("q5t16/amx", Q5T, None, _bind_amx, accepts=_amx, compiles=False, products="amx"),
    Kernel("q8t16/amx", Q8T, None, _bind_amx, accepts=_amx, compiles=False, products="amx"),
    Kernel("q6s/amx", Q6X, None, _bind_q6_amx, accepts=_amx_tiles, compiles=False, products="amx"),
    Kernel("q6t", Q6T, None, _bind_tiles("q6_tiles_linear", 8), compiles=False, products="int8"),
    Kernel("q6t16", Q6T, None, _bind_tiles("q6_tiles_linear", 16), compiles=False, products="int16"),
    Kernel("l4t", L4T, None, _bind_tiles("l4_tiles_linear", 8), compiles=False, products="int8"),
    Kernel("l4t16", L4T, None, _bind_tiles("l4_tiles_linear", 16), compiles=False, products="int16"),
    Kernel("l4t16/amx", L4T, None, _bind_amx, accepts=_amx, compiles=False, products="amx"),
)
KERNELS_BY_NAME = {k.name: k for k in KERNELS}
COMPILABLE_KERNELS = tuple(k for k in KERNELS if k.compiles)  # for a plan whose layers will be compiled


def candidates(fmt: WeightFormat, kernels: tuple[Kernel, ...] = KERNELS) -> list[Kernel]:
    """The kernels that can compute with `fmt` on this machine (CPU). A dense float weight runs only
    on layouts that hold it exactly (Form.keeps): the precision a user chose (weights="f32", an f32
    checkpoint) is the precision that runs; a quantized format may run on any layout whose products
    pass the plan's accuracy check (its own rounding dominates)."""
    return [k for k in kernels if k.supports(fmt) and k.form.keeps(fmt)]


REFERENCE_BYTES = 64 << 20  # float64 weight bytes dequantized at a time for the reference product


def reference_product(fmt: WeightFormat, x: Tensor) -> Tensor:
    """x [M, K] @ W^T in float64 on the weight the format stands for: what every kernel approximates.
    W's rows are dequantized a piece at a time, so a large matrix (an LM head) is never held in float64."""
    N, K = fmt.shape
    rows = max(1, REFERENCE_BYTES // (8 * K))
    x64, out = x.double(), x.new_empty((x.shape[0], N), dtype=torch.float64)
    for start in range(0, N, rows):
        w = fmt.rows(torch.arange(start, min(N, start + rows))).double()  # [n, K]
        out[:, start:start + rows] = x64 @ w.T
    return out  # [M, N]


def relative_error(y: Tensor, ref: Tensor) -> float:
    """||y - ref|| / ||ref|| (Frobenius), computed in float64; inf for a non-finite y."""
    y = y.double()
    if not bool(torch.isfinite(y).all()):
        return float("inf")
    return float(torch.linalg.vector_norm(y - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-30))
