"""anatomy's own kernels (kernels/native/gemv.cpp, avx2.cpp, exact.cpp) against the float64 product of
the weights they hold: int4 groups (Q4_0/Q4_1/Q4_K style, w = q * d + m) and int8 groups (Q8_0), any
number of rows (the kernels take 16 at a time), float32 and bfloat16 activations; every vector path
this CPU has (AVX-512 VNNI, AVX-512, AVX2: each run under native.limited) equals the portable one;
the candidates are offered only where a vector path runs."""

from __future__ import annotations

import pytest
import torch

from anatomy.kernels import native
from anatomy.kernels.candidates import KERNELS_BY_NAME, Q4X, Q8X, candidates, reference_product, relative_error
from anatomy.weights.formats import Int4Weight, Int8GroupWeight



def test_the_library_is_built_and_loads():
    """`make` builds it (make kernels); everything below needs it."""
    assert native.loaded(), "the native kernels are not built: run `make kernels`"


# activations are rounded to int8 per group of 32 (as llama.cpp's Q8 does): about 0.5% relative error
# on gaussian inputs, the bound the kernel plan holds block layers to is 1e-2
ERROR = 1e-2
# the vector code each test runs: the portable loops, and every vector path this CPU has
PATHS = list(native.vector_paths())


@pytest.fixture(params=PATHS)
def path(request):
    with native.limited(request.param) as running:
        assert running == request.param
        yield running == "portable"  # the operators' `portable` flag: the same loops either way here


def int4(N: int, K: int, group: int = 32, seed: int = 0) -> Int4Weight:
    torch.manual_seed(seed)
    return Int4Weight.from_float(torch.randn(N, K) * 0.05 + 0.01, group=group)


def int8g(N: int, K: int, seed: int = 0) -> Int8GroupWeight:
    torch.manual_seed(seed)
    return Int8GroupWeight(torch.randint(-128, 128, (N, K), dtype=torch.int8), (torch.rand(N, K // 32) * 1e-2).half())


@pytest.mark.parametrize("rows", [1, 3, 8, 16, 37])
@pytest.mark.parametrize("group", [32, 64, 128])
def test_q4_equals_the_float64_product(rows, path, group):
    fmt = int4(96, 256, group)
    (packed,) = Q4X.build(fmt) if native.available() else (torch.ops.anatomy.pack_q4(
        fmt.codes, fmt.scale.float().repeat_interleave(group // 32, 1), fmt.offset.float().repeat_interleave(group // 32, 1)),)
    x = torch.randn(rows, 256)
    y = torch.ops.anatomy.q4_linear(x, packed, path)
    assert y.shape == (rows, 96) and y.dtype == torch.float32
    assert relative_error(y, reference_product(fmt, x)) < ERROR


@pytest.mark.parametrize("rows", [1, 5, 16, 20])
def test_q8_equals_the_float64_product(rows, path):
    fmt = int8g(80, 192)
    packed = torch.ops.anatomy.pack_q8(fmt.codes, fmt.scale.float())
    x = torch.randn(rows, 192)
    y = torch.ops.anatomy.q8_linear(x, packed, path)
    assert relative_error(y, reference_product(fmt, x)) < ERROR


@pytest.mark.skipif(len(PATHS) < 2, reason="this CPU runs no vector path: only the portable one runs")
@pytest.mark.parametrize("isa", PATHS[1:])
def test_the_vector_paths_equal_the_portable_ones(isa):
    """The integer sums are exact in every path, the float arithmetic in another order: 1e-5."""
    fmt4, fmt8 = int4(67, 320), int8g(67, 320)  # 67 outputs: a one-row product's 4-row unroll leaves tails
    p4 = torch.ops.anatomy.pack_q4(fmt4.codes, fmt4.scale.float(), fmt4.offset.float())
    p8 = torch.ops.anatomy.pack_q8(fmt8.codes, fmt8.scale.float())
    ops = ((torch.ops.anatomy.q4_linear, p4), (torch.ops.anatomy.q8_linear, p8), (torch.ops.anatomy.q4f_linear, p4),
           (torch.ops.anatomy.q8f_linear, p8))
    for rows in (1, 7, 13):  # 13: chunks of rows with a remainder
        x = torch.randn(rows, 320)
        for op, packed in ops:
            with native.limited(isa):
                fast = op(x, packed, False)
            torch.testing.assert_close(fast, op(x, packed, True), rtol=1e-5, atol=1e-5)


def test_bfloat16_in_bfloat16_out():
    fmt = int4(64, 128)
    packed = torch.ops.anatomy.pack_q4(fmt.codes, fmt.scale.float(), fmt.offset.float())
    x = torch.randn(2, 128)
    y = torch.ops.anatomy.q4_linear(x.bfloat16(), packed)
    assert y.dtype == torch.bfloat16 and relative_error(y, reference_product(fmt, x)) < ERROR


def test_bad_shapes_are_refused_by_the_operator():
    fmt = int4(64, 128)
    packed = torch.ops.anatomy.pack_q4(fmt.codes, fmt.scale.float(), fmt.offset.float())
    with pytest.raises(RuntimeError, match="multiple of 64"):
        torch.ops.anatomy.q4_linear(torch.randn(1, 96), packed)
    with pytest.raises(RuntimeError, match="bytes a row"):
        torch.ops.anatomy.q4_linear(torch.randn(1, 192), packed)


@pytest.mark.skipif(not native.available(), reason="this CPU runs no vector path of the native kernels")
def test_offered_for_the_formats_and_shapes_they_take():
    assert KERNELS_BY_NAME["q4x"] in candidates(int4(64, 128)) and KERNELS_BY_NAME["q4f"] in candidates(int4(64, 128))
    assert KERNELS_BY_NAME["q8x"] in candidates(int8g(64, 128))
    assert KERNELS_BY_NAME["q4x"] not in candidates(int4(64, 96))  # K not a multiple of 64
    with native.limited("portable"):  # a CPU without AVX2: the portable loops are for checking, not offered
        assert not {"q4x", "q4f", "q8x", "q8f"} & {k.name for k in candidates(int4(64, 128)) + candidates(int8g(64, 128))}


@pytest.mark.parametrize("rows", [1, 7, 8, 19])
def test_the_float_paths_are_the_float_product(rows, path):
    """q4f / q8f decode the weights in float32 and take the activations as they are: the float32 product
    of the weights the format holds, to float32 rounding (the LM head's kernel must be this exact)."""
    fmt4, fmt8 = int4(96, 256), int8g(96, 256)
    p4 = torch.ops.anatomy.pack_q4(fmt4.codes, fmt4.scale.float(), fmt4.offset.float())
    p8 = torch.ops.anatomy.pack_q8(fmt8.codes, fmt8.scale.float())
    x = torch.randn(rows, 256)
    assert relative_error(torch.ops.anatomy.q4f_linear(x, p4, path), reference_product(fmt4, x)) < 1e-6
    assert relative_error(torch.ops.anatomy.q8f_linear(x, p8, path), reference_product(fmt8, x)) < 1e-6
