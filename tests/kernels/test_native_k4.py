"""k4 tiles (kernels/native/tiles.cpp): GGUF Q4_K weights held with their per-256 factors (d, sc, -dmin, m), 4.625
bits a weight where q4 tiles take 5. The factors are found from an Int4Weight's scales and offsets
(weights/factors.py) and checked against the bytes of the Q4_K blocks they came from; the products against
the float64 product of the weights llama.cpp's gguf-py dequantizes (an independent reader), on the portable
loops and every vector path this CPU has; weights that do not factor are never offered k4 tiles."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from anatomy.checkpoints.gguf_types import TENSOR_TYPES_BY_NAME
from anatomy.errors import InputError
from anatomy.kernels import native
from anatomy.kernels.candidates import K4T, Q4T, candidates, relative_error
from anatomy.weights.factors import factor_groups
from anatomy.weights.formats import Int4Weight
from anatomy.weights.gguf_blocks import format_from_gguf

from .test_native import ERROR, PATHS, int4

pytestmark = pytest.mark.skipif(not native.loaded(), reason="the native library is built by make")
VNNI = pytest.mark.skipif(not native.runs("avx512-vnni"), reason="k4 tiles need AVX-512 VNNI, which this CPU lacks")
Q4_K = TENSOR_TYPES_BY_NAME["Q4_K"]


def q4_k_blocks(N: int, K: int, seed: int = 0, largest63: bool = False) -> np.ndarray:
    """Random Q4_K blocks [N * K / 256, 144]: d and dmin small float16s, random 6-bit scales and mins (with
    `largest63`, group 0's scale and min 63, each super-block's largest, as llama.cpp's plain quantizer
    makes them), random codes."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (N * K // 256, 144), dtype=np.uint8)
    blocks[:, 0:2] = (rng.random(len(blocks)) * 1e-3 + 1e-4).astype(np.float16).view(np.uint8).reshape(-1, 2)
    blocks[:, 2:4] = (rng.random(len(blocks)) * 1e-3).astype(np.float16).view(np.uint8).reshape(-1, 2)
    if largest63:  # group 0's scale and min: the low 6 bits of bytes 4 and 8 (get_scale_min_k4)
        blocks[:, 4] |= 63
        blocks[:, 8] |= 63
    return blocks


def q4_k(N: int, K: int, seed: int = 0, largest63: bool = False) -> tuple[Int4Weight, np.ndarray]:
    """An Int4Weight read from Q4_K blocks as a GGUF file's, and the blocks."""
    blocks = q4_k_blocks(N, K, seed, largest63)
    return format_from_gguf(blocks.reshape(-1), Q4_K, (N, K), label="w"), blocks


def gguf_py_product(blocks: np.ndarray, N: int, K: int, x: torch.Tensor) -> torch.Tensor:
    w = quants.dequantize(blocks.reshape(N, -1), GGMLQuantizationType.Q4_K)  # [N, K] float32
    return x.double() @ torch.from_numpy(np.asarray(w, dtype=np.float64)).T


@pytest.mark.parametrize("largest63", [True, False])
def test_the_factors_are_the_blocks_own(largest63):
    """d and -dmin are the blocks' float16s bit for bit wherever a super-block's largest scale and min is 63
    (llama.cpp's plain quantizer); with any largest (its imatrix quantizer's make_qp_quants) every scale and
    offset is still unit * multiple exactly."""
    fmt, blocks = q4_k(32, 512, largest63=largest63)
    assert fmt.factored and fmt.signature == "int4[32,512]g32k"
    assert Int4Weight(fmt.codes, fmt.scale.t().contiguous().t(), fmt.offset).factored  # strided scales too
    d, sc, u, mn = fmt.factors()
    assert d.shape == u.shape == (32, 2) and sc.shape == mn.shape == (32, 16) and sc.dtype == torch.uint8
    torch.testing.assert_close(d.float().repeat_interleave(8, 1) * sc.float(), fmt.scale.float(), rtol=0, atol=0)
    torch.testing.assert_close(u.float().repeat_interleave(8, 1) * mn.float(), fmt.offset.float(), rtol=0, atol=0)
    if largest63:
        file_d = torch.from_numpy(blocks[:, 0:2].copy().view(np.float16)).view(32, 2)
        file_dmin = torch.from_numpy(blocks[:, 2:4].copy().view(np.float16)).view(32, 2)
        assert torch.equal(d, file_d) and torch.equal(u, -file_dmin)


def test_what_does_not_factor_is_refused():
    """A Q4_1-style weight (its own float16 scale per 32), a value one step off, K not a multiple of 256 and
    a symmetric weight do not factor; a cut of the inputs off the super-blocks is found again."""
    assert not int4(32, 512).factored and int4(32, 512).factors() is None
    fmt, _ = q4_k(32, 512)
    off = fmt.scale.float().clone()
    off[5, 3] = torch.nextafter(off[5, 3], torch.tensor(1.0))
    assert factor_groups(off) is None and factor_groups(fmt.scale.float()) is not None
    assert factor_groups(torch.zeros(4, 8)) is not None and factor_groups(torch.ones(4, 12)) is None
    assert not Int4Weight(fmt.codes[:, :192], fmt.scale[:, :12], fmt.offset[:, :12]).factored  # K = 384
    assert fmt.take_columns(256, 512).factored and not fmt.take_columns(128, 384).factored
    assert fmt.take_rows(torch.arange(16)).factored and Int4Weight.cat_rows([fmt, fmt]).factored
    assert not Int4Weight.cat_rows([fmt, int4(16, 512)]).factored


def test_the_loaders_claim_and_what_keeps_it_agree_with_finding(monkeypatch):
    """A Q4_K weight claims its factoring (nothing is searched for its signature); its rows, its fusions and its
    columns cut on 256 keep the claim, and say what a search of their own values finds; a block whose d is
    not finite claims nothing."""
    fmt, blocks = q4_k(32, 512)
    with monkeypatch.context() as patch:
        patch.setattr("anatomy.weights.formats.factor_groups", lambda values: pytest.fail("searched"))
        assert fmt.signature == "int4[32,512]g32k"

    def found(w):
        return Int4Weight(w.codes, w.scale, w.offset).factored

    parts = [fmt.take_rows(torch.arange(3, 19)), fmt.take_columns(256, 512), fmt.take_columns(128, 384),
             Int4Weight.cat_rows([fmt, fmt]), Int4Weight.cat_rows([fmt, int4(16, 512)]),
             Int4Weight.cat_rows([int4(16, 512), fmt])]
    assert [found(w) for w in parts] == [True, True, False, True, False, False]
    with monkeypatch.context() as patch:
        patch.setattr("anatomy.weights.formats.factor_groups", lambda values: pytest.fail("searched"))
        assert [w.factored for w in parts[:2] + parts[3:4]] == [True] * 3
    assert [w.factored for w in parts] == [found(w) for w in parts]
    assert all(w.factors() is not None for w in parts if w.factored)
    for at in (0, 2):  # row 0's second super-block's d, then its dmin
        bad_blocks = blocks.copy()
        bad_blocks[1, at:at + 2] = np.array([np.inf], dtype=np.float16).view(np.uint8)
        bad = format_from_gguf(bad_blocks.reshape(-1), Q4_K, (32, 512), label="w")
        assert not bad.factored and bad.factors() is None
    claimed = Int4Weight(fmt.codes, fmt.scale, -8 * fmt.scale, symmetric=None, factored=True)
    assert claimed.symmetric and not claimed.factored  # a claim where factors() does not look is not kept


@VNNI
def test_k4_tiles_are_offered_for_weights_that_factor_only():
    fmt, _ = q4_k(32, 512)
    names = {k.name for k in candidates(fmt)}
    assert {"k4t", "k4t16", "q4t", "q4t16"} <= names
    assert not {"k4t", "k4t16"} & {k.name for k in candidates(int4(32, 512))}
    assert K4T.nbytes(fmt) == K4T.build(fmt)[0].numel() == 32 * 512 * 4.625 / 8 < Q4T.nbytes(fmt)
    with native.limited("avx512"):
        assert not {k.name for k in candidates(fmt)} & {"k4t", "k4t16"}


@VNNI
@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("rows", [1, 3, 8, 13, 20])
def test_k4_products_are_the_float64_one_of_the_files_weights(isa, rows):
    """int16 activations (an outlier channel and all) within 1e-4 of the float64 product of the weights
    gguf-py dequantizes, int8 ones within int8's bound; the portable loops equal the vector ones to 1e-5."""
    N, K = 48, 768
    fmt, blocks = q4_k(N, K, seed=rows)
    (tiles,) = K4T.build(fmt)
    assert tiles.shape == (N // 16, K // 32, 296)
    x = torch.randn(rows, K)
    x[:, 5] *= 40
    want = gguf_py_product(blocks, N, K, x)
    with native.limited(isa):
        for bits, bound in ((16, 1e-4), (8, 10 * ERROR)):
            y = torch.ops.anatomy.q4_tiles_linear(x, tiles, False, bits)
            assert y.shape == (rows, N) and relative_error(y, want) < bound, bits
            torch.testing.assert_close(y, torch.ops.anatomy.q4_tiles_linear(x, tiles, True, bits), rtol=1e-5, atol=1e-5)


@VNNI
def test_k4_int16_products_are_finer_than_q4_tiles():
    """q4 tiles hold each group's d * sc as a float16 (rounded: up to 17 bits); k4 tiles multiply the file's
    factors in float32 (exact), so their int16 product is closer to the float64 one."""
    N, K = 64, 1024
    fmt, blocks = q4_k(N, K, seed=3)
    x = torch.randn(4, K)
    want = gguf_py_product(blocks, N, K, x)
    k4 = relative_error(torch.ops.anatomy.q4_tiles_linear(x, K4T.build(fmt)[0], False, 16), want)
    q4 = relative_error(torch.ops.anatomy.q4_tiles_linear(x, Q4T.build(fmt)[0], False, 16), want)
    assert k4 < 1e-4 and k4 < q4


@pytest.mark.skipif(native.isa() != "amx", reason="AMX tiles need an AMX CPU, which this one is not")
def test_k4_tiles_on_amx_are_their_int16_product_bit_for_bit():
    fmt, _ = q4_k(32, 512)
    (tiles,) = K4T.build(fmt)
    for rows in (1, 17):
        x = torch.randn(rows, 512)
        assert torch.equal(torch.ops.anatomy.tiles_amx_linear(x, tiles), torch.ops.anatomy.q4_tiles_linear(x, tiles, False, 16))


def test_bad_factors_and_shapes_are_refused():
    fmt, _ = q4_k(32, 512)
    d, sc, u, mn = fmt.factors()
    with pytest.raises(RuntimeError, match=r"d and u float16 \[N, K/256\], sc and mn uint8 \[N, K/32\]"):
        torch.ops.anatomy.pack_k4_tiles(fmt.codes, d.float(), sc, u, mn)
    with pytest.raises(RuntimeError, match="K a multiple of 256"):
        torch.ops.anatomy.pack_k4_tiles(fmt.codes[:, :64], d[:, :1], sc[:, :4], u[:, :1], mn[:, :4])
    with pytest.raises(RuntimeError, match="N = 24 is not a multiple of 16"):
        torch.ops.anatomy.pack_k4_tiles(fmt.codes[:24], d[:24], sc[:24], u[:24], mn[:24])
    with pytest.raises(RuntimeError, match="k4 tiles need K a multiple of 256, got K = 384"):
        torch.ops.anatomy.q4_tiles_linear(torch.randn(1, 384), torch.zeros(2, 12, 296, dtype=torch.uint8))
    other = int4(32, 512)
    with pytest.raises(InputError, match=r"w int4\[32,512\]g32: its scales and offsets do not factor"):
        K4T.build(Int4Weight(other.codes, other.scale, other.offset, label="w"))
