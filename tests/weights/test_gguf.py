"""A fused matrix of GGUF parts of different types (llama.cpp's Q4_K_M mixes: q, k Q5_0 beside v Q8_0;
Q4_K beside Q5_0) is kept in one format that holds every part exactly, or dequantized when none does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from anatomy.checkpoints.gguf_types import TENSOR_TYPES_BY_NAME
from anatomy.weights.formats import Int4Weight, Int5Weight, Int8GroupWeight, WeightFormat
from anatomy.weights.gguf_blocks import format_from_gguf
from anatomy.weights.gguf import one_format

gguf = pytest.importorskip("gguf")


def _part(type_name: str, rows: int, K: int = 256, seed: int = 0) -> WeightFormat:
    """gguf-py's quantization of a random [rows, K] matrix, read as its lossless format."""
    x = np.random.default_rng(seed).standard_normal((rows, K)).astype(np.float32) * 0.05
    raw = gguf.quants.quantize(x, gguf.GGMLQuantizationType[type_name]).reshape(-1)
    return format_from_gguf(raw, TENSOR_TYPES_BY_NAME[type_name], (rows, K), label=type_name)


def _fused_values(parts: list[WeightFormat]) -> torch.Tensor:
    return torch.cat([p.dequantize() for p in parts])


def test_q5_0_beside_q8_0_fuses_as_int8g_exactly():
    parts = [_part("Q5_0", 64), _part("Q5_0", 16, seed=1), _part("Q8_0", 16, seed=2)]
    same = one_format(parts)
    assert [type(p) for p in same] == [Int8GroupWeight] * 3
    fused = WeightFormat.cat_rows(same, label="qkv")
    assert torch.equal(fused.dequantize(), _fused_values(parts))


def test_q4_0_beside_q5_1_fuses_as_int5_exactly():
    parts = [_part("Q5_1", 32), _part("Q4_0", 16, seed=1)]
    same = one_format(parts)
    assert [type(p) for p in same] == [Int5Weight] * 2
    assert torch.equal(WeightFormat.cat_rows(same).dequantize(), _fused_values(parts))


def test_parts_without_a_common_exact_format_are_left_to_dequantize():
    assert one_format([_part("Q5_1", 32), _part("Q8_0", 16)]) is None  # Q5_1's offsets are not -16 d
    assert one_format([_part("Q4_1", 32), _part("Q8_0", 16)]) is None
    alike = [_part("Q4_1", 32), _part("Q4_1", 16, seed=1)]
    assert one_format(alike) == alike and isinstance(alike[0], Int4Weight)
