"""Every candidate kernel computes x @ W^T of the weight its format stands for, within the error
its activation dtype allows, against a float64 product on the dequantized weight; torch's int4
pack convention (W = (q - 8) * scale + zero, scales_and_zeros [K/g, N, 2]) and the exact split of
int8 codes into two int4 halves are checked on identity matrices."""

from __future__ import annotations

import pytest
import torch

from anatomy.weights.formats import FloatWeight, Int4Weight, Int8GroupWeight, Int8Weight
from anatomy.kernels.candidates import KERNELS_BY_NAME, candidates, reference_product, relative_error

# relative (Frobenius) error allowed per activation dtype: bf16 keeps 8 mantissa bits, f16 11
TOLERANCE = {torch.float32: 2e-3, torch.float16: 2e-3, torch.bfloat16: 8e-3}
EXACT_F32 = 1e-5  # f32 activations on a weight held exactly in f32
INT8_ACTIVATIONS = 1e-2  # anatomy's own kernels (act_dtype None) round activations to int8 per group of 32


def _formats(w):
    return [FloatWeight.from_float(w), FloatWeight.from_float(w, dtype=torch.float16),
            FloatWeight.from_float(w, dtype=torch.bfloat16), Int8Weight.from_float(w),
            Int8GroupWeight.from_float(w), Int4Weight.from_float(w)]


@pytest.mark.parametrize("rows", [1, 3, 8, 40])
def test_every_candidate_matches_the_float64_product(rows):
    w = torch.randn(96, 128) * 0.05
    x = torch.randn(rows, 128)
    for fmt in _formats(w):
        ref = reference_product(fmt, x)
        for k in candidates(fmt):
            if k.max_rows is not None and rows > k.max_rows:
                continue
            dtype = k.act_dtype or torch.float32  # None: any dtype, the output in the input's
            y = k.bind(k.form.build(fmt))(x.to(dtype))
            assert y.shape == (rows, 96) and y.dtype == dtype, (fmt.signature, k.name)
            exact = k.act_dtype == torch.float32 and k.form.name == "f32"
            bound = EXACT_F32 if exact else TOLERANCE[k.act_dtype] if k.act_dtype else INT8_ACTIVATIONS
            assert relative_error(y, ref) < bound, (fmt.signature, k.name)


def test_candidates_follow_the_format():
    w = torch.randn(96, 128)
    names = {f.name: {k.name for k in candidates(f)} for f in _formats(w)}
    assert "int4pack" in names["int4"] and "int4pack" not in names["f32"] and "int4pack" not in names["int8g"]
    assert "int8g/int4x2" in names["int8g"] and "int8pack" in names["int8"]
    assert {"f32", "f16", "bf16"} <= names["int4"]  # a dense copy is always a candidate
    odd = Int4Weight.from_float(torch.randn(40, 128))  # torch's int4 pack needs N divisible by 16
    assert "int4pack" not in {k.name for k in candidates(odd)}
    # a float weight runs only on layouts that hold it exactly: what a user chose is what runs
    assert names["f32"] == {"f32", "f32/chunked"}
    assert not any(n.startswith("bf16") for n in names["f16"]) and not any(n.startswith("f16") for n in names["bf16"])


def _bf16_exact(t):
    return t.bfloat16().float()


def test_int4pack_convention_reproduces_the_weight():
    """With scale and offset + 8 * scale exact in bf16, x = I gives W^T exactly (up to bf16 output rounding)."""
    N, K = 64, 96
    q = torch.randint(0, 16, (N, K), dtype=torch.uint8)
    scale = _bf16_exact(torch.rand(N, K // 32) * 0.1 + 0.01)
    zero = _bf16_exact(torch.randn(N, K // 32) * 0.1)
    fmt = Int4Weight.from_codes(q, scale, zero - 8 * scale)  # our convention: W = q * scale + offset
    assert torch.equal(fmt.offset.float() + 8 * fmt.scale.float(), zero)  # the layout torch receives is exact
    k = KERNELS_BY_NAME["int4pack"]
    y = k.bind(k.form.build(fmt))(torch.eye(K, dtype=torch.bfloat16))  # [K, N] = W^T
    w = ((q.float() - 8) * scale.repeat_interleave(32, 1) + zero.repeat_interleave(32, 1))
    assert torch.equal(y.float().T, w.bfloat16().float())


def test_int8_codes_split_into_two_int4_halves_exactly():
    N, K = 32, 64
    codes = torch.randint(-128, 128, (N, K), dtype=torch.int8)
    d = torch.tensor(2.0) ** torch.randint(-12, -4, (N, K // 32))  # powers of two: exact in bf16
    fmt = Int8GroupWeight(codes, d.half())
    k = KERNELS_BY_NAME["int8g/int4x2"]
    y = k.bind(k.form.build(fmt))(torch.eye(K, dtype=torch.bfloat16))  # [K, N]
    assert torch.equal(y.float().T, fmt.dequantize().bfloat16().float())


def test_int4pack_on_real_q4_1_weights(smollm2_gguf_path):
    from anatomy.checkpoints.gguf_reader import read_gguf
    from anatomy.weights.gguf_blocks import format_from_gguf

    f = read_gguf(smollm2_gguf_path)
    t = f.tensors["blk.3.ffn_gate.weight"]
    fmt = format_from_gguf(f.raw(t.name), t.type, t.shape)
    x = torch.randn(4, fmt.shape[1])
    k = KERNELS_BY_NAME["int4pack"]
    err = relative_error(k.bind(k.form.build(fmt))(x.bfloat16()), reference_product(fmt, x))
    assert err < TOLERANCE[torch.bfloat16]


def test_chunked_handles_non_divisible_rows_and_views():
    fmt = FloatWeight.from_float(torch.randn(30, 64))  # 30 rows: 2 chunks of 15 (or plain with 1 thread)
    k = KERNELS_BY_NAME["f32/chunked"]
    x = torch.randn(64, 5).T  # a non-contiguous [5, 64]
    if k.supports(fmt):
        torch.testing.assert_close(k.bind(k.form.build(fmt))(x), x @ fmt.weight.T)
    q = KERNELS_BY_NAME["int4pack"]
    w4 = Int4Weight.from_float(torch.randn(32, 64))
    assert relative_error(q.bind(q.form.build(w4))(x.bfloat16()), reference_product(w4, x)) < 8e-3


@pytest.mark.slow
def test_compilable_kernels_compile():
    """The kernels marked `compiles` run inside torch.compile(fullgraph=True) and give the eager result."""
    from anatomy.kernels.candidates import COMPILABLE_KERNELS
    from anatomy.kernels.planned_linear import PlannedLinear

    fmts = [Int4Weight.from_float(torch.randn(64, 128)), Int8GroupWeight.from_float(torch.randn(64, 128))]
    x = torch.randn(1, 1, 128)
    for fmt in fmts:
        for k in candidates(fmt, COMPILABLE_KERNELS):
            layer = PlannedLinear.with_kernel(k, fmt)
            with torch.inference_mode():
                y = torch.compile(layer, fullgraph=True)(x)
            # compiled code may order the sums differently: the outputs agree to the kernel's precision
            assert relative_error(y, layer(x).double()) < 1e-2, k.name


def test_no_rows_give_no_rows_on_every_kernel():
    """A serving step whose chunks want no logits (a long prompt's first chunks) sends the LM head 0 rows:
    every kernel's layer answers [0, N] (anatomy's native ones refuse an empty matrix themselves)."""
    from anatomy.kernels.planned_linear import PlannedLinear

    w = torch.randn(64, 128)
    for fmt in (FloatWeight.from_float(w), Int8Weight.from_float(w), Int8GroupWeight.from_float(w),
                Int4Weight.from_float(w)):
        for k in candidates(fmt):
            y = PlannedLinear.with_kernel(k, fmt)(torch.randn(0, 128))
            assert y.shape == (0, 64), k.name
