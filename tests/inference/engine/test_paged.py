"""The paged KV cache: writes land in the right block slots, gathers give each row its own keys at
their positions, and a step through it gives the model's own logits."""

from __future__ import annotations

import copy
import gc
import weakref

import torch

from anatomy.inference.engine import Chunk, DecoderEngine, PagedKVCache
from anatomy.inference.engine.paged import paged_inputs
from anatomy.inference.sampling import SamplingParams


def test_update_writes_through_the_table_and_gathers_each_row(decoder_tiny):
    config = decoder_tiny.config
    cache = PagedKVCache(config, num_blocks=10, block_size=4, dtype=torch.float32)
    H_kv, d_h = config.n_kv_heads, config.head_dim
    chunks = [Chunk([5] * 6, 0, [7, 2]), Chunk([6] * 3, 0, [4])]  # rows of 6 and 3 tokens, blocks out of order
    inputs = paged_inputs(decoder_tiny.stack, cache, chunks)
    k = torch.randn(2, H_kv, 6, d_h)
    v = torch.randn(2, H_kv, 6, d_h)
    k_pages, v_pages = cache.layers(inputs.where)[0].update(None, k, v)
    assert k_pages.pool is cache[0].k and k_pages.tables.tolist() == [[7, 2], [4, 10]], "block 10 is scratch"
    k_all, v_all = k_pages.gather(), v_pages.gather()
    assert k_all.shape == (2, H_kv, 8, d_h)  # two blocks of 4 key slots per row
    assert torch.equal(k_all[0, :, :6], k[0]) and torch.equal(v_all[1, :, :3], v[1, :, :3])
    assert torch.equal(cache[0].k[7], k[0, :, :4].transpose(0, 1)), "positions 0..3 of row 0 are in block 7"
    assert torch.equal(cache[0].k[2, :2], k[0, :, 4:6].transpose(0, 1)), "positions 4, 5 in block 2"
    assert torch.equal(cache[0].k[4, :3], k[1, :, :3].transpose(0, 1))
    assert torch.isfinite(k_all).all(), "padding and missing blocks read the (finite) scratch block"
    mask = inputs.ctx.mask  # [B, 1, S, T]
    assert mask.shape == (2, 1, 6, 8)
    assert (mask[0, 0] == 0).int().tolist()[5] == [1] * 6 + [0] * 2, "row 0's last token sees positions 0..5"
    assert (mask[1, 0, 2] == 0).int().tolist() == [1, 1, 1, 0, 0, 0, 0, 0]
    assert [r.tolist() for r in inputs.wanted] == [[0, 1], [5, 2]]  # each chunk's last token


@torch.inference_mode()
def test_a_paged_step_gives_the_models_logits(decoder_tiny):
    """Two rows, in two steps each (a prefill chunk, then the rest), blocks scattered: the logits of
    each row's last token equal the full forward's (fp32, 1e-4)."""
    engine = DecoderEngine(decoder_tiny)
    cache = engine.paged_cache(num_blocks=12, block_size=4)
    prompts = [list(range(10, 31)), list(range(40, 47))]  # 21 and 7 tokens
    tables = [[11, 3, 8, 0, 5, 9], [6, 1]]
    splits = (13, 5)
    for step in range(2):
        chunks = [Chunk(p[:k], 0, t) if step == 0 else Chunk(p[k:], k, t) for p, t, k in zip(prompts, tables, splits)]
        logits = engine.step(cache, chunks)  # [2, V]
    for row, prompt in enumerate(prompts):
        full = decoder_tiny(torch.tensor([prompt]))[0, -1]
        assert torch.allclose(logits[row], full, atol=1e-4), (row, (logits[row] - full).abs().max())


def _decode_steps(engine: DecoderEngine, steps: int) -> list[torch.Tensor]:
    """Three sequences prefilled, then decoded greedily `steps` times through paged decode steps."""
    cache = engine.paged_cache(num_blocks=40, block_size=4)
    prompts = [list(range(10, 19)), list(range(40, 43)), list(range(60, 65))]
    tables = [list(range(0, 12)), list(range(12, 24)), list(range(24, 36))]
    logits = engine.step(cache, [Chunk(p, 0, t) for p, t in zip(prompts, tables)])
    seen = [logits]
    for _ in range(steps):
        tokens = logits.argmax(dim=-1).tolist()
        for p, t in zip(prompts, tokens):
            p.append(t)
        logits = engine.step(cache, [Chunk(p[-1:], len(p) - 1, t) for p, t in zip(prompts, tables)])
        seen.append(logits)
    return seen


def test_captured_paged_decode_gives_the_eager_logits_bit_for_bit(decoder_tiny, monkeypatch):
    """Past PAGED_RECORD_AFTER steps of one shape the decode step replays a captured graph (three
    rows padded to a batch of four, the blocks read rounded up): the same logits as the eager step
    of the same padded shape."""
    from anatomy.inference.engine import engine as engine_module

    captured = DecoderEngine(decoder_tiny)
    eager = copy.copy(captured)  # the same view and kernel plan (the engine's own test may copy it)
    steps = engine_module.PAGED_RECORD_AFTER + 6
    got = _decode_steps(captured, steps)
    assert captured.captured_graphs == 1
    eager._bodies, eager._seen_shapes = {}, {}
    monkeypatch.setattr(engine_module, "PAGED_RECORD_AFTER", 10 ** 9)  # the same padded shapes, never recorded
    want = _decode_steps(eager, steps)
    assert eager.captured_graphs == 0
    for step, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), f"step {step} differs by {(a - b).abs().max():.3g}"


@torch.inference_mode()
def test_decode_steps_captured_before_serving_replay_from_the_first_step(decoder_tiny):
    """capture_decode records batches 1..5 as buckets 1, 2, 4, 8 writing the scratch block only; the first
    decode step of a batch of three then replays bucket 4 and gives the full forward's logits (fp32, 1e-4)."""
    engine = DecoderEngine(decoder_tiny)
    cache = engine.paged_cache(num_blocks=40, block_size=4)
    assert engine.capture_decode(cache, range(1, 6)) == 4
    assert not any(pool.k[:cache.scratch].any() or pool.v[:cache.scratch].any() for pool in cache)
    prompts = [list(range(10, 19)), list(range(40, 43)), list(range(60, 65))]
    tables = [list(range(0, 12)), list(range(12, 24)), list(range(24, 36))]
    first = engine.step(cache, [Chunk(p, 0, t) for p, t in zip(prompts, tables)]).argmax(dim=-1).tolist()
    seen = dict(engine._seen_shapes)
    logits = engine.step(cache, [Chunk([n], len(p), t) for p, n, t in zip(prompts, first, tables)])
    assert engine._seen_shapes == seen, "no eager decode step ran"
    for row, (prompt, token) in enumerate(zip(prompts, first)):
        full = decoder_tiny(torch.tensor([prompt + [token]]))[0, -1]
        torch.testing.assert_close(logits[row], full, rtol=1e-4, atol=1e-4)


@torch.inference_mode()
def test_a_dropped_engine_leaves_none_of_its_tensors_to_its_captured_steps(decoder_tiny):
    """TorchScript keeps a traced function, and so any tensor its graph holds, for the process's life: the
    captured step is traced with the weights and pools it reads as inputs, then bound to them in a
    compilation unit of its own, so dropping the engine frees them (the model's own tensors aside, which
    the caller holds)."""
    engine = DecoderEngine(decoder_tiny)
    cache = engine.paged_cache(num_blocks=8, block_size=4)
    assert engine.capture_decode(cache, [1, 2]) == 2
    owned = {id(t) for t in (*decoder_tiny.parameters(), *decoder_tiny.buffers())}
    mine = [t for body in engine._bodies.values() for t in body.held if id(t) not in owned and t.numel()]
    assert any(t is pool.k for pool in cache for t in mine), "the graphs read the pools"
    bound = {n.t("value").data_ptr() for body in engine._bodies.values() for n in body.traced.graph.nodes()
             if n.kind() == "prim::Constant" and n.output().type().kind() == "TensorType"}
    assert all(pool.k.data_ptr() in bound and pool.v.data_ptr() in bound for pool in cache), \
        "the pools are the graphs' constants: a replay passes only the step's own inputs"
    refs = [weakref.ref(t) for t in mine]
    del engine, cache, mine
    gc.collect()
    assert refs and not [r for r in refs if r() is not None]


def test_paged_decode_equals_the_static_engines_steps(decoder_tiny):
    """The served step and the engine's own static decode give the same greedy tokens (fp32)."""
    engine = DecoderEngine(decoder_tiny)
    paged = [row.argmax(dim=-1).tolist() for row in _decode_steps(engine, 20)]
    prompts = [list(range(10, 19)), list(range(40, 43)), list(range(60, 65))]
    for i, prompt in enumerate(prompts):
        alone = [int(t) for t in engine.tokens([prompt], SamplingParams(max_new_tokens=21))]
        assert [step[i] for step in paged] == alone
