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
    Int5Weight,
    Int8GroupWeight,
    Int8Weight,
    WeightFormat,
    pack_bits,
    pack_nibbles,
    unpack_bits,
    unpack_nibbles,
)
from anatomy.weights.gguf_blocks import format_from_gguf

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


@pytest.mark.parametrize("type_name, cls", [("Q4_0", Int4Weight), ("Q4_1", Int4Weight), ("Q8_0", Int8GroupWeight),
                                            ("Q5_0", Int5Weight), ("Q5_1", Int5Weight)])
def test_gguf_blocks_carry_over_exactly(type_name, cls):
    x = np.random.default_rng(1).standard_normal((48, 96)).astype(np.float32) * 0.05
    x[3, :32] += 0.4  # a block far from zero: Q4_1's min is not -max
    fmt = _assert_same_as_ggml(_gguf_blocks(x, type_name), type_name, (48, 96))
    assert isinstance(fmt, cls) and fmt.group == 32
    # float16 scales: the file's size exactly (Q4_0 / Q5_0 keep an offset -8d / -16d beside d: Q4_1's / Q5_1's size)
    assert fmt.nbytes == TENSOR_TYPES_BY_NAME[type_name.replace("_0", "_1") if "Q8" not in type_name
                                              else type_name].nbytes(48 * 96)


def test_q5_codes_use_all_32_levels():
    """The fifth bits are read: gguf-py's Q5_1 of a ramp gives every code 0..31 in each block."""
    x = np.tile(np.linspace(-1, 1, 32, dtype=np.float32), (4, 2))  # [4, 64]
    fmt = format_from_gguf(_gguf_blocks(x, "Q5_1"), TENSOR_TYPES_BY_NAME["Q5_1"], (4, 64))
    assert torch.equal(fmt.codes_unpacked()[:, :32], torch.arange(32, dtype=torch.uint8).expand(4, 32))


def _random_q5_k(rows: int, superblocks: int, seed: int = 0) -> np.ndarray:
    """Q5_K blocks of random bytes (scales, fifth bits, nibbles) with finite, moderate float16 d and dmin."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows * superblocks, 176), dtype=np.uint8)
    blocks[:, 0:4] = (rng.standard_normal((rows * superblocks, 2)) * 0.01).astype(np.float16).view(np.uint8)
    return blocks.reshape(-1)


def test_q5_k_blocks_carry_over_exactly():
    """Bit for bit gguf-py's Q5_K dequantization (the float32 arithmetic of llama.cpp's reference)."""
    raw = _random_q5_k(16, 2)
    fmt = format_from_gguf(raw, TENSOR_TYPES_BY_NAME["Q5_K"], (16, 512), label="w")
    expected = torch.from_numpy(gguf.quants.dequantize(raw.reshape(16, -1), gguf.GGMLQuantizationType.Q5_K))
    assert isinstance(fmt, Int5Weight) and fmt.signature == "int5[16,512]g32"
    assert torch.equal(fmt.dequantize(), expected.float())
    assert fmt.nbytes == 16 * 512 * 5 // 8 + 2 * 16 * 16 * 4  # codes, fifth bits, float32 scales and offsets


def test_q4_k_blocks_carry_over_exactly():
    fmt = _assert_same_as_ggml(_random_q4_k(16, 2), "Q4_K", (16, 512))
    assert isinstance(fmt, Int4Weight) and fmt.group == 32 and fmt.signature == "int4[16,512]g32k"  # k: its factors per 256


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


@pytest.mark.parametrize("type_name", ["Q5_0", "Q5_1", "Q5_K"])
def test_q5_blocks_of_bad_size_raise_input_error(type_name):
    with pytest.raises(InputError, match=rf"blk.2 \[4, 256\]: 100 bytes of {type_name}"):
        format_from_gguf(np.zeros(100, dtype=np.uint8), TENSOR_TYPES_BY_NAME[type_name], (4, 256), label="blk.2")


def test_bad_gguf_input_raises_input_error():
    raw = np.zeros(TENSOR_TYPES_BY_NAME["Q2_K"].nbytes(256), dtype=np.uint8)
    with pytest.raises(InputError, match="Q2_K .*no lossless"):
        format_from_gguf(raw, TENSOR_TYPES_BY_NAME["Q2_K"], (1, 256), label="blk.0.ffn_down.weight")
    with pytest.raises(InputError, match=r"blk.1 \[4, 64\].*bytes"):
        format_from_gguf(np.zeros(10, dtype=np.uint8), TENSOR_TYPES_BY_NAME["Q4_1"], (4, 64), label="blk.1")


@pytest.mark.parametrize("cls, step", [(Int4Weight, 1 / 15), (Int5Weight, 1 / 31), (Int8GroupWeight, 1 / 127),
                                       (Int8Weight, 1 / 127)])
def test_from_float_within_half_a_step(cls, step):
    w = torch.randn(32, 128)
    fmt = cls.from_float(w)
    err = (fmt.dequantize() - w).abs()
    groups = w.reshape(32, -1, 32) if cls is not Int8Weight else w.reshape(32, 1, 128)
    span = groups.amax(2) - groups.amin(2) if cls in (Int4Weight, Int5Weight) else groups.abs().amax(2)  # [N, G]
    bound = span * step / 2 * 1.01 + 1e-3 * span  # + float16 rounding of scale and offset
    assert (err.reshape(groups.shape) <= bound[..., None]).all()


def test_int4_from_float_stores_float16_scales_and_reports_bytes():
    fmt = Int4Weight.from_float(torch.randn(64, 256))
    assert fmt.scale.dtype == fmt.offset.dtype == torch.float16
    assert fmt.nbytes == 64 * 256 // 2 + 2 * (64 * 256 // 32) * 2


@pytest.mark.parametrize("cls", [Int4Weight, Int5Weight, Int8GroupWeight])
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


def test_int5_row_and_column_operations():
    """Fusing, reordering, embedding rows and a shard's columns move the fifth bits with their codes."""
    a, b = Int5Weight.from_float(torch.randn(16, 128)), Int5Weight.from_float(torch.randn(8, 128), group=64)
    with pytest.raises(InputError, match="cannot fuse"):
        WeightFormat.cat_rows([a, b])  # groups differ
    b = Int5Weight.from_float(torch.randn(8, 128))
    fused = WeightFormat.cat_rows([a, b], label="gate_up")
    assert isinstance(fused, Int5Weight) and fused.signature == "int5[24,128]g32"
    assert torch.equal(fused.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
    index = torch.tensor([[23, 0], [7, 16]])
    assert torch.equal(fused.rows(index), fused.dequantize()[index])  # [2, 2, 128]
    assert torch.equal(fused.take_rows(torch.tensor([20, 2])).dequantize(), fused.dequantize()[[20, 2]])
    shard = fused.take_columns(32, 96, label="shard")
    assert shard.shape == (24, 64) and shard.high.shape == (24, 8)
    assert torch.equal(shard.dequantize(), fused.dequantize()[:, 32:96])
    with pytest.raises(InputError, match=r"columns \[16, 96\)"):
        fused.take_columns(16, 96)


def test_int5_from_int4_and_as_int8g_are_exact():
    four = Int4Weight.from_float(torch.randn(8, 64))
    assert torch.equal(Int5Weight.from_int4(four).dequantize(), four.dequantize())
    q = torch.randint(0, 32, (8, 64))
    d = (torch.rand(8, 2) * 0.01).half()
    symmetric = Int5Weight.from_codes(q, d, -16 * d.float())  # Q5_0's w = d * (q - 16)
    int8g = symmetric.as_int8g()
    assert isinstance(int8g, Int8GroupWeight) and torch.equal(int8g.dequantize(), symmetric.dequantize())
    assert torch.equal(int8g.codes, (q - 16).to(torch.int8))
    assert Int5Weight.from_codes(q, d, d).as_int8g() is None


def test_int5_refuses_fifth_bits_of_the_wrong_shape():
    with pytest.raises(InputError, match=r"fifth bits must be uint8 \[N, K/8\] = \[4, 8\].*\[4, 4\]"):
        Int5Weight(torch.zeros(4, 32, dtype=torch.uint8), torch.zeros(4, 4, dtype=torch.uint8),
                   torch.ones(4, 2), torch.zeros(4, 2), label="w")


def test_bit_packing_round_trips():
    b = torch.randint(0, 2, (3, 64), dtype=torch.uint8)
    packed = pack_bits(b)
    assert packed.shape == (3, 8) and torch.equal(packed[:, 0] & 1, b[:, 0])
    assert torch.equal(packed[:, 1] >> 7, b[:, 15])  # bit 7 of byte 1: value 15
    assert torch.equal(unpack_bits(packed), b)


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


# -- the non-linear 4-bit types: a table level times a per-32 scale, held as int8 codes ---------
LEVEL_TYPES = {"IQ4_NL": [0], "IQ4_XS": [0], "MXFP4": []}  # type: byte offsets of its float16 d


def _random_blocks(type_name: str, n_blocks: int, seed: int) -> np.ndarray:
    """Random bytes, the float16 d (if any) finite and of either sign."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(n_blocks, TENSOR_TYPES_BY_NAME[type_name].type_size), dtype=np.uint8)
    for offset in LEVEL_TYPES[type_name]:
        d = rng.uniform(-0.05, 0.05, size=n_blocks).astype(np.float16)
        blocks[:, offset:offset + 2] = d.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(-1)


@pytest.mark.parametrize("type_name", sorted(LEVEL_TYPES))
def test_level_types_carry_over_bit_for_bit(type_name):
    shape = (12, 512)
    raw = _random_blocks(type_name, TENSOR_TYPES_BY_NAME[type_name].nbytes(12 * 512) // TENSOR_TYPES_BY_NAME[
        type_name].type_size, seed=len(type_name))
    if type_name == "MXFP4":
        raw.reshape(-1, 17)[:, 0] = np.random.default_rng(3).integers(110, 140, size=12 * 16)  # 2^-18 .. 2^11
    fmt = format_from_gguf(raw, TENSOR_TYPES_BY_NAME[type_name], shape, label="w")
    assert isinstance(fmt, Int8GroupWeight) and fmt.signature == "int8g[12,512]g32lut"  # codes of a table:
    table = gguf.quants.MXFP4.kvalues if type_name == "MXFP4" else gguf.quants.IQ4_NL.kvalues
    assert fmt.levels.tolist() == list(table) and set(fmt.codes.unique().tolist()) <= set(table)  # 4-bit layouts
    reference = gguf.quants.dequantize(raw.reshape(shape[0], -1), gguf.GGMLQuantizationType[type_name])
    assert np.array_equal(fmt.dequantize().numpy().view(np.uint32), reference.view(np.uint32))  # bit for bit
    # the codes are the table's int8 levels; the scales float16 where that is exact
    assert fmt.scale.dtype == (torch.float32 if type_name == "IQ4_XS" else torch.float16)
    assert set(fmt.codes.unique().tolist()) <= set(gguf.quants.IQ4_NL.kvalues + gguf.quants.MXFP4.kvalues)


def test_mxfp4_scales_outside_float16_stay_float32_and_exact():
    raw = _random_blocks("MXFP4", 8, seed=5)
    raw.reshape(8, 17)[:, 0] = [0, 1, 2, 60, 127, 128, 200, 250]  # 2^-128 (a float32 subnormal) .. 2^122
    fmt = format_from_gguf(raw, TENSOR_TYPES_BY_NAME["MXFP4"], (2, 128), label="w")
    reference = gguf.quants.dequantize(raw.reshape(2, -1), gguf.GGMLQuantizationType.MXFP4)
    assert fmt.scale.dtype == torch.float32 and fmt.scale[0, 0].item() == 2.0 ** -128
    assert np.array_equal(fmt.dequantize().numpy().view(np.uint32), reference.view(np.uint32))


def test_release_gives_back_the_storage_of_a_view_and_its_base():
    """A format whose codes are a view (a GGUF tensor's [N, blocks, 32] codes reshaped) holds its base,
    and the base the storage: release empties both; a storage in `keep` releases nothing."""
    base = torch.randint(-127, 128, (8, 2, 32), dtype=torch.int8)
    fmt = Int8GroupWeight(base.view(8, 64), torch.rand(8, 2))
    assert fmt.release(keep={base.untyped_storage().data_ptr()}) == 0 and not fmt.released
    assert fmt.release() == 8 * 64 + 8 * 2 * 4 and fmt.released
    assert base.numel() == 0 and fmt.codes.numel() == 0
    with pytest.raises(InputError, match="given to an engine's layout"):
        fmt.dequantize()
