"""anatomy's native RMSNorm and its decode attention over float caches, against torch's references:
anatomy::rms_norm == F.rms_norm (float32 to 1e-6, bfloat16 to one rounding), the engine view's norms
swapped for it; native.read_cache over float32 / bfloat16 caches == SDPA (GQA folded, masks, head dims
that do and do not take the vector path); the engine chooses it only where it measures faster, and
runs SDPA without the library."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import anatomy.kernels.attention as attention
from anatomy.inference.engine import DecoderEngine
from anatomy.kernels import native
from anatomy.kernels.cache import CACHE_ENV
from anatomy.kernels.norm import NativeRMSNorm, swap_norms
from anatomy.layers.attention import Attention
from anatomy.layers.norm import RMSNorm

from ..inference.conftest import llama_tiny

needs_library = pytest.mark.skipif(not native.loaded(), reason="the native library is built by make")


@needs_library
@pytest.mark.parametrize("shape", [(1, 1, 576), (3, 7, 64), (2, 130)])
def test_rms_norm_is_torchs(shape):
    torch.manual_seed(0)
    x, w = torch.randn(*shape) * 3, torch.randn(shape[-1])
    torch.testing.assert_close(torch.ops.anatomy.rms_norm(x, w, 1e-5), F.rms_norm(x, (shape[-1],), w, 1e-5),
                               rtol=1e-6, atol=1e-6)
    xb = x.bfloat16()  # float32 arithmetic, one rounding to bfloat16 at the end
    want = (x.bfloat16().float() * torch.rsqrt(xb.float().pow(2).mean(-1, keepdim=True) + 1e-5) * w).bfloat16()
    got = torch.ops.anatomy.rms_norm(xb, w, 1e-5)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=8e-3, atol=1e-6)


@needs_library
def test_the_engine_views_norms_are_native_and_the_models_are_not(monkeypatch):
    """Two per block and the final norm swapped in the view, none in the caller's model; the view's
    logits are those of the same engine with torch's norms (the same plan), 1e-5 with float32 branches."""
    import anatomy.inference.engine.view as view

    torch.manual_seed(0)
    model = llama_tiny()
    engine = DecoderEngine(model)
    native_norms = [m for m in engine.model.modules() if isinstance(m, NativeRMSNorm)]
    assert len(native_norms) == 2 * model.config.n_layers + 1
    assert not any(isinstance(m, NativeRMSNorm) for m in model.modules()), "the caller's model is never changed"
    monkeypatch.setattr(view, "swap_norms", lambda v: 0)
    torchs = DecoderEngine(model)
    assert not any(isinstance(m, NativeRMSNorm) for m in torchs.model.modules())
    ids = torch.tensor([[5, 17, 33, 2, 9]])
    tolerance = 1e-5 if engine.branch_dtype == torch.float32 else 3e-2  # bf16 branches round the norms' outputs
    torch.testing.assert_close(engine.logits(ids), torchs.logits(ids), rtol=tolerance, atol=tolerance)


def test_without_the_library_nothing_is_swapped(monkeypatch):
    monkeypatch.setattr(native, "loaded", lambda: False)
    model = llama_tiny()
    assert swap_norms(model) == 0 and not any(isinstance(m, NativeRMSNorm) for m in model.modules())
    assert attention.decode_reader(model.config, torch.float32) is None


ISAS = native.vector_paths()  # the portable loops and this CPU's vector paths


@needs_library
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [64, 40, 36])  # 40: AVX2's 8 lanes but not AVX-512's 16; 36: neither (portable)
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("heads", [(9, 3), (8, 4), (4, 4)])  # a KV head's query rows: 3 or 9, 2 or 6, 1 or 3
def test_reading_a_float_cache_equals_sdpa(isa, dtype, d, rows, heads):
    """GQA (query heads over KV heads), a cache of 300 slots (several blocks and a ragged one), a
    padded row and a decode mask, on every vector path this CPU has: float32 to 1e-5, bfloat16 and
    float16 to their rounding of the output."""
    torch.manual_seed(0)
    (H, H_kv), B, T = heads, 2, 300
    q = torch.randn(B, H, rows, d).to(dtype)
    k, v = (torch.randn(B, H_kv, T, d).to(dtype) for _ in range(2))
    mask = torch.zeros(B, 1, rows, T)
    mask[0, ..., 250:] = float("-inf")
    mask[1, ..., :9] = float("-inf")
    with native.limited(isa):
        got = native.read_cache(q, k, v, mask=mask.to(dtype), scale=1 / math.sqrt(d))
    want = F.scaled_dot_product_attention(q.double(), k.double().repeat_interleave(H // H_kv, 1),
                                          v.double().repeat_interleave(H // H_kv, 1), attn_mask=mask.double())
    assert got.dtype == dtype
    tolerance = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype]
    torch.testing.assert_close(got.double(), want, rtol=tolerance, atol=tolerance)


@needs_library
@pytest.mark.parametrize("faster", [True, False])
def test_the_engine_reads_float_caches_natively_only_where_it_measured_faster(monkeypatch, tmp_path, faster):
    """The reader is set where it measured faster (and never on the caller's model); its logits are SDPA's
    eager ones, teacher-forced through captured steps, 1e-4 (branches in float32, as the plan runs this model here)."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))  # no decision kept by an earlier test
    monkeypatch.setattr(attention, "_native_faster", lambda *shape: faster)
    torch.manual_seed(0)
    model = llama_tiny()
    engine = DecoderEngine(model)
    readers = {m.reader for m in engine.model.modules() if isinstance(m, Attention)}
    assert readers == ({native.read_cache} if faster else {None})
    assert all(m.reader is None for m in model.modules() if isinstance(m, Attention))
    plain = DecoderEngine(model, capture=False)
    plain._read_float_caches(None)
    tolerance = 1e-4 if engine.branch_dtype == torch.float32 else 3e-2  # a plan with bf16 branches rounds attention
    torch.testing.assert_close(forced_logits(engine), forced_logits(plain), rtol=tolerance, atol=tolerance)


def forced_logits(engine: DecoderEngine, steps: int = 40) -> torch.Tensor:
    """Logits [1, steps, V] of a run fed fixed tokens, past CAPTURE_AFTER (so captured steps too)."""
    from anatomy.inference.sampling import SamplingParams

    tokens = torch.arange(steps).remainder(90)[None] + 3  # [1, steps]
    run = engine.start([[5, 17, 33, 2, 9, 41]], SamplingParams(max_new_tokens=steps))
    logits = [run.prefill()]
    for i in range(steps - 1):
        logits.append(run.decode(tokens[:, i]))
    return torch.stack(logits, 1)


@needs_library
def test_attention_over_a_paged_pool_reads_it_where_it_lies():
    """A pool of 7 blocks of 16 slots, two rows reading 3 blocks each out of order through their tables:
    the reader over Pages == SDPA over the rows' gathered keys (float32, 1e-5), and without a reader
    attention gathers them itself (the same rows)."""
    from anatomy.kv_format import Pages
    from anatomy.layers.attention import attend

    torch.manual_seed(0)
    pool_k, pool_v = (torch.randn(7, 16, 3, 64) for _ in range(2))  # [N, bs, H_kv, d_h]
    tables = torch.tensor([[4, 0, 6], [2, 5, 1]])
    k, v = Pages(pool_k, tables), Pages(pool_v, tables)
    gathered_k = pool_k[tables].reshape(2, 48, 3, 64).transpose(1, 2)  # [B, H_kv, T, d_h]
    gathered_v = pool_v[tables].reshape(2, 48, 3, 64).transpose(1, 2)
    assert torch.equal(k.gather(), gathered_k)
    q = torch.randn(2, 9, 1, 64)
    mask = torch.zeros(2, 1, 1, 48)
    mask[0, ..., 40:] = float("-inf")  # row 0 has 40 keys so far
    want = F.scaled_dot_product_attention(q, gathered_k.repeat_interleave(3, 1), gathered_v.repeat_interleave(3, 1),
                                          attn_mask=mask)
    got, _ = attend(q, k, v, mask=mask, reader=native.read_cache)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    unread, _ = attend(q, k, v, mask=mask)
    torch.testing.assert_close(unread, want, rtol=1e-5, atol=1e-5)


@needs_library
@torch.inference_mode()
def test_served_decode_steps_read_the_paged_cache_in_place(monkeypatch):
    """An engine whose view reads float caches natively, over a paged cache with scattered blocks (its
    decode steps read the pools in place, never a gathered copy): 40
    greedy decode steps (past PAGED_RECORD_AFTER, so captured ones too) give the logits of the model's
    full forward over the same tokens (1e-4 with float32 branches)."""
    from anatomy.inference.engine.paged import Chunk

    from anatomy.kv_format import Pages

    paged_reads, read = [], native.read_cache

    def read_cache(q, k, v, **kwargs):
        paged_reads.append(isinstance(k, Pages))
        return read(q, k, v, **kwargs)

    monkeypatch.setattr(attention, "_native_faster", lambda *shape: True)
    monkeypatch.setattr(native, "read_cache", read_cache)
    torch.manual_seed(0)
    model = llama_tiny()
    engine = DecoderEngine(model)
    cache = engine.paged_cache(num_blocks=24, block_size=4)
    blocks = [17, 3, 20, 8, 11, 0, 5, 14, 22, 9, 2, 19, 6]
    tokens = [5, 17, 33, 2, 9, 41]
    logits = engine.step(cache, [Chunk(tokens, 0, blocks)])[0]
    tolerance = 1e-4 if engine.branch_dtype == torch.float32 else 3e-2
    for _ in range(40):
        torch.testing.assert_close(logits, model(torch.tensor([tokens]))[0, -1], rtol=tolerance, atol=tolerance)
        tokens.append(int(logits.argmax()))
        logits = engine.step(cache, [Chunk(tokens[-1:], len(tokens) - 1, blocks)])[0]
    assert engine.captured_graphs >= 1 and paged_reads and all(paged_reads), "decode steps read the pool in place"
