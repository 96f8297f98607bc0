"""A fused matrix of GGUF parts of different types (llama.cpp's Q4_K_M mixes: q, k Q5_0 beside v Q8_0;
Q4_K beside Q5_0) is kept in one format that holds every part exactly, or as runs in formats of their own
(Q4_K q, k beside a Q6_K v)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from anatomy.checkpoints.gguf_types import TENSOR_TYPES_BY_NAME
from anatomy.weights.formats import Int4Weight, Int5Weight, Int8GroupWeight, WeightFormat
from anatomy.weights.gguf_blocks import format_from_gguf
from anatomy.weights.gguf import common_spans, one_format
from anatomy.weights.split import SplitRowsWeight

gguf = pytest.importorskip("gguf")


def _part(type_name: str, rows: int, K: int = 256, seed: int = 0) -> WeightFormat:
    """gguf-py's quantization of a random [rows, K] matrix, read as its lossless format."""
    x = np.random.default_rng(seed).standard_normal((rows, K)).astype(np.float32) * 0.05
    raw = gguf.quants.quantize(x, gguf.GGMLQuantizationType[type_name]).reshape(-1)
    return format_from_gguf(raw, TENSOR_TYPES_BY_NAME[type_name], (rows, K), label=type_name)


def _random_part(type_name: str, rows: int, K: int = 256, seed: int = 0) -> WeightFormat:
    """Random blocks of a K-quant (gguf-py quantizes none): bytes uniform, float16 d (and Q4_K's dmin) ~ 1e-3."""
    ttype = TENSOR_TYPES_BY_NAME[type_name]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows * K // 256, ttype.nbytes(256)), dtype=np.uint8)
    at = {"Q4_K": (0, 2), "Q6_K": (208,)}[type_name]  # where each block's float16 scales sit
    for i in at:
        blocks[:, i:i + 2] = (rng.standard_normal((len(blocks), 1)) * 1e-3).astype(np.float16).view(np.uint8)
    return format_from_gguf(blocks.reshape(-1), ttype, (rows, K), label=type_name)


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


def test_parts_without_a_common_format_keep_their_own_in_spans():
    """Q4_K q, k beside a Q6_K v (llama.cpp's Q4_K_M mix): q and k fused as int4, v its own int6 span;
    the split weight's values, rows and cuts are its parts' exactly."""
    q, k, v = _random_part("Q4_K", 64), _random_part("Q4_K", 32, seed=1), _random_part("Q6_K", 32, seed=2)
    spans = common_spans([q, k, v])
    assert [[p.name for p in span] for span in spans] == [["int4", "int4"], ["int6"]]
    split = SplitRowsWeight([WeightFormat.cat_rows(spans[0]), spans[1][0]], label="qkv")
    assert split.name == "int4+int6" and split.bounds == [(0, 96), (96, 128)]
    values = _fused_values([q, k, v])
    assert torch.equal(split.dequantize(), values)
    index = torch.tensor([[100, 3], [95, 127]])
    assert torch.equal(split.rows(index), values[index])
    taken = split.take_rows(torch.tensor([96, 0, 1, 120]))
    assert [p.name for p in taken.parts] == ["int6", "int4", "int6"]
    assert torch.equal(taken.dequantize(), values[[96, 0, 1, 120]])
    assert torch.equal(split.take_columns(0, 256).dequantize(), values)
    assert [[p.name for p in span] for span in common_spans([_part("Q5_0", 32), _part("Q8_0", 16)])] == [["int8g"] * 2]


def test_q4_0_and_q5_0_are_read_as_symmetric_formats():
    """Q4_0 and Q5_0 (W = d (q - 8), d (q - 16)) are read as formats whose offsets are -8 d and -16 d, which
    their layouts may leave out (tiles.cpp's symmetric tiles); Q4_1, Q5_1 and Q4_K hold offsets of their own.
    Fused parts stay symmetric when every part is."""
    q4, q5 = _part("Q4_0", 32), _part("Q5_0", 32)
    assert isinstance(q4, Int4Weight) and q4.symmetric and isinstance(q5, Int5Weight) and q5.symmetric
    assert q4.signature == "int4[32,256]g32sym"  # the plan measures it apart from Q4_1's (its layouts differ)
    assert torch.equal(q4.offset.float(), -8 * q4.scale.float())
    assert torch.equal(q5.offset.float(), -16 * q5.scale.float())
    assert not any(_part(t, 32).symmetric for t in ("Q4_1", "Q5_1")) and not _random_part("Q4_K", 32).symmetric
    assert WeightFormat.cat_rows([q5, _part("Q5_0", 16, seed=1)]).symmetric
    assert not WeightFormat.cat_rows(one_format([q5, _part("Q5_1", 16, seed=1)])).symmetric


def test_a_q4_0_tensor_with_a_nan_scale_loads_as_a_full_format():
    """A block whose d is NaN has no -8 d offset to leave out: the tensor loads, not symmetric (its layouts
    keep their minimums), its other values those gguf-py reads."""
    rows, K = 16, 256
    x = np.random.default_rng(0).standard_normal((rows, K)).astype(np.float32) * 0.05
    raw = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q4_0).reshape(rows, -1, 18)
    raw[3, 2, 0:2] = np.array([np.nan], dtype=np.float16).view(np.uint8)
    fmt = format_from_gguf(raw.reshape(-1), TENSOR_TYPES_BY_NAME["Q4_0"], (rows, K), label="w")
    assert isinstance(fmt, Int4Weight) and not fmt.symmetric and fmt.signature == "int4[16,256]g32"
    want = torch.from_numpy(gguf.quants.dequantize(raw.reshape(rows, -1), gguf.GGMLQuantizationType.Q4_0))
    got = fmt.dequantize()
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.float().nan_to_num())
