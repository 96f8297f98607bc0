"""The static KV cache: decoding with it gives the logits of a full forward over the same prefix."""

from __future__ import annotations

import torch

from anatomy import get_preset
from anatomy.inference.engine.kv_cache import KVCache, bytes_per_token

from ..conftest import seq2seq_tiny

ATOL = 1e-4  # fp32


def test_cache_shape_and_bytes_store_only_kv_heads():
    config = get_preset("smollm2-135m")  # 9 query heads share 3 kv heads
    cache = KVCache(config, batch=2, max_len=16)
    assert len(cache) == 30
    assert cache[0].k.shape == (2, 3, 16, 64)
    assert bytes_per_token(config) == 2 * 30 * 3 * 64 * 4
    assert cache.nbytes == 2 * 16 * bytes_per_token(config)


def test_update_writes_at_input_pos_and_returns_all_slots():
    config = get_preset("smollm2-135m", n_layers=1)
    layer = KVCache(config, batch=1, max_len=8)[0]
    k = torch.randn(1, 3, 2, 64)
    k_all, v_all = layer.update(torch.tensor([3, 4]), k, -k)
    assert k_all.shape == (1, 3, 8, 64)
    assert torch.equal(k_all[:, :, 3:5], k) and torch.equal(v_all[:, :, 3:5], -k)
    assert not k_all[:, :, :3].any() and not k_all[:, :, 5:].any()


def test_reorder_keeps_the_named_rows():
    config = get_preset("smollm2-135m", n_layers=1)
    cache = KVCache(config, batch=3, max_len=4)
    for row in range(3):
        cache[0].k[row] = row
    cache.reorder(torch.tensor([2, 2, 0]))
    assert cache[0].k[:, 0, 0, 0].tolist() == [2.0, 2.0, 0.0]


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
