"""The paged KV cache: writes land in the right block slots, gathers give each row its own keys at
their positions, and a step through it gives the model's own logits."""

from __future__ import annotations

import torch

from anatomy.inference.engine import DecoderEngine
from anatomy.serving.paged import Chunk, PagedKVCache, StepBuilder


def test_update_writes_through_the_table_and_gathers_each_row(tiny):
    config = tiny.config
    cache = PagedKVCache(config, num_blocks=10, block_size=4, dtype=torch.float32)
    builder = StepBuilder(tiny.stack, cache, context=40, dtype=torch.float32)
    H_kv, d_h = config.n_kv_heads, config.head_dim
    chunks = [Chunk([5] * 6, 0, [7, 2]), Chunk([6] * 3, 0, [4])]  # rows of 6 and 3 tokens, blocks out of order
    inputs = builder.build(chunks)
    k = torch.randn(2, H_kv, 6, d_h)
    v = torch.randn(2, H_kv, 6, d_h)
    k_all, v_all = inputs.caches[0].update(None, k, v)
    assert k_all.shape == (2, H_kv, 8, d_h)  # two blocks of 4 key slots per row
    assert torch.equal(k_all[0, :, :6], k[0]) and torch.equal(v_all[1, :, :3], v[1, :, :3])
    assert torch.equal(cache.k[0][7], k[0, :, :4].transpose(0, 1)), "positions 0..3 of row 0 are in block 7"
    assert torch.equal(cache.k[0][2, :2], k[0, :, 4:6].transpose(0, 1)), "positions 4, 5 in block 2"
    assert torch.equal(cache.k[0][4, :3], k[1, :, :3].transpose(0, 1))
    assert torch.isfinite(k_all).all(), "padding and missing blocks read the (finite) scratch block"
    mask = inputs.ctx.mask  # [B, 1, S, T]
    assert mask.shape == (2, 1, 6, 8)
    assert (mask[0, 0] == 0).int().tolist()[5] == [1] * 6 + [0] * 2, "row 0's last token sees positions 0..5"
    assert (mask[1, 0, 2] == 0).int().tolist() == [1, 1, 1, 0, 0, 0, 0, 0]
    assert inputs.last.tolist() == [5, 2]


@torch.inference_mode()
def test_a_paged_step_gives_the_models_logits(tiny):
    """Two rows, in two steps each (a prefill chunk, then the rest), blocks scattered: the logits of
    each row's last token equal the full forward's (fp32, 1e-4)."""
    engine = DecoderEngine(tiny)
    model = engine.model
    cache = PagedKVCache(model.config, num_blocks=12, block_size=4, dtype=torch.float32)
    builder = StepBuilder(model.stack, cache, context=48, dtype=torch.float32)
    prompts = [list(range(10, 31)), list(range(40, 47))]  # 21 and 7 tokens
    tables = [[11, 3, 8, 0, 5, 9], [6, 1]]
    splits = (13, 5)
    for step in range(2):
        chunks = [Chunk(p[:k], 0, t) if step == 0 else Chunk(p[k:], k, t) for p, t, k in zip(prompts, tables, splits)]
        inputs = builder.build(chunks)
        hidden = model.stack.run(inputs.ids, inputs.ctx, position_ids=inputs.positions, cache=inputs.caches)
    logits = model.lm_head(hidden[torch.arange(2), inputs.last])  # [2, V]
    for row, prompt in enumerate(prompts):
        full = tiny(torch.tensor([prompt]))[0, -1]
        assert torch.allclose(logits[row], full, atol=1e-4), (row, (logits[row] - full).abs().max())
