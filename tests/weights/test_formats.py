"""Weight formats: GGUF blocks carried over without requantizing dequantize bit for bit to what
anatomy's ggml dequantization (and gguf-py's) gives; quantizing from float stays within half a
step; row operations; bad input raises InputError naming the tensor and the rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from anatomy.checkpoints.gguf_dequant import dequantize
from anatomy.checkpoints.gguf_types import TENSOR_TYPES_BY_NAME
from anatomy.errors import InputError
from anatomy.weights.formats import (
    FloatWeight,
    Int4Weight,
    Int8GroupWeight,
    Int8Weight,
    WeightFormat,
    format_from_gguf,
    pack_nibbles,
    unpack_nibbles,
)

gguf = pytest.importorskip("gguf")


def _gguf_blocks(x: np.ndarray, type_name: str) -> np.ndarray:
    """gguf-py's quantization of x [N, K] as raw bytes (an independent encoder)."""
    return gguf.quants.quantize(x, gguf.GGMLQuantizationType[type_name]).reshape(-1)


def _random_q4_k(rows: int, superblocks: int, seed: int = 0) -> np.ndarray:
    """Q4_K blocks of random bytes with finite, moderate float16 d and dmin."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows * superblocks, 144), dtype=np.uint8)
    scales = (rng.standard_normal((rows * superblocks, 2)) * 0.01).astype(np.float16)
    blocks[:, 0:4] = scales.view(np.uint8).reshape(-1, 4)
    return blocks.reshape(-1)


def _assert_same_as_ggml(raw: np.ndarray, type_name: str, shape: tuple[int, int]) -> WeightFormat:
    ttype = TENSOR_TYPES_BY_NAME[type_name]
    fmt = format_from_gguf(raw, ttype, shape, label="w")
    expected = dequantize(raw, ttype, shape).float()
    assert torch.equal(fmt.dequantize(), expected)  # bit for bit
    independent = torch.from_numpy(gguf.quants.dequantize(raw.reshape(shape[0], -1), gguf.GGMLQuantizationType[type_name]))
    torch.testing.assert_close(fmt.dequantize(), independent.float(), rtol=0, atol=1e-6)
    return fmt


@pytest.mark.parametrize("type_name, cls", [("Q4_0", Int4Weight), ("Q4_1", Int4Weight), ("Q8_0", Int8GroupWeight)])
def test_gguf_blocks_carry_over_exactly(type_name, cls):
    x = np.random.default_rng(1).standard_normal((48, 96)).astype(np.float32) * 0.05
    x[3, :32] += 0.4  # a block far from zero: Q4_1's min is not -max
    fmt = _assert_same_as_ggml(_gguf_blocks(x, type_name), type_name, (48, 96))
    assert isinstance(fmt, cls) and fmt.group == 32
    # float16 scales: the file's size exactly (Q4_0 keeps an offset -8d beside d: Q4_1's size)
    assert fmt.nbytes == TENSOR_TYPES_BY_NAME["Q4_1" if type_name == "Q4_0" else type_name].nbytes(48 * 96)


def test_q4_k_blocks_carry_over_exactly():
    fmt = _assert_same_as_ggml(_random_q4_k(16, 2), "Q4_K", (16, 512))
    assert isinstance(fmt, Int4Weight) and fmt.group == 32 and fmt.signature == "int4[16,512]g32"


def test_real_q4_1_and_q8_0_tensors_of_the_shipped_file(smollm2_gguf_path):
    from anatomy.checkpoints.gguf_reader import read_gguf

    f = read_gguf(smollm2_gguf_path)
    for name in ("blk.0.attn_q.weight", "blk.7.ffn_down.weight", "blk.29.ffn_up.weight", "token_embd.weight"):
        t = f.tensors[name]
        fmt = format_from_gguf(f.raw(name), t.type, t.shape, label=name)
        assert torch.equal(fmt.dequantize(), dequantize(f.raw(name), t.type, t.shape).float()), name
        assert fmt.nbytes == t.nbytes


@pytest.mark.parametrize("type_name, dtype", [("F32", torch.float32), ("F16", torch.float16), ("BF16", torch.bfloat16)])
def test_float_types_are_views(type_name, dtype):
    w = torch.randn(8, 32).to(dtype)
    raw = w.view(torch.uint8).reshape(-1).numpy()
    fmt = format_from_gguf(raw, TENSOR_TYPES_BY_NAME[type_name], (8, 32))
    assert isinstance(fmt, FloatWeight) and fmt.name == type_name.lower()
    assert torch.equal(fmt.weight, w) and fmt.weight.data_ptr() == raw.ctypes.data


def test_bad_gguf_input_raises_input_error():
    raw = np.zeros(TENSOR_TYPES_BY_NAME["Q2_K"].nbytes(256), dtype=np.uint8)
    with pytest.raises(InputError, match="Q2_K .*no lossless"):
        format_from_gguf(raw, TENSOR_TYPES_BY_NAME["Q2_K"], (1, 256), label="blk.0.ffn_down.weight")
    with pytest.raises(InputError, match=r"blk.1 \[4, 64\].*bytes"):
        format_from_gguf(np.zeros(10, dtype=np.uint8), TENSOR_TYPES_BY_NAME["Q4_1"], (4, 64), label="blk.1")


@pytest.mark.parametrize("cls, step", [(Int4Weight, 1 / 15), (Int8GroupWeight, 1 / 127), (Int8Weight, 1 / 127)])
def test_from_float_within_half_a_step(cls, step):
    w = torch.randn(32, 128)
    fmt = cls.from_float(w)
    err = (fmt.dequantize() - w).abs()
    groups = w.reshape(32, -1, 32) if cls is not Int8Weight else w.reshape(32, 1, 128)
    span = groups.amax(2) - groups.amin(2) if cls is Int4Weight else groups.abs().amax(2)  # per group [N, G]
    bound = span * step / 2 * 1.01 + 1e-3 * span  # + float16 rounding of scale and offset
    assert (err.reshape(groups.shape) <= bound[..., None]).all()


def test_int4_from_float_stores_float16_scales_and_reports_bytes():
    fmt = Int4Weight.from_float(torch.randn(64, 256))
    assert fmt.scale.dtype == fmt.offset.dtype == torch.float16
    assert fmt.nbytes == 64 * 256 // 2 + 2 * (64 * 256 // 32) * 2


@pytest.mark.parametrize("cls", [Int4Weight, Int8GroupWeight])
def test_k_not_a_multiple_of_the_group_raises(cls):
    with pytest.raises(InputError, match=r"blocks.0.attn.qkv \[8, 48\].*K=48 must be a multiple of the group size 32"):
        cls.from_float(torch.randn(8, 48), label="blocks.0.attn.qkv")


def test_not_a_matrix_raises():
    with pytest.raises(InputError, match=r"lm_head.*\[N, K\].*\[8\]"):
        Int8Weight.from_float(torch.randn(8), label="lm_head")


def test_row_operations_and_embedding_rows():
    a, b = Int4Weight.from_float(torch.randn(16, 64)), Int4Weight.from_float(torch.randn(32, 64))
    fused = WeightFormat.cat_rows([a, b], label="qkv")
    assert fused.shape == (48, 64) and fused.label == "qkv"
    assert torch.equal(fused.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
    index = torch.tensor([[5, 40], [0, 47]])
    assert torch.equal(fused.rows(index), fused.dequantize()[index])  # [2, 2, 64]
    assert torch.equal(fused.take_rows(torch.tensor([3, 1])).dequantize(), fused.dequantize()[[3, 1]])
    with pytest.raises(InputError, match="cannot fuse"):
        WeightFormat.cat_rows([a, Int8GroupWeight.from_float(torch.randn(16, 64))])
    wide = Int4Weight(a.codes, a.scale.float() / 3, a.offset.float())  # float32 scales (Q4_K-like)
    mixed = WeightFormat.cat_rows([a, wide])
    assert mixed.scale.dtype == torch.float32 and torch.equal(mixed.dequantize()[16:], wide.dequantize())


def test_nibble_packing_round_trips():
    q = torch.randint(0, 16, (5, 64), dtype=torch.uint8)
    packed = pack_nibbles(q)
    assert packed.shape == (5, 32)  # ggml's order: byte j of a block of 32 holds values j and j + 16
    assert torch.equal(packed[:, 0] & 15, q[:, 0]) and torch.equal(packed[:, 0] >> 4, q[:, 16])
    assert torch.equal(packed[:, 17] & 15, q[:, 33]) and torch.equal(packed[:, 17] >> 4, q[:, 49])
    assert torch.equal(unpack_nibbles(packed), q)


def test_matrix_formats_of_the_shipped_file_equal_the_loaded_model(smollm2_gguf_path, smollm2):
    """Fused q|k|v and gate|up, rotary rows reordered, tied embedding: the same values the loader gives."""
    from anatomy.checkpoints.gguf_reader import read_gguf
    from anatomy.weights.gguf import matrix_formats, named

    formats = matrix_formats(read_gguf(smollm2_gguf_path))
    assert len(formats) == 1 + 4 * 30 and not any("lm_head" in n for n in formats)  # tied: the embedding is the head
    state = smollm2.state_dict()
    for suffix in ("embed.tokens.weight", "blocks.0.attn.qkv.weight", "blocks.0.ffn.gate_up.weight",
                   "blocks.29.attn.out.weight", "blocks.29.ffn.down.weight"):
        name = named(formats, suffix)
        assert torch.equal(formats[name].dequantize(), state[name]), name
    assert formats[named(formats, "blocks.0.attn.qkv.weight")].signature == "int4[960,576]g32"
    assert formats[named(formats, "embed.tokens.weight")].signature == "int8g[49152,576]g32"
