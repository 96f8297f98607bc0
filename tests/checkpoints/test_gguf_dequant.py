"""Dequantization of every supported ggml type against gguf-py's `gguf.quants.dequantize` (the
reference implementation maintained with llama.cpp), on random blocks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from anatomy.checkpoints.gguf_dequant import dequantize, supported_types
from anatomy.checkpoints.gguf_types import TENSOR_TYPES, TENSOR_TYPES_BY_NAME

# byte offsets of the float16 scales inside one block: random bytes there could be inf/nan
# (MXFP4's scale is an e8m0 byte: every value of it is a finite power of two)
F16_FIELDS = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q2_K": [80, 82],
              "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "IQ4_NL": [0], "IQ4_XS": [0],
              "MXFP4": []}


def _random_blocks(name: str, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    _, type_size = GGML_QUANT_SIZES[GGMLQuantizationType[name]]
    raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for offset in F16_FIELDS[name]:
        scales = rng.uniform(-2, 2, size=n_blocks).astype(np.float16)
        raw[:, offset:offset + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return raw


@pytest.mark.parametrize("name", sorted(F16_FIELDS))
@pytest.mark.parametrize("out_dtype", [None, torch.float32, torch.bfloat16])
def test_quantized_types_match_gguf_py(name, out_dtype):
    rng = np.random.default_rng(len(name))
    rows = 3
    raw = _random_blocks(name, 8 * rows, rng).reshape(rows, -1)  # 3 rows of 8 blocks
    reference = quants.dequantize(raw, GGMLQuantizationType[name])  # [3, 8 * block_size]
    ttype = TENSOR_TYPES_BY_NAME[name]
    out = None if out_dtype is None else torch.empty(reference.shape, dtype=out_dtype)
    ours = dequantize(raw.reshape(-1), ttype, reference.shape, out=out)
    assert ours.shape == reference.shape
    if out_dtype in (None, torch.float32):
        assert ours.dtype == torch.float32
        np.testing.assert_array_equal(ours.numpy().view(np.uint32), reference.view(np.uint32))  # bit for bit
    else:
        torch.testing.assert_close(ours, torch.from_numpy(reference).to(out_dtype), rtol=0, atol=0)


def test_mxfp4_every_exponent_byte():
    """e8m0 from 0 (2^-128, a float32 subnormal) to 255 (2^127, times 12: inf), each with every fp4 level."""
    raw = np.zeros((256, 17), dtype=np.uint8)
    raw[:, 0] = np.arange(256)
    raw[:, 1:] = np.arange(16, dtype=np.uint8) * 0x11  # byte j: level j in both nibbles
    with np.errstate(over="ignore"):
        reference = quants.dequantize(raw, GGMLQuantizationType.MXFP4)  # [256, 32]
    ours = dequantize(raw.reshape(-1), TENSOR_TYPES_BY_NAME["MXFP4"], reference.shape)
    np.testing.assert_array_equal(ours.numpy().view(np.uint32), reference.view(np.uint32))
    assert ours[0, 1].item() == 2.0 ** -128 and ours[255, 1].item() == 2.0 ** 127 and ours[128, 31].item() == -12
    assert ours[255, 7].item() == float("inf")


@pytest.mark.parametrize("name, np_dtype", [("F32", np.float32), ("F16", np.float16)])
def test_float_types_are_views_of_the_bytes(name, np_dtype):
    values = np.random.default_rng(0).standard_normal((4, 6)).astype(np_dtype)
    raw = values.view(np.uint8).reshape(-1)
    t = dequantize(raw, TENSOR_TYPES_BY_NAME[name], (4, 6))
    np.testing.assert_array_equal(t.numpy(), values)
    assert t.data_ptr() == raw.ctypes.data  # no copy


def test_bf16_matches_gguf_py():
    raw = np.random.default_rng(1).integers(0, 2**16, size=(5, 8), dtype=np.uint16)
    raw[(raw & 0x7F80) == 0x7F80] = 0x3F80  # no inf/nan bit patterns
    reference = quants.dequantize(raw.view(np.uint8), GGMLQuantizationType.BF16)
    ours = dequantize(raw.view(np.uint8).reshape(-1), TENSOR_TYPES_BY_NAME["BF16"], (5, 8))
    np.testing.assert_array_equal(ours.float().numpy(), reference)


def test_type_table_matches_gguf_py():
    for t in TENSOR_TYPES.values():
        assert GGML_QUANT_SIZES[GGMLQuantizationType(t.id)] == (t.block_size, t.type_size), t.name
        assert GGMLQuantizationType(t.id).name == t.name


def test_supported_types():
    assert set(supported_types()) == {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K",
                                      "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4"}
