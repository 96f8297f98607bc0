"""The safetensors file format, read with every field checked and written atomically.

    [8 bytes: N, little-endian u64] [N bytes: JSON header] [data]
    header = {"__metadata__": {str: str}?, name: {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}}

Offsets are relative to the start of the data. Before any tensor is made, the header is checked
against the file: its length against the file size, the JSON, every dtype, every shape against its
byte range, every range inside the data and no two ranges overlapping. Tensors are then views of a
private (copy-on-write) memory map of the file: reading a checkpoint copies nothing.
"""

from __future__ import annotations

import json
import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from anatomy.atomic import atomic_file

from anatomy.errors import CheckpointError

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U64": torch.uint64, "U32": torch.uint32, "U16": torch.uint16, "U8": torch.uint8, "BOOL": torch.bool,
}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}
MAX_HEADER = 100_000_000  # the limit the reference implementation sets
_ENTRY_KEYS = {"dtype", "shape", "data_offsets"}


@dataclass(frozen=True)
class TensorInfo:
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int  # byte offsets into the data section
    end: int


def read_header(path: Path) -> tuple[dict[str, TensorInfo], int]:
    """The validated tensor table of a safetensors file and the file offset where its data starts."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise CheckpointError(f"{path}: file of {size} bytes is too short for the 8-byte header length")
        (n,) = struct.unpack("<Q", prefix)
        if not 2 <= n <= min(MAX_HEADER, size - 8):
            raise CheckpointError(
                f"{path}: header length {n} does not fit the file ({size} bytes; at most {MAX_HEADER})")
        raw = f.read(n)
    header = _parse_json(path, raw)
    data_size = size - 8 - n
    table = {name: _tensor_info(path, name, entry, data_size)
             for name, entry in header.items() if name != "__metadata__"}
    _check_metadata(path, header.get("__metadata__"))
    _check_no_overlap(path, table)
    return table, 8 + n


def read_tensors(path: str | Path) -> dict[str, Tensor]:
    """All tensors of a safetensors file as views of a copy-on-write memory map (nothing is copied)."""
    path = Path(path)
    table, data_start = read_header(path)
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    return {name: _view(mapped, info, data_start) for name, info in table.items()}


def write_tensors(path: str | Path, tensors: dict[str, Tensor], *, metadata: dict[str, str] | None = None) -> None:
    """Write a safetensors file atomically: to a temporary file in the same folder, then renamed over
    `path`, so a failure never leaves a partial file where a good one was."""
    path = Path(path)
    order = sorted(tensors, key=lambda name: (-tensors[name].element_size(), name))  # keeps offsets aligned
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name in order:
        t = tensors[name]
        nbytes = t.numel() * t.element_size()
        header[name] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # pad so the data section starts 8-byte aligned
    with atomic_file(path) as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for name in order:
            f.write(_bytes_of(tensors[name]))


def _parse_json(path: Path, raw: bytes) -> dict[str, Any]:
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CheckpointError(f"{path}: the header is not valid UTF-8 JSON ({type(e).__name__}: {e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: the header is a JSON {type(header).__name__}, not an object")
    return header


def _tensor_info(path: Path, name: str, entry: Any, data_size: int) -> TensorInfo:
    where = f"{path}: tensor {name!r}"
    if not isinstance(entry, dict) or set(entry) != _ENTRY_KEYS:
        keys = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
        raise CheckpointError(f"{where}: entry has fields {keys}, expected {sorted(_ENTRY_KEYS)}")
    dtype = entry["dtype"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise CheckpointError(f"{where}: field dtype={dtype!r} is not one of {', '.join(DTYPES)}")
    shape, offsets = entry["shape"], entry["data_offsets"]
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise CheckpointError(f"{where}: field shape={shape!r} is not a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
        raise CheckpointError(f"{where}: field data_offsets={offsets!r} is not a pair of non-negative integers")
    begin, end = offsets
    if not begin <= end <= data_size:
        raise CheckpointError(f"{where}: field data_offsets={offsets} lies outside the data section "
                              f"({data_size} bytes)")
    nbytes = math.prod(shape) * DTYPES[dtype].itemsize
    if nbytes != end - begin:
        raise CheckpointError(f"{where}: shape {shape} of {dtype} needs {nbytes} bytes, "
                              f"data_offsets={offsets} hold {end - begin}")
    return TensorInfo(DTYPES[dtype], tuple(shape), begin, end)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_metadata(path: Path, metadata: Any) -> None:
    ok = metadata is None or (isinstance(metadata, dict)
                              and all(isinstance(v, str) for v in metadata.values()))
    if not ok:
        raise CheckpointError(f"{path}: field __metadata__={metadata!r} is not a map of strings to strings")


def _check_no_overlap(path: Path, table: dict[str, TensorInfo]) -> None:
    previous_name, previous_end = None, 0
    for name, info in sorted(table.items(), key=lambda item: (item[1].begin, item[1].end)):
        if info.begin < previous_end:
            raise CheckpointError(f"{path}: tensor {name!r} data_offsets [{info.begin}, {info.end}] overlap "
                                  f"tensor {previous_name!r} (ends at {previous_end})")
        previous_name, previous_end = name, max(previous_end, info.end)


def _view(mapped: mmap.mmap, info: TensorInfo, data_start: int) -> Tensor:
    count = math.prod(info.shape)
    start = data_start + info.begin
    if count == 0:
        return torch.empty(info.shape, dtype=info.dtype)
    if start % info.dtype.itemsize:  # a misaligned tensor (odd writer): copy rather than make an unaligned view
        return torch.frombuffer(bytearray(mapped[start:data_start + info.end]), dtype=info.dtype).view(info.shape)
    return torch.frombuffer(mapped, dtype=info.dtype, offset=start, count=count).view(info.shape)


def _bytes_of(t: Tensor) -> memoryview:
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")
