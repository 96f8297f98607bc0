"""Compact formats for a linear layer's weight W [N, K] (N outputs, K inputs): f32, f16, bf16,
int8 (per output channel), int8g (GGUF Q8_0), int4 (Q4_0/Q4_1/Q4_K), int5 (Q5_*) and int6 (Q6_K).

Each format is an nn.Module holding its stored tensors as buffers; it knows its `name`, its size
in bytes (`nbytes`) and the float weight it stands for (`dequantize()`, in float32 as llama.cpp's
reference does, so a GGUF file's blocks dequantize to the same values bit for bit). Kernels
(anatomy.kernels.candidates) build the layouts a product wants; the format stays portable. int4 and
int5 keep ggml's nibble order, so GGUF blocks are copied, not repacked. What each format stores:
docs/gguf.md, "Weight formats". `gguf_blocks.format_from_gguf` and `Int4Weight.from_float` make them.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from anatomy.errors import InputError
from anatomy.weights.factors import SUPER_BLOCK, factor_groups

GROUP = 32  # inputs per scale in the grouped formats (GGUF's block and K-quant sub-block size)
CODE_BLOCK = 32  # int4 codes are laid out in blocks of 32 values (ggml's order)
FLOAT_NAMES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


class WeightFormat(nn.Module):
    """A weight W [N, K] in some storage. Subclasses set `name` and implement `_values`."""

    name: ClassVar[str]
    group: int = 0  # inputs per scale (0: not grouped)

    def __init__(self, shape: tuple[int, int], *, label: str = "weight") -> None:
        super().__init__()
        self.shape = (int(shape[0]), int(shape[1]))  # (N, K)
        self.label = label

    @property
    def nbytes(self) -> int:
        """Bytes of everything stored (codes, scales, offsets)."""
        return sum(b.nbytes for b in self.buffers())

    @property
    def packed_nbytes(self) -> int:
        """Bytes of the weight packed as tightly as its values allow (a file's 4-bit indices for codes held
        as int8): what a compact layout is measured against (kernels/plan.py)."""
        return self.nbytes

    @property
    def signature(self) -> str:
        """What decides the kernels' speed and validity: name, shape, group, e.g. 'int4[960,576]g32'."""
        group = f"g{self.group}" if self.group else ""
        return f"{self.name}[{self.shape[0]},{self.shape[1]}]{group}"

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """The weight W [N, K] this format stands for, computed in float32, returned in `dtype`."""
        self.check_held()
        return self._values(*self.buffers()).to(dtype)

    def rows(self, index: Tensor) -> Tensor:
        """Rows `index` [...] of W as float32 [..., K] (an embedding lookup in a tied matrix)."""
        self.check_held()
        flat = index.reshape(-1)
        return self._values(*(b[flat] for b in self.buffers())).view(*index.shape, self.shape[1])

    def _values(self, *stored: Tensor) -> Tensor:
        """float32 [n, K] from the buffers (in registration order) of n rows."""
        raise NotImplementedError

    @property
    def released(self) -> bool:
        """Were the stored tensors given back by release()? (No format stores an empty tensor otherwise.)"""
        return any(b.numel() == 0 for b in self.buffers())

    def release(self, keep: set[int] = frozenset()) -> int:
        """Give back the memory of the stored tensors, now that a layout built from them holds the weight
        (an engine that took its model's weights): each tensor is emptied in place, so every module
        sharing it sees it empty and the format computes nothing again. Nothing is released when a
        tensor's storage is in `keep` (data pointers still read: a tied token table, a layout that is
        the tensor itself). -> bytes given back."""
        stored = list(self.buffers())
        if self.released or any(storage_id(t) in keep for t in stored):
            return 0
        freed = sum(t.nbytes for t in stored)
        with torch.no_grad():
            for t in stored:
                base = t._base  # a view keeps its base, and the base the storage: empty both
                t.set_(t.new_empty(0))
                if base is not None:
                    base.set_(base.new_empty(0))
        return freed

    def check_held(self) -> None:
        if self.released:
            raise InputError(f"{self.label} {self.signature}: its stored tensors were given to an engine's layout "
                             "(take_weights=True); load the model again to compute with it")

    def take_rows(self, index: Tensor) -> WeightFormat:
        """The same format holding rows `index` of W (row reordering, slicing)."""
        out = self._like(len(index))
        for name, buf in self.named_buffers():
            setattr(out, name, buf.index_select(0, index))  # a copy, as buf[index] is, whole rows at a time
        return out

    def take_columns(self, start: int, stop: int, *, label: str | None = None) -> WeightFormat:
        """The same format holding columns [start, stop) of W: the inputs a row-parallel shard of the
        layer sees (parallel/). A grouped format is cut along whole groups only; any other cut is an
        InputError naming the layer, the columns and the rule."""
        N, K = self.shape
        unit = max(self.group, 1)
        if not 0 <= start < stop <= K or start % unit or stop % unit:
            raise InputError(f"{self.label} {self.signature}: columns [{start}, {stop}) do not fall on its groups of "
                             f"{unit} inputs; a shard of its inputs must start and end on a multiple of {unit}")
        out = type(self).__new__(type(self))
        WeightFormat.__init__(out, (N, stop - start), label=label or self.label)
        out.group = self.group
        self._carry(out)
        for name, buf in self.named_buffers():
            per_row = buf.shape[1] if buf.dim() == 2 else 0  # values per row covering the K inputs (K, K/2, K/g)
            part = buf[:, start * per_row // K:stop * per_row // K].contiguous() if per_row else buf
            out.register_buffer(name, part)
        return out

    @classmethod
    def cat_rows(cls, parts: list[WeightFormat], *, label: str = "weight") -> WeightFormat:
        """One weight whose rows are those of `parts` in order (fusing q, k, v or gate, up)."""
        first = parts[0]
        bad = [p.signature for p in parts if p.signature.split("[")[0] != first.signature.split("[")[0]
               or p.group != first.group or p.shape[1] != first.shape[1]]
        if bad:
            raise InputError(f"{label}: cannot fuse {[p.signature for p in parts]} along rows: the parts need one "
                             f"format, group and K ({bad} differ from {first.signature})")
        out = first._like(sum(p.shape[0] for p in parts), label=label)
        if not all(first._same_kind(p) for p in parts):
            out._carry(out, alike=False)  # e.g. int8 codes of two tables: any int8 now
        for name, _ in first.named_buffers():
            out.register_buffer(name, _cat([getattr(p, name) for p in parts]))
        return out

    def _like(self, rows: int, *, label: str | None = None) -> WeightFormat:
        out = type(self).__new__(type(self))
        WeightFormat.__init__(out, (rows, self.shape[1]), label=label or self.label)
        out.group = self.group
        self._carry(out)
        for name, buf in self.named_buffers():
            out.register_buffer(name, buf, persistent=True)
        return out

    def _carry(self, out: WeightFormat, *, alike: bool = True) -> None:
        """Give a format made from this one (its rows, columns, or rows fused with others: `alike` False
        when those differ in kind) what it holds besides its per-row buffers."""

    def _same_kind(self, other: WeightFormat) -> bool:
        return True

    def extra_repr(self) -> str:
        return f"{self.signature}, {self.nbytes / 2 ** 20:.2f} MiB, {self.label!r}"


def storage_id(t: Tensor) -> int:
    """An identity of t's storage (its data pointer); an opaque tensor (oneDNN's reordered weight) shares
    none, and is its own."""
    try:
        return t.untyped_storage().data_ptr()
    except NotImplementedError:
        return -id(t)


def _cat(tensors: list[Tensor]) -> Tensor:
    """Concatenated rows; float scales of different widths (f16 and f32) meet in float32."""
    if len({t.dtype for t in tensors}) > 1:
        tensors = [t.float() for t in tensors]
    return torch.cat(tensors)


class FloatWeight(WeightFormat):
    """The weight as a float tensor (f32, f16 or bf16): `weight` [N, K]."""

    def __init__(self, weight: Tensor, *, label: str = "weight") -> None:
        _check_matrix(weight, label)
        if weight.dtype not in FLOAT_NAMES:
            raise InputError(f"{label}: dtype {weight.dtype} is not one of {sorted(FLOAT_NAMES.values())}")
        super().__init__(tuple(weight.shape), label=label)
        self.register_buffer("weight", weight)

    @property
    def name(self) -> str:  # type: ignore[override]
        return FLOAT_NAMES[self.weight.dtype]

    @classmethod
    def from_float(cls, w: Tensor, *, dtype: torch.dtype = torch.float32, label: str = "weight") -> FloatWeight:
        return cls(w.detach().to(dtype).contiguous(), label=label)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        self.check_held()
        return self.weight.to(dtype)

    def _values(self, weight: Tensor) -> Tensor:
        return weight.float()


class Int8Weight(WeightFormat):
    """int8 weight-only, symmetric per output channel: W[n, k] = codes[n, k] * scale[n]."""

    name = "int8"

    def __init__(self, codes: Tensor, scale: Tensor, *, label: str = "weight") -> None:
        _check_parts(label, codes, torch.int8, 2, (scale, (codes.shape[0],)))
        super().__init__(tuple(codes.shape), label=label)
        self.register_buffer("codes", codes)  # [N, K] int8
        self.register_buffer("scale", scale)  # [N] float32

    @classmethod
    def from_float(cls, w: Tensor, *, label: str = "weight") -> Int8Weight:
        """Round to nearest on the grid max|w[n]| / 127 (codes -127..127)."""
        _check_matrix(w, label)
        w = w.detach().float()
        scale = w.abs().amax(dim=1) / 127  # [N]
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        codes = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
        return cls(codes, scale, label=label)

    def _values(self, codes: Tensor, scale: Tensor) -> Tensor:
        return codes.float() * scale.float()[:, None]


class Int8GroupWeight(WeightFormat):
    """int8 symmetric per group of `group` inputs: W[n, k] = codes[n, k] * scale[n, k // group] (GGUF Q8_0).

    `levels` (int8 [16]): the codes are each one of these (GGUF IQ4_NL, IQ4_XS, MXFP4: a file's 4-bit
    indices into a table of levels), so a layout can hold them in 4 bits; None: any int8."""

    name = "int8g"
    levels: Tensor | None = None

    def __init__(self, codes: Tensor, scale: Tensor, *, levels: Tensor | None = None, label: str = "weight") -> None:
        _check_parts(label, codes, torch.int8, 2, (scale, (codes.shape[0], _groups(codes.shape[1], scale))))
        if levels is not None and (levels.dtype != torch.int8 or levels.shape != (16,)):
            raise InputError(f"{label}: levels must be int8 [16], got {levels.dtype} {tuple(levels.shape)}")
        super().__init__(tuple(codes.shape), label=label)
        self.group = codes.shape[1] // scale.shape[1]
        self.register_buffer("codes", codes)  # [N, K] int8
        self.register_buffer("scale", scale)  # [N, K/g] float16 or float32
        self.levels = levels

    @property
    def signature(self) -> str:
        return super().signature + ("lut" if self.levels is not None else "")

    @property
    def packed_nbytes(self) -> int:
        if self.levels is None:
            return self.nbytes
        return self.codes.numel() // 2 + self.scale.nbytes

    def _carry(self, out: WeightFormat, *, alike: bool = True) -> None:
        out.levels = self.levels if alike else None

    def _same_kind(self, other: WeightFormat) -> bool:
        theirs = getattr(other, "levels", None)
        return (self.levels is None) == (theirs is None) and (theirs is None or torch.equal(self.levels, theirs))

    @classmethod
    def from_float(cls, w: Tensor, *, group: int = GROUP, label: str = "weight") -> Int8GroupWeight:
        """Round to nearest on the grid max|w| / 127 of each group (float16 scales, as Q8_0)."""
        _check_grouped(w, group, label, "int8g")
        N, K = w.shape
        g = w.detach().float().reshape(N, K // group, group)  # [N, K/g, g]
        scale = (g.abs().amax(dim=2) / 127).half()  # [N, K/g]
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        codes = torch.round(g / scale.float()[..., None]).clamp_(-127, 127).to(torch.int8)
        return cls(codes.reshape(N, K), scale, label=label)

    def _values(self, codes: Tensor, scale: Tensor) -> Tensor:
        n, K = codes.shape
        q = codes.reshape(n, K // self.group, self.group).float()  # [n, K/g, g]
        return (q * scale.float()[..., None]).reshape(n, K)


class Symmetric:
    """What an int4 or int5 format knows of its offsets: `symmetric`, every one is -8 (int5: -16) times its
    scale (GGUF Q4_0, Q5_0: W = d * (q - 8)), so a layout may leave them out (tiles.cpp's symmetric tiles;
    the signature says "sym", as the layouts' bytes differ). Rows, columns and a fusion of symmetric parts
    stay symmetric."""

    symmetric: bool = False
    centre: int = 8  # the offset over the scale of a symmetric format, negated

    @property
    def signature(self) -> str:
        return super().signature + ("sym" if self.symmetric else "")

    def _claim(self, symmetric: bool | None, scale: Tensor, offset: Tensor, label: str) -> None:
        """Set `symmetric`: True is checked (an InputError if any offset is not -centre * scale), None is
        whether they all are (a NaN scale's is not)."""
        holds = symmetric is not False and torch.equal(offset.float(), -self.centre * scale.float())
        if symmetric and not holds:
            raise InputError(f"{label}: symmetric {self.name} needs every offset to be -{self.centre} times its "
                             f"scale; {int((offset.float() != -self.centre * scale.float()).sum())} are not")
        self.symmetric = holds

    def _carry(self, out: WeightFormat, *, alike: bool = True) -> None:
        out.symmetric = self.symmetric and alike

    def _same_kind(self, other: WeightFormat) -> bool:
        return self.symmetric == getattr(other, "symmetric", False)


class Int4Weight(Symmetric, WeightFormat):
    """int4 asymmetric per group: W[n, k] = q[n, k] * scale[n, k // group] + offset[n, k // group], q in 0..15.

    `codes` [N, K/2] uint8 in ggml's order: per block of 32 values, byte j holds q[j] (low nibble) and
    q[j + 16] (high nibble). The group is a multiple of 32. `symmetric`: every offset is -8 * scale (Symmetric).
    `factored`: groups of 32 whose scales and offsets are, per 256 inputs, whole multiples of one float16 each
    (GGUF Q4_K's; weights/factors.py): the signature says "k", as a layout may hold the factors (tiles.cpp's k4
    tiles). Claimed by a loader that made the scales so (`factored=True`), else found from the values; rows,
    fusions of factored parts and columns cut on 256 keep a True one.
    """

    name = "int4"

    def __init__(self, codes: Tensor, scale: Tensor, offset: Tensor, *, symmetric: bool | None = False,
                 factored: bool | None = None, label: str = "weight") -> None:
        groups = (codes.shape[0], _groups(codes.shape[1] * 2, scale))
        _check_parts(label, codes, torch.uint8, 2, (scale, groups), (offset, groups))
        super().__init__((codes.shape[0], codes.shape[1] * 2), label=label)
        self.group = self.shape[1] // scale.shape[1]
        self.register_buffer("codes", codes)  # [N, K/2] uint8
        self.register_buffer("scale", scale)  # [N, K/g]
        self.register_buffer("offset", offset)  # [N, K/g]
        self._claim(symmetric, scale, offset, label)
        # None: found when first asked; a claim holds only where factors() looks (asymmetric, groups of 32)
        self._factored = factored if not factored or (not self.symmetric and self.group == GROUP) else None

    @property
    def signature(self) -> str:
        return super().signature + ("k" if self.factored else "")

    @property
    def factored(self) -> bool:
        """Do the scales and offsets factor per 256 inputs (factors())? Claimed, carried, or found once while the
        weight is held."""
        if self._factored is None:
            if self.released:
                return False  # not found, nor kept: the stored tensors are gone
            self._factored = self.factors() is not None
        return self._factored

    def take_columns(self, start: int, stop: int, *, label: str | None = None) -> Int4Weight:
        out = super().take_columns(start, stop, label=label)
        if start % SUPER_BLOCK or stop % SUPER_BLOCK:
            out._factored = None  # its super-blocks are not the whole weight's: found again
        return out

    def _carry(self, out: WeightFormat, *, alike: bool = True) -> None:
        super()._carry(out, alike=alike)
        out._factored = True if alike and self._factored else None  # a part of a row set that fails may not

    def _same_kind(self, other: WeightFormat) -> bool:
        return super()._same_kind(other) and (self._factored is True) == (getattr(other, "_factored", None) is True)

    def factors(self) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
        """(d, sc, u, mn): scale = d * sc and offset = u * mn exactly, d and u float16 [N, K/256], sc and mn
        uint8 [N, K/32] (a Q4_K file's d, sc, -dmin, m); None where they do not factor so, or the weight is
        symmetric (a symmetric layout is smaller still)."""
        if self.symmetric or self.group != GROUP or self.released:
            return None
        scale = factor_groups(self.scale)
        offset = factor_groups(self.offset) if scale is not None else None
        return None if offset is None else (*scale, *offset)

    @classmethod
    def from_codes(cls, q: Tensor, scale: Tensor, offset: Tensor, *, label: str = "weight") -> Int4Weight:
        """From unpacked codes q [N, K] (0..15); scale and offset [N, K/g] are stored in their narrowest exact dtype."""
        return cls(pack_nibbles(q), compact_float(scale), compact_float(offset), label=label)

    @classmethod
    def from_float(cls, w: Tensor, *, group: int = GROUP, label: str = "weight") -> Int4Weight:
        """Round to nearest on 16 levels from min to max of each group (float16 scale and offset)."""
        _check_grouped(w, group, label, "int4", multiple=CODE_BLOCK)
        N, K = w.shape
        g = w.detach().float().reshape(N, K // group, group)  # [N, K/g, g]
        lo, hi = g.amin(dim=2), g.amax(dim=2)  # [N, K/g]
        scale = ((hi - lo) / 15).half()
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        offset = lo.half()
        q = torch.round((g - offset.float()[..., None]) / scale.float()[..., None]).clamp_(0, 15)
        return cls(pack_nibbles(q.to(torch.uint8).reshape(N, K)), scale, offset, label=label)

    def codes_unpacked(self) -> Tensor:
        """q [N, K] uint8, 0..15."""
        return unpack_nibbles(self.codes)

    def _values(self, codes: Tensor, scale: Tensor, offset: Tensor) -> Tensor:
        n, K = codes.shape[0], self.shape[1]
        q = unpack_nibbles(codes).reshape(n, K // self.group, self.group).float()  # [n, K/g, g]
        w = q * scale.float()[..., None] + offset.float()[..., None]  # two roundings, as ggml's
        return w.reshape(n, K)


class Int5Weight(Symmetric, WeightFormat):
    """int5 asymmetric per group: W[n, k] = q[n, k] * scale[n, k // group] + offset[n, k // group], q in 0..31.

    `codes` [N, K/2] uint8: q's low 4 bits in ggml's nibble order (Int4Weight's); `high` [N, K/8] uint8:
    q's fifth bits, per block of 32 values 4 bytes whose bit j (little-endian) is value j's (GGUF Q5_0's
    qh). The group is a multiple of 32. `symmetric`: every offset is -16 * scale (Symmetric).
    """

    name = "int5"
    centre = 16

    def __init__(self, codes: Tensor, high: Tensor, scale: Tensor, offset: Tensor, *, symmetric: bool | None = False,
                 label: str = "weight") -> None:
        groups = (codes.shape[0], _groups(codes.shape[1] * 2, scale))
        _check_parts(label, codes, torch.uint8, 2, (scale, groups), (offset, groups))
        if high.dtype != torch.uint8 or tuple(high.shape) != (codes.shape[0], codes.shape[1] // 4):
            want = [codes.shape[0], codes.shape[1] // 4]
            raise InputError(f"{label}: the fifth bits must be uint8 [N, K/8] = {want} for codes "
                             f"{list(codes.shape)}, got {high.dtype} {list(high.shape)}")
        super().__init__((codes.shape[0], codes.shape[1] * 2), label=label)
        self.group = self.shape[1] // scale.shape[1]
        self.register_buffer("codes", codes)  # [N, K/2] uint8
        self.register_buffer("high", high)  # [N, K/8] uint8
        self.register_buffer("scale", scale)  # [N, K/g]
        self.register_buffer("offset", offset)  # [N, K/g]
        self._claim(symmetric, scale, offset, label)

    @classmethod
    def from_codes(cls, q: Tensor, scale: Tensor, offset: Tensor, *, label: str = "weight") -> Int5Weight:
        """From unpacked codes q [N, K] (0..31); scale and offset [N, K/g] are stored in their narrowest exact dtype."""
        q = q.to(torch.uint8)
        return cls(pack_nibbles(q & 0x0F), pack_bits(q >> 4), compact_float(scale), compact_float(offset), label=label)

    @classmethod
    def from_float(cls, w: Tensor, *, group: int = GROUP, label: str = "weight") -> Int5Weight:
        """Round to nearest on 32 levels from min to max of each group (float16 scale and offset)."""
        _check_grouped(w, group, label, "int5", multiple=CODE_BLOCK)
        N, K = w.shape
        g = w.detach().float().reshape(N, K // group, group)  # [N, K/g, g]
        lo, hi = g.amin(dim=2), g.amax(dim=2)  # [N, K/g]
        scale = ((hi - lo) / 31).half()
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        offset = lo.half()
        q = torch.round((g - offset.float()[..., None]) / scale.float()[..., None]).clamp_(0, 31)
        return cls.from_codes(q.reshape(N, K), scale, offset, label=label)

    @classmethod
    def from_int4(cls, fmt: Int4Weight) -> Int5Weight:
        """The same weight, exactly (every fifth bit 0): to fuse an int4 part with int5 ones."""
        high = torch.zeros(fmt.shape[0], fmt.shape[1] // 8, dtype=torch.uint8)
        return cls(fmt.codes, high, fmt.scale, fmt.offset, label=fmt.label)

    def as_int8g(self) -> Int8GroupWeight | None:
        """The same weight as int8 groups (codes q - 16) when every offset is -16 * scale (GGUF Q5_0),
        exactly; else None."""
        scale = self.scale.float()
        if not torch.equal(self.offset.float(), -16 * scale):
            return None
        codes = (self.codes_unpacked().to(torch.int16) - 16).to(torch.int8)  # [N, K]
        per_32 = self.scale.repeat_interleave(self.group // CODE_BLOCK, dim=1)  # [N, K/32]
        return Int8GroupWeight(codes, per_32, label=self.label)

    def codes_unpacked(self) -> Tensor:
        """q [N, K] uint8, 0..31."""
        return unpack_nibbles(self.codes) | (unpack_bits(self.high) << 4)

    def _values(self, codes: Tensor, high: Tensor, scale: Tensor, offset: Tensor) -> Tensor:
        n, K = codes.shape[0], self.shape[1]
        q = unpack_nibbles(codes) | (unpack_bits(high) << 4)  # [n, K]
        q = q.reshape(n, K // self.group, self.group).float()  # [n, K/g, g]
        w = q * scale.float()[..., None] + offset.float()[..., None]  # two roundings, as ggml's
        return w.reshape(n, K)


def pack_nibbles(q: Tensor) -> Tensor:
    """q [N, K] of 0..15 -> [N, K/2] uint8 in ggml's order (per 32 values: byte j = q[j] | q[j + 16] << 4)."""
    N, K = q.shape
    halves = q.to(torch.uint8).reshape(N, K // CODE_BLOCK, 2, CODE_BLOCK // 2)  # [N, blocks, low/high, 16]
    return (halves[:, :, 0] | (halves[:, :, 1] << 4)).reshape(N, K // 2)


def unpack_nibbles(codes: Tensor) -> Tensor:
    """[N, K/2] uint8 -> q [N, K] uint8 (the inverse of pack_nibbles)."""
    N = codes.shape[0]
    c = codes.reshape(N, -1, 1, CODE_BLOCK // 2)  # [N, blocks, 1, 16]
    return torch.cat([c & 0x0F, c >> 4], dim=2).reshape(N, -1)


_BIT = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)


def pack_bits(b: Tensor) -> Tensor:
    """b [N, K] of 0/1 -> [N, K/8] uint8: bit i of byte j is b[8j + i] (little-endian, GGUF's qh)."""
    N, K = b.shape
    return (b.to(torch.uint8).reshape(N, K // 8, 8) * _BIT).sum(dim=2, dtype=torch.uint8)


def unpack_bits(packed: Tensor) -> Tensor:
    """[N, K/8] uint8 -> b [N, K] uint8 of 0/1 (the inverse of pack_bits)."""
    return ((packed[..., None] & _BIT) != 0).to(torch.uint8).reshape(packed.shape[0], -1)


def compact_float(t: Tensor) -> Tensor:
    """t in float16 when that is exact for every element, else in float32."""
    t = t.float()
    half = t.half()
    return half if torch.equal(half.float(), t) else t


def _groups(K: int, scale: Tensor) -> int:
    """The number of groups a scale tensor [N, K/g] claims, when it divides K (else -1: a mismatch)."""
    n = scale.shape[-1] if scale.dim() == 2 else 0
    return n if n and K % n == 0 else -1


def _check_parts(label: str, codes: Tensor, dtype: torch.dtype, dims: int, *others: tuple[Tensor, tuple]) -> None:
    """codes of `dtype` with `dims` non-empty dims; each (tensor, shape) of that shape and a float dtype."""
    if codes.dtype != dtype or codes.dim() != dims or 0 in codes.shape:
        raise InputError(f"{label}: codes must be a non-empty {dims}-d {dtype} tensor, got {codes.dtype} "
                         f"{list(codes.shape)}")
    for t, shape in others:
        if tuple(t.shape) != shape or not t.dtype.is_floating_point:
            raise InputError(f"{label}: scales/offsets must be float {list(shape)} for codes {list(codes.shape)} "
                             f"(one per row and group), got {t.dtype} {list(t.shape)}")


def _check_matrix(w: Tensor, label: str) -> None:
    if w.dim() != 2 or w.shape[0] == 0 or w.shape[1] == 0:
        raise InputError(f"{label}: a linear weight is a non-empty matrix [N, K], got shape {list(w.shape)}")


def _check_grouped(w: Tensor, group: int, label: str, name: str, *, multiple: int = 1) -> None:
    _check_matrix(w, label)
    if group <= 0 or group % multiple:
        raise InputError(f"{label}: {name} needs a group size that is a positive multiple of {multiple}, got {group}")
    if w.shape[1] % group:
        raise InputError(f"{label} {list(w.shape)}: {name} stores one scale per group of {group} inputs: K="
                         f"{w.shape[1]} must be a multiple of the group size {group}")
