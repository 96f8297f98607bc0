"""The numbers of the GGUF format: magic, versions, metadata value types and ggml tensor types.

A GGUF file is: header (magic "GGUF", version, tensor count, metadata count), metadata key/value
pairs, tensor infos (name, dims, type, offset), padding to `general.alignment`, tensor data.
Everything is little-endian. Tensor dims are listed innermost first (ne[0] is the row length),
the reverse of torch's order. Quantized types store blocks of `block_size` elements in
`type_size` bytes along ne[0].
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_ARRAY_DEPTH = 2  # an array of arrays of scalars at most


class ValueType(IntEnum):
    """Metadata value types (GGUF spec)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# numpy dtypes of the fixed-size value types (little-endian)
SCALAR_DTYPES: dict[ValueType, np.dtype] = {
    ValueType.UINT8: np.dtype("<u1"), ValueType.INT8: np.dtype("<i1"),
    ValueType.UINT16: np.dtype("<u2"), ValueType.INT16: np.dtype("<i2"),
    ValueType.UINT32: np.dtype("<u4"), ValueType.INT32: np.dtype("<i4"),
    ValueType.FLOAT32: np.dtype("<f4"), ValueType.BOOL: np.dtype("u1"),
    ValueType.UINT64: np.dtype("<u8"), ValueType.INT64: np.dtype("<i8"),
    ValueType.FLOAT64: np.dtype("<f8"),
}


@dataclass(frozen=True)
class TensorType:
    """A ggml tensor type: `block_size` elements are stored in `type_size` bytes."""

    id: int
    name: str
    block_size: int
    type_size: int

    def nbytes(self, n_elements: int) -> int:
        return n_elements // self.block_size * self.type_size


_TYPES = [
    (0, "F32", 1, 4), (1, "F16", 1, 2), (2, "Q4_0", 32, 18), (3, "Q4_1", 32, 20), (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24), (8, "Q8_0", 32, 34), (9, "Q8_1", 32, 40), (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110), (12, "Q4_K", 256, 144), (13, "Q5_K", 256, 176), (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292), (16, "IQ2_XXS", 256, 66), (17, "IQ2_XS", 256, 74), (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50), (20, "IQ4_NL", 32, 18), (21, "IQ3_S", 256, 110), (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136), (24, "I8", 1, 1), (25, "I16", 1, 2), (26, "I32", 1, 4), (27, "I64", 1, 8),
    (28, "F64", 1, 8), (29, "IQ1_M", 256, 56), (30, "BF16", 1, 2), (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66), (39, "MXFP4", 32, 17),
]
TENSOR_TYPES: dict[int, TensorType] = {t[0]: TensorType(*t) for t in _TYPES}
TENSOR_TYPES_BY_NAME: dict[str, TensorType] = {t.name: t for t in TENSOR_TYPES.values()}


def align(n: int, alignment: int) -> int:
    """n rounded up to a multiple of alignment."""
    return (n + alignment - 1) // alignment * alignment
