"""A hardened GGUF reader: header, metadata and tensor layout, checked before anything is allocated.

    f = read_gguf("model.gguf")
    f.metadata["general.architecture"]        -> "llama"
    f.tensors["token_embd.weight"]            -> GGUFTensor(shape=(49152, 576) in torch order, type Q8_0, ...)
    f.raw("token_embd.weight")                -> numpy uint8 view of the tensor's bytes (memory-mapped)

Every count, length, offset and type read from the file is checked against the bytes really there
before it is used: a bad file raises CheckpointError naming the file, the field and the value.
"""

from __future__ import annotations

import itertools
import contextlib
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from anatomy.checkpoints.gguf_types import (
    DEFAULT_ALIGNMENT,
    MAGIC,
    MAX_ARRAY_DEPTH,
    MAX_DIMS,
    SCALAR_DTYPES,
    TENSOR_TYPES,
    VERSIONS,
    TensorType,
    ValueType,
    align,
)
from anatomy.errors import CheckpointError

_STRUCTS = {ValueType[name]: struct.Struct(fmt) for name, fmt in (
    ("UINT8", "<B"), ("INT8", "<b"), ("UINT16", "<H"), ("INT16", "<h"), ("UINT32", "<I"), ("INT32", "<i"),
    ("FLOAT32", "<f"), ("BOOL", "<B"), ("UINT64", "<Q"), ("INT64", "<q"), ("FLOAT64", "<d"))}
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
# the fewest bytes a metadata pair (key length 8, type 4, 1-byte value) and a tensor info
# (name length 8, n_dims 4, one dim 8, type 4, offset 8) can take: bounds the counts by the file size
_MIN_KV_BYTES = 8 + 4 + 1
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor's place in the file. `shape` is in torch order (outermost first), the reverse
    of the file's ne[] order; `offset` is absolute (from the start of the file)."""

    name: str
    shape: tuple[int, ...]
    type: TensorType
    offset: int
    nbytes: int

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=object))


@dataclass
class GGUFFile:
    """A parsed, validated GGUF file.

    metadata: key -> value. Scalars are Python int/float/bool/str; arrays of numbers are numpy
    arrays (their GGUF dtype), arrays of strings are list[str], arrays of arrays are lists.
    value_types: key -> the GGUF type path, e.g. (UINT32,) or (ARRAY, STRING), needed to write
    the value back with the same types. tensors: name -> GGUFTensor, in file order.
    """

    path: Path
    version: int
    metadata: dict[str, Any]
    value_types: dict[str, tuple[ValueType, ...]]
    tensors: dict[str, GGUFTensor]
    alignment: int
    data_offset: int
    _buffer: Any = field(repr=False, default=None)

    def raw(self, name: str) -> np.ndarray:
        """The bytes of tensor `name` as a uint8 numpy view of the memory-mapped file (no copy)."""
        t = self.tensors[name]
        return np.frombuffer(self._buffer, dtype=np.uint8, count=t.nbytes, offset=t.offset)

    def release(self, name: str) -> None:
        """Drop the pages of tensor `name` from the process's memory (touched again, they are read back
        from the file): once its values are copied into a format, its bytes need not stay resident."""
        t = self.tensors[name]
        start = t.offset - t.offset % mmap.PAGESIZE
        with contextlib.suppress(AttributeError, OSError, ValueError):  # no madvise here: pages stay
            self._buffer.madvise(mmap.MADV_DONTNEED, start, t.offset + t.nbytes - start)

    def holds(self, t: Any) -> bool:
        """Is the torch tensor t a view of this file's mapping (a float tensor read without a copy)?"""
        view = np.frombuffer(self._buffer, dtype=np.uint8)
        return view.ctypes.data <= t.untyped_storage().data_ptr() < view.ctypes.data + view.size

    def fail(self, field_name: str, value: Any, rule: str) -> CheckpointError:
        """A CheckpointError naming this file, the field, the value and the rule it breaks."""
        return _error(self.path, field_name, value, rule)


def read_gguf(path: str | Path) -> GGUFFile:
    """Parse and validate the GGUF file at `path` (memory-mapped; tensor data is not read)."""
    path = Path(path)
    buffer, size = _map(path)
    cur = _Cursor(buffer, size, path)
    version = _read_header(cur)
    n_tensors = cur.u64("tensor_count")
    n_kv = cur.u64("metadata_kv_count")
    _check_counts(cur, n_tensors, n_kv)
    metadata, types = _read_metadata(cur, n_kv)
    alignment = _alignment(path, metadata, types)
    infos = [_read_tensor_info(cur, i) for i in range(n_tensors)]
    data_offset = align(cur.pos, alignment)
    tensors = _place_tensors(path, infos, data_offset=data_offset, alignment=alignment, size=size)
    return GGUFFile(path=path, version=version, metadata=metadata, value_types=types, tensors=tensors,
                    alignment=alignment, data_offset=data_offset, _buffer=buffer)


def _error(path: Path, field_name: str, value: Any, rule: str) -> CheckpointError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return CheckpointError(f"{path}: GGUF {field_name}={shown}: {rule}")


def _map(path: Path) -> tuple[Any, int]:
    """A copy-on-write memory map of the file (writable views for torch, never written back)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < len(MAGIC) + 4 + 8 + 8:
                raise _error(path, "file size", size, "too small for a GGUF header (24 bytes)")
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY), size
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read the file: {e.strerror or e}") from e


class _Cursor:
    """Reads little-endian values from the buffer, each checked against the bytes left."""

    def __init__(self, buffer: Any, size: int, path: Path) -> None:
        self.buffer, self.size, self.path, self.pos = buffer, size, path, 0

    def need(self, n: int, field_name: str) -> int:
        """Reserve n bytes at the cursor; return their start."""
        if n > self.size - self.pos:
            raise _error(self.path, field_name, n,
                         f"needs {n} bytes at offset {self.pos} but only {self.size - self.pos} are left (truncated?)")
        start = self.pos
        self.pos += n
        return start

    def u32(self, field_name: str) -> int:
        return _U32.unpack_from(self.buffer, self.need(4, field_name))[0]

    def u64(self, field_name: str) -> int:
        return _U64.unpack_from(self.buffer, self.need(8, field_name))[0]

    def string(self, field_name: str) -> str:
        n = self.u64(f"{field_name} length")
        start = self.need(n, f"{field_name} length")
        try:
            return self.buffer[start:start + n].decode("utf-8")
        except UnicodeDecodeError as e:
            raise _error(self.path, field_name, self.buffer[start:start + min(n, 40)], f"is not valid UTF-8 ({e.reason})")

    def value_type(self, field_name: str) -> ValueType:
        code = self.u32(field_name)
        if code not in ValueType._value2member_map_:
            raise _error(self.path, field_name, code, f"unknown value type; known: {_known_value_types()}")
        return ValueType(code)

    def value(self, vtype: ValueType, field_name: str, depth: int = 0) -> tuple[Any, tuple[ValueType, ...]]:
        """One metadata value of type vtype, and its type path."""
        if vtype == ValueType.STRING:
            return self.string(field_name), (vtype,)
        if vtype == ValueType.ARRAY:
            return self.array(field_name, depth + 1)
        s = _STRUCTS[vtype]
        v = s.unpack_from(self.buffer, self.need(s.size, field_name))[0]
        if vtype == ValueType.BOOL:
            return self._bool(v, field_name), (vtype,)
        return v, (vtype,)

    def _bool(self, v: int, field_name: str) -> bool:
        if v not in (0, 1):
            raise _error(self.path, field_name, v, "a bool must be 0 or 1")
        return bool(v)

    def array(self, field_name: str, depth: int) -> tuple[Any, tuple[ValueType, ...]]:
        if depth > MAX_ARRAY_DEPTH:
            raise _error(self.path, field_name, depth, f"arrays nested deeper than {MAX_ARRAY_DEPTH} levels")
        etype = self.value_type(f"{field_name} element type")
        n = self.u64(f"{field_name} array length")
        per_item = {ValueType.STRING: 8, ValueType.ARRAY: 12}.get(etype) or SCALAR_DTYPES[etype].itemsize
        if n * per_item > self.size - self.pos:
            raise _error(self.path, f"{field_name} array length", n,
                         f"{n} elements of {etype.name} need at least {n * per_item} bytes; "
                         f"{self.size - self.pos} are left")
        if etype == ValueType.STRING:
            return self._strings(n, field_name), (ValueType.ARRAY, etype)
        if etype == ValueType.ARRAY:
            items = [self.array(f"{field_name}[{i}]", depth + 1) for i in range(n)]
            inner = items[0][1] if items else (ValueType.ARRAY, ValueType.UINT8)
            return [v for v, _ in items], (ValueType.ARRAY, *inner)
        return self._numbers(etype, n, field_name), (ValueType.ARRAY, etype)

    def _strings(self, n: int, field_name: str) -> list[str]:
        """n strings in a row: `string` inlined, as token lists hold ~10^5 of them."""
        buffer, size, pos, unpack = self.buffer, self.size, self.pos, _U64.unpack_from
        out = []
        for i in range(n):
            if size - pos < 8:
                self.pos = pos
                self.need(8, f"{field_name}[{i}] length")
            length = unpack(buffer, pos)[0]
            pos += 8
            if length > size - pos:
                self.pos = pos
                self.need(length, f"{field_name}[{i}] length")
            try:
                out.append(buffer[pos:pos + length].decode("utf-8"))
            except UnicodeDecodeError as e:
                raise _error(self.path, f"{field_name}[{i}]", buffer[pos:pos + min(length, 40)],
                             f"is not valid UTF-8 ({e.reason})")
            pos += length
        self.pos = pos
        return out

    def _numbers(self, etype: ValueType, n: int, field_name: str) -> np.ndarray:
        dt = SCALAR_DTYPES[etype]
        start = self.need(n * dt.itemsize, field_name)
        values = np.frombuffer(self.buffer, dtype=dt, count=n, offset=start).copy()
        if etype == ValueType.BOOL:
            if values.size and values.max() > 1:
                raise _error(self.path, field_name, int(values.max()), "a bool must be 0 or 1")
            values = values.astype(bool)
        return values


def _known_value_types() -> str:
    return ", ".join(f"{t.value} {t.name}" for t in ValueType)


def _read_header(cur: _Cursor) -> int:
    magic = cur.buffer[0:4]
    cur.need(4, "magic")
    if magic != MAGIC:
        raise _error(cur.path, "magic", magic, f"not a GGUF file (expected {MAGIC!r})")
    version = cur.u32("version")
    if version not in VERSIONS:
        raise _error(cur.path, "version", version, f"unsupported GGUF version; supported: {list(VERSIONS)}")
    return version


def _check_counts(cur: _Cursor, n_tensors: int, n_kv: int) -> None:
    left = cur.size - cur.pos
    if n_kv * _MIN_KV_BYTES > left:
        raise _error(cur.path, "metadata_kv_count", n_kv, f"more key/value pairs than {left} bytes can hold")
    if n_tensors * _MIN_TENSOR_INFO_BYTES > left:
        raise _error(cur.path, "tensor_count", n_tensors, f"more tensor infos than {left} bytes can hold")
    if n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_INFO_BYTES > left:
        raise _error(cur.path, "tensor_count", n_tensors,
                     f"with metadata_kv_count={n_kv}, more entries than {left} bytes can hold")


def _read_metadata(cur: _Cursor, n_kv: int) -> tuple[dict[str, Any], dict[str, tuple[ValueType, ...]]]:
    metadata: dict[str, Any] = {}
    types: dict[str, tuple[ValueType, ...]] = {}
    for i in range(n_kv):
        key = cur.string(f"metadata key #{i}")
        if not key:
            raise _error(cur.path, f"metadata key #{i}", key, "a key must not be empty")
        if key in metadata:
            raise _error(cur.path, f"metadata key #{i}", key, "duplicate key")
        vtype = cur.value_type(f"{key} value type")
        metadata[key], types[key] = cur.value(vtype, key)
    return metadata, types


def _alignment(path: Path, metadata: dict[str, Any], types: dict[str, tuple[ValueType, ...]]) -> int:
    if "general.alignment" not in metadata:
        return DEFAULT_ALIGNMENT
    value = metadata["general.alignment"]
    if types["general.alignment"] != (ValueType.UINT32,):
        raise _error(path, "general.alignment", value, "must be a UINT32")
    if value <= 0 or value & (value - 1):
        raise _error(path, "general.alignment", value, "must be a power of two")
    return value


def _read_tensor_info(cur: _Cursor, i: int) -> tuple[str, tuple[int, ...], TensorType, int]:
    """(name, shape in torch order, type, offset relative to the data section)."""
    name = cur.string(f"tensor #{i} name")
    n_dims = cur.u32(f"{name} n_dims")
    if not 1 <= n_dims <= MAX_DIMS:
        raise _error(cur.path, f"{name} n_dims", n_dims, f"must be between 1 and {MAX_DIMS}")
    ne = [cur.u64(f"{name} ne[{d}]") for d in range(n_dims)]
    for d, n in enumerate(ne):
        if n == 0:
            raise _error(cur.path, f"{name} ne[{d}]", n, "a dimension must be at least 1")
    code = cur.u32(f"{name} type")
    if code not in TENSOR_TYPES:
        known = ", ".join(f"{t.id} {t.name}" for t in TENSOR_TYPES.values())
        raise _error(cur.path, f"{name} type", code, f"unknown ggml tensor type; known: {known}")
    ttype = TENSOR_TYPES[code]
    if ne[0] % ttype.block_size:
        raise _error(cur.path, f"{name} ne[0]", ne[0],
                     f"not a multiple of the {ttype.name} block size {ttype.block_size}")
    offset = cur.u64(f"{name} offset")
    return name, tuple(reversed(ne)), ttype, offset


def _place_tensors(path: Path, infos: list, *, data_offset: int, alignment: int, size: int) -> dict[str, GGUFTensor]:
    """Check every tensor's offset alignment, byte range (inside the file) and overlap; name them."""
    tensors: dict[str, GGUFTensor] = {}
    for name, shape, ttype, rel in infos:
        if name in tensors:
            raise _error(path, "tensor name", name, "duplicate tensor name")
        if rel % alignment:
            raise _error(path, f"{name} offset", rel, f"not a multiple of general.alignment={alignment}")
        n_elements = 1
        for n in shape:
            n_elements *= n
        nbytes = ttype.nbytes(n_elements)
        start = data_offset + rel
        if start + nbytes > size:
            raise _error(path, f"{name} offset", rel,
                         f"data [{start}, {start + nbytes}) of shape {list(shape)} {ttype.name} ends past the "
                         f"end of the file ({size} bytes)")
        tensors[name] = GGUFTensor(name=name, shape=shape, type=ttype, offset=start, nbytes=nbytes)
    _check_overlaps(path, tensors.values())
    return tensors


def _check_overlaps(path: Path, tensors: Any) -> None:
    ordered = sorted(tensors, key=lambda t: t.offset)
    for a, b in itertools.pairwise(ordered):
        if a.offset + a.nbytes > b.offset:
            raise _error(path, f"{b.name} offset", b.offset,
                         f"overlaps tensor {a.name!r} [{a.offset}, {a.offset + a.nbytes})")

