"""anatomy's 5-bit products (kernels/native/q5.cpp: q5_linear with int8 activations, q5f_linear with
float ones) against the float64 product of the weights they hold: int5 groups (GGUF Q5_0 / Q5_1 / Q5_K
style, w = q * d + m, q in 0..31), any number of rows, K an even and an odd number of 64-input blocks,
float32 and bfloat16 activations; every vector path this CPU has (AVX-512 VNNI, AVX-512, AVX2: each run
under native.limited) equals the portable one; the kernels are offered only where a vector path runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from anatomy.checkpoints.gguf_types import TENSOR_TYPES_BY_NAME
from anatomy.kernels import native
from anatomy.kernels.candidates import DENSE, KERNELS_BY_NAME, Q5X, candidates, reference_product, relative_error
from anatomy.weights.formats import Int5Weight
from anatomy.weights.gguf_blocks import format_from_gguf

# activations are rounded to int8 per group of 32 (as q4_linear's): about 0.5% relative error on
# gaussian inputs; the kernel plan's bound is 1e-2
ERROR = 1e-2
PATHS = list(native.vector_paths())


@pytest.fixture(params=PATHS)
def path(request):
    with native.limited(request.param) as running:
        assert running == request.param
        yield running == "portable"


def int5(N: int, K: int, group: int = 32, seed: int = 0) -> Int5Weight:
    torch.manual_seed(seed)
    return Int5Weight.from_float(torch.randn(N, K) * 0.05 + 0.01, group=group)


def pack(fmt: Int5Weight) -> torch.Tensor:
    repeat = fmt.group // 32
    scale, offset = (t.float().repeat_interleave(repeat, dim=1) for t in (fmt.scale, fmt.offset))
    return torch.ops.anatomy.pack_q5(fmt.codes, fmt.high, scale, offset)


def test_the_codes_span_all_32_levels():
    """The test weights exercise the fifth bits (half the codes have it set)."""
    q = int5(96, 576).codes_unpacked()
    assert int(q.min()) == 0 and int(q.max()) == 31 and 0.3 < float((q >= 16).float().mean()) < 0.7


@pytest.mark.parametrize("rows", [1, 3, 16, 40])
@pytest.mark.parametrize("K, group", [(576, 32), (256, 32), (512, 128)])  # 576: 9 blocks of 64 (an odd number)
def test_q5_equals_the_float64_product(rows, K, group, path):
    fmt = int5(96, K, group)
    x = torch.randn(rows, K)
    y = torch.ops.anatomy.q5_linear(x, pack(fmt), path)
    assert y.shape == (rows, 96) and y.dtype == torch.float32
    assert relative_error(y, reference_product(fmt, x)) < ERROR


@pytest.mark.parametrize("type_name", ["Q5_0", "Q5_1"])
def test_q5_of_gguf_blocks(type_name, path):
    """Blocks written by gguf-py (an independent encoder), carried over and packed."""
    gguf = pytest.importorskip("gguf")
    w = np.random.default_rng(3).standard_normal((40, 192)).astype(np.float32) * 0.05
    raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType[type_name]).reshape(-1)
    fmt = format_from_gguf(raw, TENSOR_TYPES_BY_NAME[type_name], (40, 192))
    x = torch.randn(5, 192)
    assert relative_error(torch.ops.anatomy.q5_linear(x, pack(fmt), path), reference_product(fmt, x)) < ERROR


@pytest.mark.skipif(len(PATHS) < 2, reason="this CPU runs no vector path: only the portable one runs")
@pytest.mark.parametrize("isa", PATHS[1:])
def test_the_vector_paths_equal_the_portable_one(isa):
    """The integer sums are exact in every path, the float arithmetic in another order: 1e-5."""
    packed = pack(int5(67, 576))  # 67 outputs: the one-row loop's 4-row unroll and the 16-row tiles leave tails
    for rows in (1, 3, 16, 40):
        x = torch.randn(rows, 576)
        for op in (torch.ops.anatomy.q5_linear, torch.ops.anatomy.q5f_linear):
            with native.limited(isa):
                fast = op(x, packed, False)
            torch.testing.assert_close(fast, op(x, packed, True), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 3, 9, 40])
def test_the_float_path_is_the_float_product(rows, path):
    """q5f decodes the weights in float32 and takes the activations as they are: the float32 product of
    the weights the format holds, to float32 rounding."""
    fmt = int5(96, 576)
    x = torch.randn(rows, 576)
    y = torch.ops.anatomy.q5f_linear(x, pack(fmt), path)
    assert y.shape == (rows, 96) and relative_error(y, reference_product(fmt, x)) < 1e-6


def test_bfloat16_in_bfloat16_out():
    fmt = int5(64, 128)
    x = torch.randn(2, 128)
    y = torch.ops.anatomy.q5_linear(x.bfloat16(), pack(fmt))
    assert y.dtype == torch.bfloat16 and relative_error(y, reference_product(fmt, x)) < ERROR


def test_bad_shapes_are_refused_by_the_operator():
    packed = pack(int5(64, 128))
    assert packed.shape == (64, 2 * 48)
    with pytest.raises(RuntimeError, match="multiple of 64"):
        torch.ops.anatomy.q5_linear(torch.randn(1, 96), packed)
    with pytest.raises(RuntimeError, match="bytes a row"):
        torch.ops.anatomy.q5_linear(torch.randn(1, 192), packed)
    with pytest.raises(RuntimeError, match="q5f_linear: weight has 96 bytes a row"):
        torch.ops.anatomy.q5f_linear(torch.randn(1, 192), packed)


@pytest.mark.skipif(not native.available(), reason="this CPU runs no vector path of the native kernels")
def test_offered_for_the_formats_and_shapes_it_takes():
    fmt = int5(64, 128)
    names = {k.name for k in candidates(fmt)}
    assert {"q5x", "q5f", "f32", "bf16"} <= names  # and a dense float layout for the long passes
    assert Q5X.nbytes(fmt) == Q5X.build(fmt)[0].nbytes
    assert KERNELS_BY_NAME["q5x"] not in candidates(int5(64, 96))  # K not a multiple of 64
    with native.limited("portable"):  # a CPU without AVX2: the portable loop is for checking, not offered
        assert not {"q5x", "q5f"} & {k.name for k in candidates(fmt)}


def test_dense_layouts_hold_the_int5_weight():
    fmt = int5(32, 128)
    assert torch.equal(DENSE[torch.float32].build(fmt)[0], fmt.dequantize())
