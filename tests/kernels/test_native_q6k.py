"""anatomy's Q6_K products (kernels/native/q6k.cpp) against the float64 product of the int6 weight they
hold (GGUF Q6_K blocks): q6_linear with x rounded to int8 per 32 as for q8x (about q8x's error on the same
inputs), q6f_linear with x as it is (float32's rounding), q6s_linear with x rounded to int16 per 256
(3e-5); every vector path this CPU has (AVX-512, AVX2:
each run under native.limited) equals the portable one; the layout holds the codes in the order q6k.cpp
documents; the kernels are offered where a vector path runs. The q6 tiles (q6_tiles.cpp): where their
bytes lie, x rounded to int16 per 32 (~2e-5) or int8 (q6_linear's product), every path the portable loop's
bits, the rows exactly, and an engine's fused blocks and tied table on them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from anatomy import build_model, get_preset
from anatomy.checkpoints.gguf_types import TENSOR_TYPES_BY_NAME
from anatomy.inference.engine import Chunk, DecoderEngine
from anatomy.inference.sampling import SamplingParams
from anatomy.kernels import native
from anatomy.kernels.candidates import KERNELS_BY_NAME, Q6T, Q6X, Q8X, candidates, reference_product, relative_error
from anatomy.kernels.planned_linear import PlannedLinear
from anatomy.weights.choice import install, matrices
from anatomy.weights.formats import Int8GroupWeight
from anatomy.weights.gguf_blocks import format_from_gguf
from anatomy.weights.int6 import Int6Weight

ERROR = 1e-2  # the plan's bound; int8 activations err ~5e-3 on gaussian inputs
PATHS = list(native.vector_paths())  # the portable loop and this CPU's vector paths


@pytest.fixture(params=PATHS)
def path(request):
    with native.limited(request.param) as running:
        assert running == request.param
        yield running == "portable"


def int6(N: int, K: int, seed: int = 0, d: float = 1e-3) -> Int6Weight:
    """Random Q6_K blocks (codes and sub-scales uniform, float16 d ~ `d`) carried into int6."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(N * K // 256, 210), dtype=np.uint8)
    blocks[:, 208:210] = (rng.standard_normal((N * K // 256, 1)) * d).astype(np.float16).view(np.uint8)
    return format_from_gguf(blocks.reshape(-1), TENSOR_TYPES_BY_NAME["Q6_K"], (N, K), label="w")


def pack(fmt: Int6Weight) -> torch.Tensor:
    return torch.ops.anatomy.pack_q6(fmt.low, fmt.high, fmt.scale, fmt.d)


def test_the_layout_holds_what_q6k_cpp_says():
    """Per super-block: d, the 16 sub-scales, then byte t of chunk c (planes L0, L1, H) is input
    32 (t / 8) + 4 (2c + t / 4 % 2) + t % 4."""
    fmt = int6(3, 512)
    blocks = pack(fmt).view(3, 2, 210)
    assert torch.equal(blocks[..., :2].contiguous().view(torch.float16).view(3, 2), fmt.d)
    assert torch.equal(blocks[..., 2:18].contiguous().view(torch.int8).reshape(3, 32), fmt.scale)
    l0, l1, h = blocks[..., 18:82], blocks[..., 82:146], blocks[..., 146:210]
    low = torch.stack([l0 & 15, l0 >> 4, l1 & 15, l1 >> 4], dim=2)  # [3, 2, chunk, 64]
    top = torch.stack([(h >> (2 * c)) & 3 for c in range(4)], dim=2)
    q = low | (top << 4)
    c, t = torch.arange(4).view(4, 1), torch.arange(64).view(1, 64)
    k = 32 * (t // 8) + 4 * (2 * c + t // 4 % 2) + t % 4  # [chunk, 64]
    natural = torch.empty(3, 2, 256, dtype=torch.uint8)
    natural[:, :, k.reshape(-1)] = q.reshape(3, 2, 256)
    assert torch.equal(natural.reshape(3, 512), fmt.codes())


@pytest.mark.parametrize("K", [256, 768, 1536])
@pytest.mark.parametrize("rows", [1, 3, 16, 40])
def test_q6_equals_the_float64_product(rows, K, path):
    fmt = int6(48, K, seed=K + rows)
    x = torch.randn(rows, K)
    y = torch.ops.anatomy.q6_linear(x, pack(fmt), path)
    assert y.shape == (rows, 48) and y.dtype == torch.float32
    error = relative_error(y, reference_product(fmt, x))
    assert error < ERROR
    # the same activations' rounding through q8x on the same values in int8 groups: the error is x's
    int8g = Int8GroupWeight.from_float(fmt.dequantize())
    packed8 = torch.ops.anatomy.pack_q8(int8g.codes, int8g.scale.float())
    q8_error = relative_error(torch.ops.anatomy.q8_linear(x, packed8, path), reference_product(int8g, x))
    assert error < 1.2 * q8_error


@pytest.mark.parametrize("K", [256, 768, 1536])
@pytest.mark.parametrize("rows", [1, 3, 16, 40])
def test_q6f_is_the_float_product(rows, K, path):
    """q6f decodes each weight to float32 and takes x as it is: the product to float32's rounding."""
    fmt = int6(48, K, seed=K + rows)
    x = torch.randn(rows, K)
    y = torch.ops.anatomy.q6f_linear(x, pack(fmt), path)
    assert y.shape == (rows, 48) and y.dtype == torch.float32
    assert relative_error(y, reference_product(fmt, x)) < 1e-5


@pytest.mark.parametrize("K", [256, 768, 1536])
@pytest.mark.parametrize("rows", [1, 3, 16, 40])
def test_q6s_is_the_product_to_int16_activations_rounding(rows, K, path):
    """q6s rounds x to int16 per 256 inputs (one scale each): ~3e-5 on gaussian inputs, well inside an
    LM head's 1e-3."""
    fmt = int6(48, K, seed=K + rows)
    x = torch.randn(rows, K)
    y = torch.ops.anatomy.q6s_linear(x, pack(fmt), path)
    assert y.shape == (rows, 48) and y.dtype == torch.float32
    assert relative_error(y, reference_product(fmt, x)) < 1e-4


@pytest.mark.skipif("avx512" not in PATHS, reason="q6s's vector path needs AVX-512; this CPU has none")
def test_the_int16_vector_path_equals_the_portable_one():
    """q6s's integer sums are exact in both paths, the float ones in another order: 1e-6 of the largest."""
    fmt = int6(67, 768)  # 67 outputs: a tail after the 16-row tiles
    packed = pack(fmt)
    for rows in (1, 7, 13, 20):  # chunks of 8 rows with remainders
        x = torch.randn(rows, 768) * 3 + 0.5  # a mean: the -32 taken off through x's sums is large
        with native.limited("avx512"):
            fast = torch.ops.anatomy.q6s_linear(x, packed, False)
        portable = torch.ops.anatomy.q6s_linear(x, packed, True)
        torch.testing.assert_close(fast, portable, rtol=1e-5, atol=1e-6 * float(portable.abs().max()))


@pytest.mark.skipif(len(PATHS) < 2, reason="this CPU runs no vector path: only the portable one runs")
@pytest.mark.parametrize("isa", PATHS[1:])
def test_the_vector_paths_equal_the_portable_one(isa):
    """The integer sums are exact in every path, the float arithmetic in another order: to float32's
    rounding of the outputs (1e-6 of the largest)."""
    fmt = int6(67, 768)  # 67 outputs: the one-row loop's 4-row unroll and the 16-row tiles leave tails
    packed = pack(fmt)
    for rows in (1, 7, 13, 20):  # chunks of 8 rows with remainders, and more than 16
        x = torch.randn(rows, 768) * 3 + 0.5  # a mean: the codes' pair sums taken off are large
        with native.limited(isa):
            fast = torch.ops.anatomy.q6_linear(x, packed, False)
        portable = torch.ops.anatomy.q6_linear(x, packed, True)
        torch.testing.assert_close(fast, portable, rtol=1e-5, atol=1e-6 * float(portable.abs().max()))


@pytest.mark.skipif(len(PATHS) < 2, reason="this CPU runs no vector path: only the portable one runs")
@pytest.mark.parametrize("isa", PATHS[1:])
def test_the_float_vector_paths_equal_the_portable_one(isa):
    """q6f's float32 sums in another order (the portable loop's one by one): 2e-6 of the largest output."""
    fmt = int6(67, 768)
    packed = pack(fmt)
    for rows in (1, 7, 13, 20):
        x = torch.randn(rows, 768) * 3 + 0.5
        with native.limited(isa):
            fast = torch.ops.anatomy.q6f_linear(x, packed, False)
        portable = torch.ops.anatomy.q6f_linear(x, packed, True)
        torch.testing.assert_close(fast, portable, rtol=1e-5, atol=2e-6 * float(portable.abs().max()))


@pytest.mark.parametrize("op", ["q6_linear", "q6f_linear", "q6s_linear"])
def test_bfloat16_in_bfloat16_out(op, path):
    fmt = int6(32, 512)
    x = torch.randn(2, 512)
    y = getattr(torch.ops.anatomy, op)(x.bfloat16(), pack(fmt), path)
    assert y.dtype == torch.bfloat16 and relative_error(y, reference_product(fmt, x)) < ERROR


def test_bad_shapes_are_refused_by_the_operators():
    fmt = int6(16, 512)
    with pytest.raises(RuntimeError, match="multiple of 256"):
        torch.ops.anatomy.q6_linear(torch.randn(1, 320), pack(fmt))
    with pytest.raises(RuntimeError, match="bytes a row"):
        torch.ops.anatomy.q6_linear(torch.randn(1, 256), pack(fmt))
    with pytest.raises(RuntimeError, match="q6f_linear: weight has 210 bytes a row, K = 512 needs 420"):
        torch.ops.anatomy.q6f_linear(torch.randn(1, 512), pack(int6(16, 256)))
    with pytest.raises(RuntimeError, match="q6s_linear: weight has 210 bytes a row, K = 512 needs 420"):
        torch.ops.anatomy.q6s_linear(torch.randn(1, 512), pack(int6(16, 256)))
    with pytest.raises(RuntimeError, match="pack_q6: low uint8"):
        torch.ops.anatomy.pack_q6(fmt.low, fmt.high, fmt.scale.float(), fmt.d)


@pytest.mark.skipif(not native.runs("amx"), reason="AMX's int8 tiles: this CPU lacks them or Linux refused them")
@pytest.mark.parametrize("rows", [1, 7, 16, 33, 130])
def test_q6_on_amx_is_the_product_to_int16_activations_rounding(rows):
    """q6_amx_linear rounds x to int16 per 32 inputs (q6s: per 256) and sums 16 rows of x by 16 output
    rows per sub-block on AMX: within 1e-4 of the float64 product, an outlier channel and all, and no
    further from it than q6s; offered where AMX runs and N is a multiple of 16, refused below AMX."""
    fmt = int6(48, 768, seed=rows)
    x = torch.randn(rows, 768)
    x[:, 3] *= 40
    want = reference_product(fmt, x)
    y = torch.ops.anatomy.q6_amx_linear(x, pack(fmt))
    assert y.shape == (rows, 48) and relative_error(y, want) < 1e-4
    assert relative_error(y, want) <= relative_error(torch.ops.anatomy.q6s_linear(x, pack(fmt)), want)
    assert "q6s/amx" in {k.name for k in candidates(fmt)} and "q6s/amx" not in {k.name for k in candidates(int6(40, 256))}
    with native.limited("avx512-vnni"):
        assert "q6s/amx" not in {k.name for k in candidates(fmt)}
        with pytest.raises(RuntimeError, match="runs no AMX"):
            torch.ops.anatomy.q6_amx_linear(x, pack(fmt))
    with pytest.raises(RuntimeError, match="N = 40 is not a multiple of 16"):
        torch.ops.anatomy.q6_amx_linear(torch.randn(1, 256), pack(int6(40, 256)))


@pytest.mark.skipif(not native.available(), reason="this CPU runs no vector path of the native kernels")
def test_offered_for_int6_where_a_vector_path_runs():
    fmt = int6(64, 512)
    assert {KERNELS_BY_NAME["q6x"], KERNELS_BY_NAME["q6f"]} <= set(candidates(fmt)) and not Q8X.accepts(fmt)
    assert not Q6X.accepts(Int8GroupWeight.from_float(fmt.dequantize()))
    assert {"f32", "bf16"} <= {k.name for k in candidates(fmt)}  # the dense fallbacks dequantize it
    with native.limited("portable"):  # a CPU without AVX2: the portable loop is for checking, not offered
        assert not {"q6x", "q6f", "q6s"} & {k.name for k in candidates(fmt)}
    with native.limited("avx2"):  # q6s only where its AVX-512 loop runs
        assert "q6s" not in {k.name for k in candidates(fmt)}
    assert ("q6s" in {k.name for k in candidates(fmt)}) == native.runs("avx512")
    x = torch.randn(3, 512)
    for name, bound in (("q6x", ERROR), ("q6f", 1e-5)) + ((("q6s", 1e-4),) if native.runs("avx512") else ()):
        layer = PlannedLinear.with_kernel(KERNELS_BY_NAME[name], fmt)
        assert relative_error(layer(x), reference_product(fmt, x)) < bound


def test_an_engine_decodes_int6_layers_on_q6x(forced_timings):
    """A tiny decoder whose every matrix is int6: the plan (timings forced, accuracy checked) runs its
    decode steps on q6x, and each step's logits are the model's own forward's (its exact product) to
    int8 activations' rounding."""
    if not native.available():
        pytest.skip(f"q6x needs the native library on AVX2 or better (here: {native.why_not()})")
    torch.manual_seed(0)
    model = build_model(get_preset("llama-7b", vocab_size=96, d_model=256, n_heads=4, n_kv_heads=2, d_ff=512,
                                   n_layers=2, max_seq_len=32)).eval()
    formats = {name: int6(*m.weight.shape, seed=i, d=3e-5) for i, (name, m) in enumerate(matrices(model).items())}
    install(model, formats, dtype=torch.float32)
    tokens = [5, 17, 33, 2, 9, 41, 8, 60]
    with torch.no_grad():
        reference = model(torch.tensor([tokens]))[0]  # [S, V]
    engine = DecoderEngine(model)
    assert "decode q6x" in engine.model.stack.blocks[0].ffn.down.description
    cache = engine.paged_cache(num_blocks=2, block_size=16)
    logits = torch.stack([engine.step(cache, [Chunk([t], i, [0, 1])])[0] for i, t in enumerate(tokens)])
    # each of the 9 products on a token's path rounds its input to int8 (~0.5% rms): sqrt(9) of them, 2x slack
    assert relative_error(logits, reference.double()) < 2 * 3 * 5e-3


def test_the_q6_layout_gives_back_the_rows_exactly():
    """Form.rows of the q6 layout: W's rows for any ids, bit for bit the format's own ((q - 32) * sc * d)."""
    fmt = int6(40, 768, seed=3)
    ids = torch.tensor([0, 7, 39, 7, 21, 1])
    assert torch.equal(Q6X.rows(Q6X.build(fmt))(ids), fmt.rows(ids))


@pytest.mark.skipif(not native.available(), reason="the q6 layout needs the native library on AVX2 or better")
def test_a_tied_q6_k_table_is_read_from_the_heads_layout_when_the_weights_are_taken(native_forced):
    """A tied Q6_K table (the Q4_K_M and Q6_K files' embedding) whose head the plan holds in the q6 layout:
    an engine that took the weights reads the embedding's rows from it and gives the table's format back,
    holding the matrix once, and computes the logits of an engine over the intact model bit for bit."""
    from anatomy.inference.engine import held_bytes
    from anatomy.kernels.layout_embedding import LayoutEmbedding

    def model():
        torch.manual_seed(0)
        m = build_model(get_preset("llama-7b", vocab_size=96, d_model=256, n_heads=4, n_kv_heads=2, d_ff=512,
                                   n_layers=2, max_seq_len=64, tie_embeddings=True)).eval()
        return install(m, {name: int6(*mod.weight.shape, seed=i) for i, (name, mod) in enumerate(matrices(m).items())},
                       dtype=torch.float32)

    kept, taken = model(), model()
    reference, engine = DecoderEngine(kept), DecoderEngine(taken, take_weights=True)
    assert "q6" in engine.model.lm_head.description
    assert isinstance(engine.model.token_embedding, LayoutEmbedding) and taken.stack.embed.tokens.compact.released
    assert held_bytes(reference.model) - held_bytes(engine.model) == kept.stack.embed.tokens.compact.nbytes
    ids = torch.tensor([[1, 50, 34, 82, 47, 2]])
    assert torch.equal(engine.logits(ids), reference.logits(ids))
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)  # past the 32 eager steps: the captured step too
    tokens = [[int(t) for t in e.tokens(ids.tolist(), params)] for e in (engine, reference)]
    assert tokens[0] == tokens[1] and engine.captured_graphs


# -- q6 tiles (q6_tiles.cpp) ---------------------------------------------------------------------

INT16_BOUND = 1e-4  # x rounded to int16 per 32: ~2e-5 relative on gaussian inputs
vnni = pytest.mark.skipif(not native.runs("avx512-vnni"), reason="q6 tiles run on AVX-512 VNNI, which this CPU lacks")


def q6_tiles(fmt) -> torch.Tensor:
    return torch.ops.anatomy.pack_q6_tiles(pack(fmt))


def test_the_tiles_hold_what_q6_tiles_cpp_says():
    """Per tile of 16 rows and super-block: d [16] float16, sc [sub-block, row] int8, then per group of
    32 inputs: byte 64 v + 4 r + i of the low nibbles holds row r's input 4 v + i (low) and 4 (v + 4) + i
    (high); byte 256 + 64 u + 4 r + i bits 2 c, 2 c + 1 hold the top bits of input 4 (4 u + c) + i."""
    fmt = int6(32, 512, seed=5)
    t = q6_tiles(fmt)
    assert t.shape == (2, 2, 3360) and t.dtype == torch.uint8
    d = t[..., :32].contiguous().view(torch.float16)  # [tile, super, row]
    assert torch.equal(d.permute(0, 2, 1).reshape(32, 2), fmt.d)
    sc = t[..., 32:288].contiguous().view(torch.int8).view(2, 2, 16, 16)  # [tile, super, sub, row]
    assert torch.equal(sc.permute(0, 3, 1, 2).reshape(32, 32), fmt.scale)
    codes = torch.empty(32, 512, dtype=torch.uint8)
    for n in range(32):
        for b in range(2):
            block = t[n // 16, b]
            for g in range(8):
                group = block[288 + 384 * g:288 + 384 * (g + 1)]
                for i in range(32):
                    j, r = i // 4, n % 16
                    low = int(group[64 * (j % 4) + 4 * r + i % 4])
                    low = low >> 4 if j >= 4 else low & 15
                    top = int(group[256 + 64 * (j // 4) + 4 * r + i % 4]) >> (2 * (j % 4)) & 3
                    codes[n, 256 * b + 32 * g + i] = low | top << 4
    assert torch.equal(codes, fmt.codes())


def test_the_tiles_give_back_the_rows_exactly():
    """Form.rows of q6 tiles: W's rows for any ids, bit for bit the format's own ((q - 32) * sc * d)."""
    fmt = int6(48, 768, seed=3)
    ids = torch.tensor([0, 7, 47, 7, 21, 16, 1])
    assert torch.equal(Q6T.rows((q6_tiles(fmt),))(ids), fmt.rows(ids))


@pytest.mark.parametrize("K", [256, 768, 1536])
@pytest.mark.parametrize("rows", [1, 3, 9, 40])
def test_q6_tiles_are_the_product_to_int16_activations_rounding(rows, K):
    fmt = int6(48, K, seed=K + rows)
    x = torch.randn(rows, K)
    y = torch.ops.anatomy.q6_tiles_linear(x, q6_tiles(fmt))
    assert y.shape == (rows, 48) and y.dtype == torch.float32
    assert relative_error(y, reference_product(fmt, x)) < INT16_BOUND


@pytest.mark.parametrize("isa", PATHS)
def test_every_path_equals_the_portable_loop_bit_for_bit(isa):
    """The same codes, the same exact integer sums and the same float operations in the same order: the
    same bits. x has a zero group (scale 0), a mean (large sums taken off for the -32) and groups whose
    largest magnitude is negative (the code -32767: high byte -128)."""
    fmt = int6(64, 768, seed=11)
    packed = q6_tiles(fmt)
    for rows in (1, 7, 8, 13, 20):  # passes of 8 rows with remainders
        x = torch.randn(rows, 768) * 3 + 0.5
        x[0, 32:64] = 0
        x[:, 100] = -50.0
        with native.limited(isa):
            fast = torch.ops.anatomy.q6_tiles_linear(x, packed, False)
        portable = torch.ops.anatomy.q6_tiles_linear(x, packed, True)
        assert torch.equal(fast, portable)
        assert relative_error(portable, reference_product(fmt, x)) < INT16_BOUND


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("rows", [1, 7, 8, 13, 20])
def test_q6_tiles_with_int8_activations_are_the_q6_row_product(isa, rows):
    """bits = 8: x rounded to int8 per 32 as q6_linear rounds it (the same codes, exact integer sums per
    sub-block): q6_linear's product on the q6 row layout within 1e-6 (relative); every path the portable loop's bits;
    within int8's error of the float64 product, and coarser than int16's."""
    fmt = int6(48, 768, seed=20 + rows)
    packed = q6_tiles(fmt)
    x = torch.randn(rows, 768) * 3 + 0.5
    x[0, 32:64] = 0
    with native.limited(isa):
        y = torch.ops.anatomy.q6_tiles_linear(x, packed, False, 8)
    portable = torch.ops.anatomy.q6_tiles_linear(x, packed, True, 8)
    assert torch.equal(y, portable)
    assert relative_error(y, torch.ops.anatomy.q6_linear(x, pack(fmt), True)) < 1e-6  # float sums' order only
    error = relative_error(y, reference_product(fmt, x))
    assert INT16_BOUND < error < ERROR


def test_q6_tiles_take_bfloat16_and_give_it_back():
    fmt = int6(16, 256)
    y = torch.ops.anatomy.q6_tiles_linear(torch.randn(2, 256, dtype=torch.bfloat16), q6_tiles(fmt))
    assert y.dtype == torch.bfloat16 and y.shape == (2, 16)


def test_q6_tiles_refuse_bad_shapes():
    packed = q6_tiles(int6(16, 512))
    with pytest.raises(RuntimeError, match=r"q6_tiles_linear: tiles must be uint8 \[N/16, K/256, 3360\] for K = 768"):
        torch.ops.anatomy.q6_tiles_linear(torch.randn(1, 768), packed)
    with pytest.raises(RuntimeError, match="K = 96 must be a multiple of 256"):
        torch.ops.anatomy.q6_tiles_linear(torch.randn(1, 96), packed)
    with pytest.raises(RuntimeError, match="bits = 4: x is rounded to 8 or 16 bits"):
        torch.ops.anatomy.q6_tiles_linear(torch.randn(1, 512), packed, False, 4)
    with pytest.raises(RuntimeError, match="tiles must be uint8"):
        torch.ops.anatomy.q6_tiles_linear(torch.randn(1, 512), packed.view(torch.int8))
    with pytest.raises(RuntimeError, match="pack_q6_tiles: N = 40 is not a multiple of 16"):
        torch.ops.anatomy.pack_q6_tiles(pack(int6(40, 256)))
    with pytest.raises(RuntimeError, match=r"pack_q6_tiles: the q6 layout is uint8 \[N, K/256 \* 210\]"):
        torch.ops.anatomy.pack_q6_tiles(torch.zeros(16, 200, dtype=torch.uint8))


def test_q6_tiles_are_offered_where_vnni_runs_and_n_allows():
    fmt = int6(64, 512)
    for name in ("q6t", "q6t16"):
        assert (KERNELS_BY_NAME[name] in candidates(fmt)) == native.runs("avx512-vnni")
    assert not Q6T.accepts(int6(40, 512))  # N not a multiple of 16
    for below in ("avx512", "avx2", "portable"):  # without VNNI the tiles are not offered
        with native.limited(below):
            assert "q6t16" not in {k.name for k in candidates(fmt)}
    if native.runs("avx512-vnni"):
        x = torch.randn(3, 512)
        layer = PlannedLinear.with_kernel(KERNELS_BY_NAME["q6t16"], fmt)
        assert relative_error(layer(x), reference_product(fmt, x)) < INT16_BOUND


@pytest.fixture
def q6t_first(native_forced, monkeypatch):
    """The forced timings (conftest.py), with q6t16 ranked before every other kernel."""
    from anatomy.kernels import timing

    forced = timing._time

    def first(entries, repeats):
        return {name: (0.5e-6, 0.0) if name == "q6t16" else t for name, t in forced(entries, repeats).items()}

    monkeypatch.setattr(timing, "_time", first)


def _int6_model(tie: bool = False):
    torch.manual_seed(0)
    model = build_model(get_preset("llama-7b", vocab_size=96, d_model=256, n_heads=4, n_kv_heads=2, d_ff=512,
                                   n_layers=2, max_seq_len=64, tie_embeddings=tie)).eval()
    formats = {name: int6(*m.weight.shape, seed=i, d=3e-5) for i, (name, m) in enumerate(matrices(model).items())}
    return install(model, formats, dtype=torch.float32)


@vnni
def test_the_fused_blocks_and_the_head_run_on_q6_tiles(q6t_first):
    """A tiny decoder whose every matrix is int6, the plan ranking q6t16 first (the accuracy checks
    still run): each fused block's products are q6 tiles, the head's too, and each step's logits are the
    model's own forward's (its exact product of the same weights) to int16 activations' rounding."""
    from anatomy.kernels.decode_block import NativeBlock

    model = _int6_model()
    tokens = [5, 17, 33, 2, 9, 41, 8, 60]
    with torch.no_grad():
        reference = model(torch.tensor([tokens]))[0]  # [S, V]
    engine = DecoderEngine(model)
    assert "decode q6t16" in engine.model.lm_head.description
    blocks = engine.model.stack.blocks
    assert all(isinstance(b, NativeBlock) for b in blocks)
    assert all(w.dim() == 3 and w.shape[2] == 3360 for b in blocks for w in b.weights) and blocks[0].int8 == 0
    cache = engine.paged_cache(num_blocks=2, block_size=16)
    logits = torch.stack([engine.step(cache, [Chunk([t], i, [0, 1])])[0] for i, t in enumerate(tokens)])
    assert relative_error(logits, reference.double()) < 1e-3


@vnni
def test_a_tied_table_is_read_from_the_heads_q6_tiles(q6t_first):
    """A tied Q6_K table whose head runs on q6 tiles: an engine that took the weights reads the
    embedding's rows from the tiles (LayoutEmbedding), holds the matrix once, and gives the logits of an
    engine over the intact model bit for bit."""
    from anatomy.kernels.layout_embedding import LayoutEmbedding

    reference, engine = DecoderEngine(_int6_model(tie=True)), DecoderEngine(_int6_model(tie=True), take_weights=True)
    assert "q6t16" in engine.model.lm_head.description
    assert isinstance(engine.model.token_embedding, LayoutEmbedding)
    ids = torch.tensor([[1, 50, 34, 82, 47, 2]])
    assert torch.equal(engine.logits(ids), reference.logits(ids))
