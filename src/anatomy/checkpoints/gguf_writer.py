"""Write a GGUF file: metadata, tensor infos, aligned tensor data; atomically.

The file is written to a temporary file in the target's directory, flushed to disk, and renamed
over the target: a reader never sees half a file, and a failed write leaves the old file intact.
Tensor data is produced one tensor at a time, so memory holds at most one converted tensor.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from anatomy.atomic import atomic_file
from anatomy.checkpoints.gguf_types import DEFAULT_ALIGNMENT, MAGIC, SCALAR_DTYPES, TensorType, ValueType, align
from anatomy.errors import CheckpointError

VERSION = 3


@dataclass(frozen=True)
class TensorEntry:
    """A tensor to write: `data()` returns its bytes-ready numpy array (shape in torch order)."""

    name: str
    type: TensorType
    shape: tuple[int, ...]
    data: Callable[[], np.ndarray]

    @property
    def nbytes(self) -> int:
        return self.type.nbytes(int(np.prod(self.shape)))


MetadataEntry = tuple[str, tuple[ValueType, ...], Any]  # key, type path (e.g. (ARRAY, STRING)), value


def infer_types(value: Any) -> tuple[ValueType, ...]:
    """The GGUF type path of a Python value: bool, int (UINT32, or INT64 when out of its range),
    float (FLOAT32), str, numpy arrays (their dtype), lists of str / int / float."""
    if isinstance(value, (bool, np.bool_)):
        return (ValueType.BOOL,)
    if isinstance(value, (int, np.integer)):
        return (ValueType.UINT32,) if 0 <= value < 2**32 else (ValueType.INT64,)
    if isinstance(value, (float, np.floating)):
        return (ValueType.FLOAT32,)
    if isinstance(value, str):
        return (ValueType.STRING,)
    if isinstance(value, np.ndarray):
        by_dtype = {dt: vt for vt, dt in SCALAR_DTYPES.items() if vt != ValueType.BOOL}
        vt = ValueType.BOOL if value.dtype == np.bool_ else by_dtype.get(value.dtype.newbyteorder("<"))
        if vt is None:
            raise CheckpointError(f"GGUF metadata cannot hold numpy dtype {value.dtype}")
        return (ValueType.ARRAY, vt)
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, str) for v in value):
            return (ValueType.ARRAY, ValueType.STRING)
        if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value):
            return (ValueType.ARRAY, ValueType.INT32)
        if all(isinstance(v, (int, float)) for v in value):
            return (ValueType.ARRAY, ValueType.FLOAT32)
    raise CheckpointError(f"GGUF metadata cannot hold a value of type {type(value).__name__}: {value!r:.60}")


def write_gguf(path: str | Path, *, metadata: Iterable[MetadataEntry], tensors: list[TensorEntry],
               alignment: int = DEFAULT_ALIGNMENT) -> Path:
    """Write the GGUF file atomically; return its path."""
    path = Path(path)
    header = _header(list(metadata), tensors, alignment)
    with atomic_file(path) as out:
        out.write(header)
        _write_data(out, tensors, start=len(header), alignment=alignment)
    return path


def _header(metadata: list[MetadataEntry], tensors: list[TensorEntry], alignment: int) -> bytes:
    parts = [MAGIC, struct.pack("<IQQ", VERSION, len(tensors), len(metadata))]
    for key, types, value in metadata:
        parts += [_string(key), struct.pack("<I", types[0]), _value(types, value)]
    offset = 0
    for t in tensors:
        parts += [_string(t.name), struct.pack("<I", len(t.shape)),
                  struct.pack(f"<{len(t.shape)}Q", *reversed(t.shape)), struct.pack("<IQ", t.type.id, offset)]
        offset = align(offset + t.nbytes, alignment)
    header = b"".join(parts)
    return header + b"\0" * (align(len(header), alignment) - len(header))


def _write_data(out: BinaryIO, tensors: list[TensorEntry], *, start: int, alignment: int) -> None:
    written = 0
    for t in tensors:
        data = np.ascontiguousarray(t.data())
        if data.nbytes != t.nbytes:
            raise CheckpointError(f"tensor {t.name!r}: {data.nbytes} bytes of data for {t.nbytes} expected")
        out.write(memoryview(data).cast("B"))
        written += data.nbytes
        out.write(b"\0" * (align(written, alignment) - written))
        written = align(written, alignment)


def _string(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _value(types: tuple[ValueType, ...], value: Any) -> bytes:
    vtype = types[0]
    if vtype == ValueType.STRING:
        return _string(value)
    if vtype == ValueType.ARRAY:
        return _array(types[1:], value)
    return np.array(value, dtype=SCALAR_DTYPES[vtype]).tobytes()


def _array(types: tuple[ValueType, ...], values: Any) -> bytes:
    etype = types[0]
    head = struct.pack("<IQ", etype, len(values))
    if etype == ValueType.STRING:
        return head + b"".join(_string(v) for v in values)
    if etype == ValueType.ARRAY:
        return head + b"".join(_array(types[1:], v) for v in values)
    return head + np.asarray(values).astype(SCALAR_DTYPES[etype]).tobytes()

