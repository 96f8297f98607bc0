"""q4, q5, q8 and l4 tiles (kernels/native/tiles.cpp): the int4, int5 and int8 products with int8 or int16
activations, on 16 output rows interleaved, against the float64 product of the weights and against
q4_linear on the q4 layout they are packed from (the same int8 activations, the integer sums exact: 1e-5), on the portable loops and every
vector path this CPU has; on AMX, the int16 products bit for bit; bad shapes refused; the fused decode
block holds them where VNNI runs."""

from __future__ import annotations

import pytest
import torch

from anatomy.errors import InputError
from anatomy.kernels import native
from anatomy.kernels.candidates import Q4T, Q5T, candidates, reference_product, relative_error
from anatomy.weights.formats import Int4Weight, Int5Weight, compact_float
from anatomy.kernels.decode_block import LINEARS, NativeBlock
from anatomy.inference.engine import DecoderEngine

from .test_native import ERROR, PATHS, int4, int8g
from .test_native_q5 import int5, pack as pack_q5

pytestmark = pytest.mark.skipif(not native.loaded(), reason="the native library is built by make")


def packed(N: int, K: int, group: int = 32):
    fmt = int4(N, K, group)
    scale, offset = (t.float().repeat_interleave(group // 32, 1) for t in (fmt.scale, fmt.offset))
    q4 = torch.ops.anatomy.pack_q4(fmt.codes, scale, offset)
    return fmt, q4, torch.ops.anatomy.pack_q4_tiles(q4)


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("rows", [1, 3, 8, 13, 20])
def test_tiles_equal_the_q4_product_and_the_float64_one(isa, rows):
    fmt, q4, tiles = packed(96, 320, group=64)
    assert tiles.shape == (96 // 16, 320 // 32, 320)
    x = torch.randn(rows, 320)
    with native.limited(isa):
        y = torch.ops.anatomy.q4_tiles_linear(x, tiles)
    assert y.shape == (rows, 96) and y.dtype == torch.float32
    torch.testing.assert_close(y, torch.ops.anatomy.q4_linear(x, q4, True), rtol=1e-5, atol=1e-5)
    assert relative_error(y, reference_product(fmt, x)) < ERROR


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("rows", [1, 8, 13])
def test_int16_activations_are_258_times_finer(isa, rows):
    """Rounded to int16 per group of 32, an outlier channel and all: within 1e-4 of the float64 product
    (int8: ~1e-2 here), the portable and vector loops equal to 1e-5."""
    fmt, _, tiles = packed(96, 320)
    x = torch.randn(rows, 320)
    x[:, 5] *= 40  # an outlier channel: its group's other inputs get the coarsest steps
    with native.limited(isa):
        y = torch.ops.anatomy.q4_tiles_linear(x, tiles, False, 16)
    want = reference_product(fmt, x)
    assert relative_error(y, want) < 1e-4 < relative_error(torch.ops.anatomy.q4_tiles_linear(x, tiles), want)
    torch.testing.assert_close(y, torch.ops.anatomy.q4_tiles_linear(x, tiles, True, 16), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("rows", [1, 3, 8, 13, 20])
def test_q5_tiles_are_the_q5_product_with_int8_or_int16_activations(isa, rows):
    """int5 codes (Q5_K-style: all 32 levels, a scale and an offset per group of 64) on tiles: with int8
    activations q5_linear's sums on the q5 layout they are packed from (1e-5); with int16 ones (an
    outlier channel and all) within 1e-4 of the float64 product; the portable and vector loops equal."""
    fmt = int5(96, 320, group=64)
    q5 = pack_q5(fmt)
    tiles = torch.ops.anatomy.pack_q5_tiles(q5)
    assert tiles.shape == (96 // 16, 320 // 32, 384)
    x = torch.randn(rows, 320)
    x[:, 7] *= 40
    with native.limited(isa):
        y8 = torch.ops.anatomy.q5_tiles_linear(x, tiles)
        y16 = torch.ops.anatomy.q5_tiles_linear(x, tiles, False, 16)
    want = reference_product(fmt, x)
    torch.testing.assert_close(y8, torch.ops.anatomy.q5_linear(x, q5, True), rtol=1e-5, atol=1e-5)
    assert relative_error(y16, want) < 1e-4 < relative_error(y8, want) < 5 * ERROR
    torch.testing.assert_close(y16, torch.ops.anatomy.q5_tiles_linear(x, tiles, True, 16), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("rows", [1, 8, 13])
def test_q8_tiles_are_the_q8_product_with_int16_activations(isa, rows):
    """Q8_0-style int8 groups on tiles, x rounded to int16 per 32 (an outlier channel and all): within
    1e-4 of the float64 product, the portable and vector loops equal to 1e-5."""
    fmt = int8g(48, 256)
    tiles = torch.ops.anatomy.pack_q8_tiles(fmt.codes, fmt.scale.float())
    assert tiles.shape == (3, 8, 544)
    x = torch.randn(rows, 256)
    x[:, 9] *= 40
    with native.limited(isa):
        y = torch.ops.anatomy.q8_tiles_linear(x, tiles)
    assert y.shape == (rows, 48) and relative_error(y, reference_product(fmt, x)) < 1e-4
    torch.testing.assert_close(y, torch.ops.anatomy.q8_tiles_linear(x, tiles, True), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("rows", [1, 3, 8, 13, 20])
def test_q8_and_l4_tiles_with_int8_activations_are_the_q8_row_product(isa, rows):
    """Signed codes against int8 activations (each code shifted by 128 for vpdpbusd, 128 times the row's
    code sum taken off): q8_linear's sums on the q8 row layout of the same codes, codes of -128 and all
    (1e-5); the l4 tiles of codes of a table the same product; within int8's error of the float64 one."""
    fmt = int8g(48, 320, seed=rows)
    fmt.codes[0, :32] = -128
    half = fmt.scale.float()
    rows_layout = torch.ops.anatomy.pack_q8(fmt.codes, half)
    tiles = torch.ops.anatomy.pack_q8_tiles(fmt.codes, half)
    levels = torch.tensor([-128, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 127], dtype=torch.int8)
    looked_up = levels[torch.randint(0, 16, fmt.codes.shape)]
    table = torch.ops.anatomy.pack_l4_tiles(looked_up, half, levels)
    x = torch.randn(rows, 320)
    with native.limited(isa):
        y = torch.ops.anatomy.q8_tiles_linear(x, tiles, False, 8)
        y_l4 = torch.ops.anatomy.l4_tiles_linear(x, table, False, 8)
    torch.testing.assert_close(y, torch.ops.anatomy.q8_linear(x, rows_layout, True), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y_l4, torch.ops.anatomy.q8_linear(x, torch.ops.anatomy.pack_q8(looked_up, half), True),
                               rtol=1e-5, atol=1e-5)
    assert 1e-4 < relative_error(y, reference_product(fmt, x)) < ERROR


@pytest.mark.skipif(not native.available(), reason="this CPU runs no vector path of the native kernels")
def test_offered_where_vnni_runs_and_n_allows():
    tiled = {"q4t", "q4t16", "q5t", "q5t16", "q8t", "q8t16"}  # (l4t, l4t16: int8g with levels only)

    def offered(N: int) -> set[str]:
        return {k.name for fmt in (int4(N, 128), int5(N, 128), int8g(N, 128)) for k in candidates(fmt)}

    assert (tiled <= offered(64)) == native.runs("avx512-vnni")
    assert not tiled & offered(72)  # N = 72
    with native.limited("avx512"):  # AVX-512 without VNNI
        assert not tiled & offered(64)


AMX = pytest.mark.skipif(not native.runs("amx"), reason="AMX's int8 tiles: this CPU lacks them or Linux refused them")


def _three_tiles(N: int, K: int) -> list[tuple]:
    """(format, tiles, the int16 VNNI product) for q4, q5 and q8 tiles of one shape, and the symmetric q4
    and q5 ones."""
    q4 = int4(N, K)
    q5 = int5(N, K, group=64)
    q8 = int8g(N, K)
    q4s, q5s = symmetric(q4), symmetric(int5(N, K))
    ops = torch.ops.anatomy
    q4_16 = lambda x, t: ops.q4_tiles_linear(x, t, False, 16)  # noqa: E731
    q5_16 = lambda x, t: ops.q5_tiles_linear(x, t, False, 16)  # noqa: E731
    return [(q4, packed(N, K)[2], q4_16), (q5, ops.pack_q5_tiles(pack_q5(q5)), q5_16),
            (q8, ops.pack_q8_tiles(q8.codes, q8.scale.float()), lambda x, t: ops.q8_tiles_linear(x, t)),
            (q4s, Q4T.build(q4s)[0], q4_16), (q5s, Q5T.build(q5s)[0], q5_16)]


def symmetric(fmt: Int4Weight | Int5Weight) -> Int4Weight | Int5Weight:
    """The same codes and scales with every offset -8 (int5: -16) times its scale: GGUF Q4_0's (Q5_0's) form."""
    offset = compact_float(-fmt.centre * fmt.scale.float())
    if isinstance(fmt, Int4Weight):
        return Int4Weight(fmt.codes, fmt.scale, offset, symmetric=True)
    return Int5Weight(fmt.codes, fmt.high, fmt.scale, offset, symmetric=True)


@pytest.mark.skipif(not native.runs("avx512-vnni"), reason="q4 and q5 tiles need AVX-512 VNNI, which this CPU lacks")
@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("rows", [1, 3, 8, 13, 20])
@pytest.mark.parametrize("make", [int4, int5])
def test_symmetric_tiles_are_the_full_ones_without_their_offsets_bit_for_bit(isa, rows, make):
    """Q4_0- and Q5_0-style formats (offset -8 d, -16 d) pack to tiles of 288 and 352 bytes a group
    (4.5 and 5.5 bits a weight, the file's): their products with int8 and int16 activations equal those
    of the 320- and 384-byte tiles of the same weights bit for bit, on every path, and the float64
    product of the weights to the tiles' own bounds."""
    fmt = symmetric(make(96, 320))
    (tiles,) = (Q4T if make is int4 else Q5T).build(fmt)
    rows_layout = torch.ops.anatomy.pack_q4(fmt.codes, fmt.scale.float(), fmt.offset.float()) if make is int4 \
        else pack_q5(fmt)  # the same weights, their offsets stored
    pack = torch.ops.anatomy.pack_q4_tiles if make is int4 else torch.ops.anatomy.pack_q5_tiles
    full = pack(rows_layout)
    product = torch.ops.anatomy.q4_tiles_linear if make is int4 else torch.ops.anatomy.q5_tiles_linear
    assert tiles.shape == (6, 10, 288 if make is int4 else 352) and full.shape[2] == tiles.shape[2] + 32
    assert (Q4T if make is int4 else Q5T).nbytes(fmt) == tiles.numel()
    x = torch.randn(rows, 320)
    x[:, 7] *= 40
    with native.limited(isa):
        for portable in (False, True):
            for bits in (8, 16):
                y = product(x, tiles, portable, bits)
                assert torch.equal(y, product(x, full, portable, bits)), (portable, bits)
        assert relative_error(product(x, tiles, False, 16), reference_product(fmt, x)) < 1e-4


def test_symmetric_tiles_refuse_a_layout_with_other_offsets():
    """pack_q4_tiles / pack_q5_tiles with symmetric=True name the first row and group whose minimum is not
    -8 (-16) times its scale; a format that claims symmetry it lacks is refused when made."""
    fmt = int4(32, 128)
    q4 = torch.ops.anatomy.pack_q4(fmt.codes, fmt.scale.float(), fmt.offset.float())
    with pytest.raises(RuntimeError, match="symmetric tiles need every minimum to be -8 times its scale; row 0, group 0"):
        torch.ops.anatomy.pack_q4_tiles(q4, True)
    q5 = int5(32, 128)
    with pytest.raises(RuntimeError, match="to be -16 times its scale; row 0, group 0"):
        torch.ops.anatomy.pack_q5_tiles(pack_q5(q5), True)
    with pytest.raises(InputError, match=r"w: symmetric int4 needs every offset to be -8 times its scale; 128 are not"):
        Int4Weight(fmt.codes, fmt.scale, fmt.offset, symmetric=True, label="w")


def test_rows_columns_and_fusions_keep_symmetry_only_where_every_part_has_it():
    a, b = symmetric(int4(32, 128)), symmetric(int4(16, 128, seed=1))
    assert a.take_rows(torch.arange(8)).symmetric and a.take_columns(32, 96).symmetric
    assert Int4Weight.cat_rows([a, b]).symmetric
    assert not Int4Weight.cat_rows([a, int4(16, 128)]).symmetric and not int4(16, 128).symmetric


@AMX
@pytest.mark.parametrize("rows", [1, 7, 16, 33, 130])
def test_amx_gives_the_int16_products_bit_for_bit(rows):
    """tiles_amx_linear on q4, q5 and q8 tiles: x rounded to int16 per 32 and split into a high and a low
    byte, two AMX products per 16 rows: equal to the VNNI loop's int16 product bit for bit (any number
    of rows: padded to 16 inside), within 1e-4 of the float64 product with an outlier channel."""
    for fmt, tiles, vnni in _three_tiles(48, 576):
        x = torch.randn(rows, 576)
        x[:, 11] *= 40
        y = torch.ops.anatomy.tiles_amx_linear(x, tiles)
        assert y.shape == (rows, 48) and torch.equal(y, vnni(x, tiles))
        assert relative_error(y, reference_product(fmt, x)) < 1e-4


@AMX
def test_amx_is_offered_where_it_runs_and_refused_below():
    fmts = (int4(64, 128), int5(64, 128), int8g(64, 128))
    amx = {"q4t16/amx", "q5t16/amx", "q8t16/amx"}
    assert amx <= {k.name for fmt in fmts for k in candidates(fmt)}
    with native.limited("avx512-vnni"):  # an AVX-512 VNNI machine without AMX
        assert not amx & {k.name for fmt in fmts for k in candidates(fmt)}
        with pytest.raises(RuntimeError, match="runs no AMX"):
            torch.ops.anatomy.tiles_amx_linear(torch.randn(2, 128), packed(32, 128)[2])
    sizes = r"320 \| 288 \| 296 \| 384 \| 352 \| 544 \| 336"
    with pytest.raises(RuntimeError, match=rf"tiles must be uint8 \[N/16, K/32, {sizes}\]"):
        torch.ops.anatomy.tiles_amx_linear(torch.randn(2, 128), torch.zeros(2, 4, 100, dtype=torch.uint8))


def lookup(N: int, K: int, table: str = "IQ4", seed: int = 0):
    """An int8g weight whose codes are each one of a GGUF table's 16 levels (IQ4_NL's, or MXFP4's with its two
    zeros), float32 scales per 32 (IQ4_XS's products d * (ls - 32) need more than a float16)."""
    from anatomy.checkpoints.gguf_dequant import FP4_LEVELS, IQ4_LEVELS
    from anatomy.weights.formats import Int8GroupWeight

    levels = torch.from_numpy((IQ4_LEVELS if table == "IQ4" else FP4_LEVELS).copy())
    g = torch.Generator().manual_seed(seed)
    codes = levels[torch.randint(0, 16, (N, K), generator=g)]
    scale = torch.rand(N, K // 32, generator=g) * 1e-3 + 1e-4
    return Int8GroupWeight(codes, scale, levels=levels)


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("table", ["IQ4", "FP4"])
@pytest.mark.parametrize("rows", [1, 8, 13])
def test_l4_tiles_are_the_lookup_product_with_int16_activations(isa, table, rows):
    """Codes held as 4-bit indices into their table of levels (IQ4_NL, IQ4_XS, MXFP4), 336 bytes per 16 rows
    and group (d float32, the table, the indices): within 1e-4 of the float64 product, an outlier channel and
    all; equal to the q8 tiles' product of the same codes where float16 holds the scales; the portable and
    vector loops equal; the rows read back exactly."""
    from anatomy.kernels.candidates import L4T

    fmt = lookup(48, 320, table, seed=rows)
    tiles = L4T.build(fmt)[0]
    assert tiles.shape == (3, 10, 336) and L4T.nbytes(fmt) == tiles.numel()
    x = torch.randn(rows, 320)
    x[:, 9] *= 40
    with native.limited(isa):
        y = torch.ops.anatomy.l4_tiles_linear(x, tiles)
    assert relative_error(y, reference_product(fmt, x)) < 1e-4
    torch.testing.assert_close(y, torch.ops.anatomy.l4_tiles_linear(x, tiles, True), rtol=1e-5, atol=1e-5)
    ids = torch.tensor([0, 17, 47, 3, 17])
    assert torch.equal(L4T.rows((tiles,))(ids), fmt.rows(ids))
    half = fmt.scale.half().float()  # scales a float16 holds: the q8 tiles' product is the same sums
    same = torch.ops.anatomy.pack_q8_tiles(fmt.codes, half)
    looked_up = torch.ops.anatomy.pack_l4_tiles(fmt.codes, half, fmt.levels)
    assert torch.equal(torch.ops.anatomy.l4_tiles_linear(x, looked_up), torch.ops.anatomy.q8_tiles_linear(x, same))


@AMX
def test_l4_tiles_on_amx_are_their_int16_product_bit_for_bit():
    fmt = lookup(48, 576, "IQ4")
    tiles = torch.ops.anatomy.pack_l4_tiles(fmt.codes, fmt.scale, fmt.levels)
    for rows in (1, 16, 37):
        x = torch.randn(rows, 576)
        assert torch.equal(torch.ops.anatomy.tiles_amx_linear(x, tiles), torch.ops.anatomy.l4_tiles_linear(x, tiles))


def test_l4_tiles_are_offered_for_codes_of_a_table_only():
    """l4 tiles are a layout of int8g codes that carry their table (`levels`, set by the GGUF reader), where
    VNNI runs; a code outside the table is refused by the packer, naming its row; the plan measures a
    compact layout against the table's 4-bit packing, so the 8-bit q8 tiles are not compact for such codes."""
    from anatomy.kernels.candidates import KERNELS, L4T, Q8T
    from anatomy.kernels.plan import compact_kernels

    fmt = lookup(32, 128)
    assert L4T.accepts(fmt) == native.runs("avx512-vnni") and not L4T.accepts(int8g(32, 128))
    assert fmt.packed_nbytes == 32 * 128 // 2 + fmt.scale.nbytes < Q8T.nbytes(fmt) / 1.25 <= fmt.nbytes
    assert fmt.take_rows(torch.arange(16)).levels is fmt.levels and fmt.signature.endswith("lut")
    assert fmt.take_columns(0, 64).levels is fmt.levels
    assert type(fmt).cat_rows([fmt, lookup(16, 128)]).levels is fmt.levels
    assert type(fmt).cat_rows([fmt, int8g(16, 128)]).levels is None  # codes of no one table: any int8
    dense = {"f32", "f16", "bf16", "onednn-bf16", "fbgemm-f16"}
    held = {k.form.name for k in compact_kernels(fmt, KERNELS)}
    assert held == {"l4t"} if native.runs("avx512-vnni") else not held & dense
    if native.runs("avx2"):
        with native.limited("avx2"):  # no tiles: the int8 codes as they are, never a wider copy
            held = {k.form.name for k in compact_kernels(fmt, KERNELS)}
            assert "q8x" in held and not held & dense
    bad = fmt.codes.clone()
    bad[5, 7] = 2  # not an IQ4 level
    with pytest.raises(RuntimeError, match="code 2 of row 5 is not one of the 16 levels"):
        torch.ops.anatomy.pack_l4_tiles(bad, fmt.scale, fmt.levels)


def test_bfloat16_in_bfloat16_out():
    fmt, _, tiles = packed(32, 128)
    y = torch.ops.anatomy.q4_tiles_linear(torch.randn(2, 128).bfloat16(), tiles)
    assert y.dtype == torch.bfloat16 and y.shape == (2, 32)


def test_bad_shapes_are_refused():
    _, q4, tiles = packed(32, 128)
    with pytest.raises(RuntimeError, match="not a multiple of 16"):
        torch.ops.anatomy.pack_q4_tiles(q4[:24])
    with pytest.raises(RuntimeError, match=r"tiles must be uint8 \[N/16, K/32, 320 \| 288 \| 296\] for K = 192"):
        torch.ops.anatomy.q4_tiles_linear(torch.randn(1, 192), tiles)
    with pytest.raises(RuntimeError, match="multiple of 64"):
        torch.ops.anatomy.q4_tiles_linear(torch.randn(1, 96), tiles)
    with pytest.raises(RuntimeError, match="bits = 4: the activations are int8 or int16"):
        torch.ops.anatomy.q4_tiles_linear(torch.randn(1, 128), tiles, False, 4)
    with pytest.raises(RuntimeError, match="q8_tiles_linear: tiles must be uint8 \\[N/16, K/32, 544\\]"):
        torch.ops.anatomy.q8_tiles_linear(torch.randn(1, 128), tiles)
    fmt = int8g(24, 128)
    with pytest.raises(RuntimeError, match="N = 24 is not a multiple of 16"):
        torch.ops.anatomy.pack_q8_tiles(fmt.codes, fmt.scale.float())


@pytest.mark.skipif(not native.runs("avx512-vnni"), reason="q4 tiles need AVX-512 VNNI, which this CPU lacks")
def test_the_fused_block_runs_every_product_on_tiles_with_int16_activations(smollm2_gguf_path, native_forced):
    """SmolLM2's Q4_1 products: int8's measured error over 258 is far inside the plan's bound, so each
    is on q4 tiles with int16 activations (the int8 bits all clear), the plan's own tiles."""
    import anatomy
    from anatomy.kernels.decode_block import INT16_ERROR
    from anatomy.kernels.record import by_kernel

    engine = DecoderEngine(anatomy.load(smollm2_gguf_path))
    assert all(isinstance(b, NativeBlock) for b in engine.model.stack.blocks)
    for i, block in enumerate(engine.model.stack.blocks):
        assert block.int8 == 0
        for linear, weight in zip(LINEARS, block.weights):
            layer = engine.model.get_submodule(f"stack.blocks.{i}.{linear}")
            measured = by_kernel(engine.plan.for_layer(f"stack.blocks.{i}.{linear}.weight").measurements["decode"])["q4x"]
            assert measured.error * INT16_ERROR <= engine.plan.threshold and weight.dim() == 3
            assert weight is layer.layouts["q4t"][0]  # the plan's tiles (it chose q4t here), not a second copy


def test_q8_tiles_give_back_the_rows_exactly():
    """Form.rows of q8 tiles: W's rows for any ids, bit for bit the format's own (codes * d in float32)."""
    from anatomy.kernels.candidates import Q8T

    fmt = int8g(48, 128)
    ids = torch.tensor([0, 5, 17, 47, 5, 31])
    assert torch.equal(Q8T.rows(Q8T.build(fmt))(ids), fmt.rows(ids))


@pytest.mark.skipif(not native.runs("avx512-vnni"), reason="q8 tiles need AVX-512 VNNI, which this CPU lacks")
def test_a_layout_that_fails_midway_leaves_its_weight_given_back_not_zeroed(native_forced, monkeypatch):
    """Packing the tied head's tiles fails on its third piece: the engine is not made, and the table whose
    first rows were discarded reads as given back (an InputError naming it), never as zeros."""
    from anatomy import build_model, get_preset
    from anatomy.errors import InputError
    from anatomy.kernels import piecewise
    from anatomy.weights.choice import install, matrices

    torch.manual_seed(0)
    m = build_model(get_preset("llama-7b", vocab_size=4096, d_model=128, n_heads=4, n_kv_heads=2, d_ff=256,
                               n_layers=1, max_seq_len=32, tie_embeddings=True)).eval()
    m = install(m, {name: int8g(*mod.weight.shape) for name, mod in matrices(m).items()}, dtype=torch.float32)
    table = m.stack.embed.tokens.compact
    monkeypatch.setattr(piecewise, "PIECE_BYTES", table.nbytes // 8)
    real, calls = piecewise.discard_rows, []

    def failing(fmt, start, stop):  # the engine's view holds its own format over the table's storage
        calls.append(fmt.shape)
        if fmt.shape == table.shape and calls.count(table.shape) == 3:
            raise MemoryError("the third piece")
        return real(fmt, start, stop)

    monkeypatch.setattr(piecewise, "discard_rows", failing)
    with pytest.raises(MemoryError, match="the third piece"):
        DecoderEngine(m, take_weights=True)
    assert table.released
    with pytest.raises(InputError, match="given to an engine"):
        m.stack.embed.tokens(torch.tensor([[1, 2]]))


def test_a_tied_table_is_read_from_the_heads_tiles_when_the_weights_are_taken(native_forced):
    """A tied Q8_0-style table whose head the plan holds as q8 tiles: an engine that took the weights reads
    the embedding's rows from those tiles and gives the table's format back, holding the matrix once,
    and computes the logits of an engine over the intact model bit for bit (the head's tiles built a piece of
    rows at a time, the table's pages discarded as they are packed)."""
    from anatomy import build_model, get_preset
    from anatomy.inference.engine import held_bytes
    from anatomy.kernels.layout_embedding import LayoutEmbedding
    from anatomy.weights.choice import install, matrices

    def model():
        torch.manual_seed(0)
        m = build_model(get_preset("llama-7b", vocab_size=96, d_model=128, n_heads=4, n_kv_heads=2, d_ff=256,
                                   n_layers=2, max_seq_len=32, tie_embeddings=True)).eval()
        return install(m, {name: int8g(*mod.weight.shape) for name, mod in matrices(m).items()}, dtype=torch.float32)

    kept, taken = model(), model()
    reference, engine = DecoderEngine(kept), DecoderEngine(taken, take_weights=True)
    assert "q8t16" in engine.model.lm_head.description
    assert engine.model.lm_head.consumed  # built from pieces of its rows, each given back (piecewise.py)
    assert isinstance(engine.model.token_embedding, LayoutEmbedding) and taken.stack.embed.tokens.compact.released
    table = kept.stack.embed.tokens.compact.nbytes
    assert held_bytes(reference.model) - held_bytes(engine.model) == table
    ids = torch.tensor([[1, 50, 34, 82, 47, 2]])
    assert torch.equal(engine.logits(ids), reference.logits(ids))
