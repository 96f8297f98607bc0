"""The 2026 families through every path of the engine: Gemma 3 (windows with their own RoPE base, held
as rings of blocks by a run's cache), SmolLM3 (NoPE layers), gpt-oss (sinks, experts with biases) and
DeepSeek-V3 (latent attention, its latent cached: static and paged). A served
(paged) step gives the model's own logits; paged decoding, a run (rings, captured steps)
and speculative decoding give the same greedy tokens (fp32)."""

from __future__ import annotations

import torch

from anatomy.inference.engine import Chunk, DecoderEngine
from anatomy.inference.sampling import SamplingParams
from anatomy.inference.speculative import NgramProposer, SpeculativeDecoder

from .test_paged import _decode_steps

PROMPTS = [list(range(10, 19)), list(range(40, 43)), list(range(60, 65))]


@torch.inference_mode()
def test_a_paged_step_gives_the_models_logits(family_tiny):
    engine = DecoderEngine(family_tiny)
    cache = engine.paged_cache(num_blocks=12, block_size=4)
    prompts, tables = [list(range(10, 31)), list(range(40, 47))], [[11, 3, 8, 0, 5, 9], [6, 1]]
    for step in range(2):
        chunks = [Chunk(p[:k], 0, t) if step == 0 else Chunk(p[k:], k, t) for p, t, k in zip(prompts, tables, (13, 5))]
        logits = engine.step(cache, chunks)  # [2, V]
    for row, prompt in enumerate(prompts):
        torch.testing.assert_close(logits[row], family_tiny(torch.tensor([prompt]))[0, -1], rtol=1e-4, atol=1e-4)


def test_paged_static_and_speculative_decoding_agree(family_tiny):
    engine = DecoderEngine(family_tiny)
    paged = [row.argmax(dim=-1).tolist() for row in _decode_steps(engine, 30)]
    for i, prompt in enumerate(PROMPTS):
        alone = [int(t) for t in engine.tokens([prompt], SamplingParams(max_new_tokens=31))]
        assert [step[i] for step in paged] == alone
    speculative = SpeculativeDecoder(engine, NgramProposer(), k=4, adaptive=False)
    both = torch.stack(list(speculative.tokens(PROMPTS, SamplingParams(max_new_tokens=31))), dim=1).tolist()
    assert both == torch.stack(list(engine.tokens(PROMPTS, SamplingParams(max_new_tokens=31))), dim=1).tolist()
    if family_tiny.config.sliding_window is None:  # rings only where a layer has a window (test_window_cache.py)
        assert all(c.window_blocks is None for caches in engine._caches.values() for c in caches)


@torch.inference_mode()
def test_a_windowed_paged_cache_reads_given_back_blocks_as_masked():
    """The sliding-window layers' own group of blocks (window_blocks): with every block wholly before the
    window given back (-1 in the window table), a step still gives the model's logits."""
    from ..conftest import gemma3_tiny

    model = gemma3_tiny()  # window 4 on layers 0 and 1
    engine = DecoderEngine(model)
    cache = engine.paged_cache(num_blocks=12, block_size=4, window_blocks=5)
    assert cache.windowed == (True, True, False)
    assert cache[0].k.shape[0] == 6 and cache[2].k.shape[0] == 13
    prompt = list(range(10, 31))  # 21 tokens: blocks 0..5
    full, window = [11, 3, 8, 0, 5, 9], [4, 1, 0, 2]
    engine.step(cache, [Chunk(prompt[:13], 0, full, logits=0, window_blocks=window)])
    # the next query (position 13) reads keys 10..13: blocks 0 and 1 are given back, 2 and 3 hold the window
    logits = engine.step(cache, [Chunk(prompt[13:], 13, full, window_blocks=[-1, -1, 0, 2, 3, 1])])
    torch.testing.assert_close(logits[0], model(torch.tensor([prompt]))[0, -1], rtol=1e-4, atol=1e-4)
