"""The static KV cache (the paged one, a fixed block table per row): decoding with it gives the logits
of a full forward over the same prefix."""

from __future__ import annotations

import sys

import pytest
import torch

from anatomy import get_preset
from anatomy.deprecation import AnatomyDeprecationWarning
from anatomy.inference.engine import PagedKVCache, Seq2SeqEngine
from anatomy.inference.engine.kv_cache import KVCache, bytes_per_token
from anatomy.inference.engine.paged import PagedLayer
from anatomy.kv_format import Codes

from ..conftest import seq2seq_tiny

ATOL = 1e-4  # fp32


def test_cache_shape_and_bytes_store_only_kv_heads():
    """The pools hold the rows' blocks of 16 slots (3 kv heads, not 9) and one scratch block."""
    config = get_preset("smollm2-135m")  # 9 query heads share 3 kv heads
    cache = KVCache(config, batch=2, max_len=16)
    assert len(cache) == 30
    assert cache[0].pool.k.shape == (2 + 1, 16, 3, 64)  # [row blocks + scratch, bs, H_kv, d_h]
    assert bytes_per_token(config) == 2 * 30 * 3 * 64 * 4
    assert cache.nbytes == (2 * 16 + 16) * bytes_per_token(config)


def test_one_cache_family():
    """The static cache is the paged one: its layers are PagedLayers over a PagedKVCache's pools, one
    fixed block table per row, and a seq2seq run's target cache is such a cache."""
    config = get_preset("smollm2-135m", n_layers=2)
    cache = KVCache(config, batch=2, max_len=20)
    assert isinstance(cache.paged, PagedKVCache) and all(isinstance(layer, PagedLayer) for layer in cache)
    assert [layer.pool for layer in cache] == list(cache.paged)
    assert cache.paged.block_size == 10 and cache[0].at(torch.tensor([0])).tables.tolist() == [0, 1, 2, 3]
    run = Seq2SeqEngine(seq2seq_tiny()).start([5, 6, 7], rows=2, max_new_tokens=4)
    assert isinstance(run.cache.paged, PagedKVCache) and all(isinstance(layer, PagedLayer) for layer in run.cache)


def test_update_writes_at_input_pos_and_returns_all_slots():
    config = get_preset("smollm2-135m", n_layers=1)
    layer = KVCache(config, batch=1, max_len=8)[0]
    k = torch.randn(1, 3, 2, 64)
    k_all, v_all = (pages.gather() for pages in layer.update(torch.tensor([3, 4]), k, -k))
    assert k_all.shape == (1, 3, 8, 64)
    assert torch.equal(k_all[:, :, 3:5], k) and torch.equal(v_all[:, :, 3:5], -k)
    assert not k_all[:, :, :3].any() and not k_all[:, :, 5:].any()


def test_reorder_keeps_the_named_rows():
    """Each row's blocks (row b's: b * nb .. b * nb + nb - 1) become a copy of its parent row's."""
    config = get_preset("smollm2-135m", n_layers=1)
    cache = KVCache(config, batch=3, max_len=4)
    for row in range(3):
        cache[0].pool.k[row] = row  # max_len 4: one block per row
    cache.reorder(torch.tensor([2, 2, 0]))
    assert cache[0].pool.k[:3, 0, 0, 0].tolist() == [2.0, 2.0, 0.0]


@torch.no_grad()
def test_cached_decoding_equals_full_recomputation(decoder_tiny):
    """Prefill 5 tokens, then decode 10 one at a time: every step's logits match the last
    position of a full forward (no cache) over the same prefix (LLaMA and GPT-2 learned positions)."""
    model = decoder_tiny
    ids = torch.randint(0, 97, (2, 15))
    cache = KVCache(model.config, batch=2, max_len=20)
    logits = model(ids[:, :5], cache=cache, input_pos=torch.arange(5), last_only=True)
    torch.testing.assert_close(logits[:, -1], model(ids[:, :5])[:, -1], atol=ATOL, rtol=0)
    for t in range(5, 15):
        step = model(ids[:, t:t + 1], cache=cache, input_pos=torch.tensor([t]), last_only=True)
        torch.testing.assert_close(step[:, -1], model(ids[:, :t + 1])[:, -1], atol=ATOL, rtol=0)


@torch.no_grad()
def test_left_padded_rows_equal_each_row_alone(decoder_tiny):
    """Left padding + attention_mask over slots + position_ids: each row's cached logits equal
    that row run alone without padding or cache."""
    model = decoder_tiny
    lengths, P, T = [7, 4], 7, 12
    rows = [torch.randint(0, 97, (n,)) for n in lengths]
    ids = torch.zeros(2, P, dtype=torch.long)
    for r, row in enumerate(rows):
        ids[r, P - len(row):] = row
    pad = torch.tensor([P - n for n in lengths])
    mask = torch.arange(T)[None] >= pad[:, None]  # [B, T]
    cache = KVCache(model.config, batch=2, max_len=T)
    logits = model(ids, attention_mask=mask, position_ids=torch.arange(P)[None] - pad[:, None], cache=cache,
                   input_pos=torch.arange(P), last_only=True)[:, -1]
    nxt = torch.randint(0, 97, (2, 3))
    for step in range(4):
        for r, row in enumerate(rows):
            alone = model(torch.cat([row, nxt[r, :step]])[None])[0, -1]
            torch.testing.assert_close(logits[r], alone, atol=ATOL, rtol=0)
        if step == 3:
            break
        slot = P + step
        logits = model(nxt[:, step:step + 1], attention_mask=mask, position_ids=(slot - pad)[:, None],
                       cache=cache, input_pos=torch.tensor([slot]), last_only=True)[:, -1]


@torch.no_grad()
def test_seq2seq_cached_decoding_equals_full_recomputation():
    """Encoder-decoder: self-attention cache + cross-attention K/V computed once == full decode."""
    model = seq2seq_tiny()
    src, tgt = torch.randint(3, 97, (2, 6)), torch.randint(3, 97, (2, 8))
    memory = model.encode(src)
    memory_kv = model.memory_kv(memory)
    cache = KVCache(model.config, batch=2, max_len=8)
    for t in range(8):
        step = model.decode(tgt[:, t:t + 1], memory_kv=memory_kv, cache=cache, input_pos=torch.tensor([t]),
                            last_only=True)
        full = model.decode(tgt[:, :t + 1], memory)
        torch.testing.assert_close(step[:, -1], full[:, -1], atol=ATOL, rtol=0)


def test_the_old_layer_caches_warn_and_build_one_paged_layer(monkeypatch):
    """layer_cache.LayerKVCache and window_cache.WindowKVCache (gone) still build one layer for a release."""
    monkeypatch.delitem(sys.modules, "anatomy.inference.engine.window_cache", raising=False)
    with pytest.warns(AnatomyDeprecationWarning) as caught:
        from anatomy.inference.engine.window_cache import WindowKVCache
    assert [str(w.message).split(";")[0].split(":")[0] for w in caught] == [
        "the module anatomy.inference.engine.window_cache moved to anatomy.inference.engine.kv_cache",
        "WindowKVCache is deprecated"]
    with pytest.warns(AnatomyDeprecationWarning):
        from anatomy.inference.engine.layer_cache import LayerKVCache
    layers = [old(batch=2, n_kv_heads=3, max_len=6, head_dim=8, **window)
              for old, window in ((LayerKVCache, {}), (WindowKVCache, {"window": 2}))]
    k = torch.randn(2, 3, 1, 8)
    for layer in layers:
        assert isinstance(layer, PagedLayer) and layer.max_len == 6
        assert torch.equal(layer.update(torch.tensor([4]), k, k)[0].gather()[:, :, 4:5], k)


@pytest.mark.parametrize("kind, bound", [("int8", 0.01), ("fp8_e4m3", 0.03)])
@torch.no_grad()
def test_an_8bit_cache_called_directly_stays_close_to_the_float_cache(decoder_tiny, kind, bound):
    """Prefill 5 tokens and decode 7 through codes: each step's keys come back as Codes and the logits are
    within a few percent of a float cache's (the bounds of test_kv_quant.py)."""
    model = decoder_tiny
    ids = torch.randint(0, 97, (2, 12))
    logits = []
    for codes in (None, kind):
        cache = KVCache(model.config, batch=2, max_len=16, codes=codes)
        steps = [model(ids[:, :5], cache=cache, input_pos=torch.arange(5), last_only=True)[:, -1]]
        steps += [model(ids[:, t:t + 1], cache=cache, input_pos=torch.tensor([t]), last_only=True)[:, -1]
                  for t in range(5, 12)]
        logits.append(torch.stack(steps))
    _, _, H_kv, d_h = cache[0].pool.k.shape
    new = torch.zeros(2, H_kv, 1, d_h)
    assert isinstance(cache[0].update(torch.tensor([12]), new, new)[0], Codes)
    assert float((logits[1] - logits[0]).norm() / logits[0].norm()) < bound
