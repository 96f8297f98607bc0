"""A fresh prompt's pass (from position 0, nothing padded, nothing cached before) attends over its own new
keys with SDPA's is_causal and no mask, GQA in the kernel (enable_gqa), so a flash kernel can run, or with
the native causal kernel (the cpu backend, where the library runs): in generate's static cache, in a serving
step and in a flat batch's group, under both backends. Its logits
equal the model's full forward (fp32, 1e-4); a pass that reads earlier keys still gets a mask."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from anatomy.inference.engine import Chunk, DecoderEngine
from anatomy.inference.sampling import SamplingParams
from anatomy.kernels import attention as kernel_attention
from anatomy.kernels import native
from anatomy.kernels.cache import CACHE_ENV
from anatomy.layers import attention

from ..conftest import deepseek_tiny, gemma3_tiny, llama_tiny

PROMPT = [5, 9, 2, 7, 11, 3, 8, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52]  # 20 tokens: past a reader's 16 rows


@pytest.fixture
def sdpa_calls(monkeypatch, tmp_path):
    """Each SDPA call of attention.py: (query rows, a mask given, is_causal, enable_gqa); and each call of the
    native causal kernel, which the cpu backend's engines are made to choose for a fresh prompt where the
    library runs, as an SDPA call without a mask, causal, GQA in the kernel (what it computes)."""
    calls, sdpa, own_causal = [], F.scaled_dot_product_attention, native.causal

    def recording(q, k, v, attn_mask=None, is_causal=False, enable_gqa=False, **kwargs):
        calls.append((q.shape[2], attn_mask is not None, is_causal, enable_gqa))
        return sdpa(q, k, v, attn_mask=attn_mask, is_causal=is_causal, enable_gqa=enable_gqa, **kwargs)

    def causal(q, k, v, *, scale):
        calls.append((q.shape[2], False, True, True))
        return own_causal(q, k, v, scale=scale)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", recording)
    monkeypatch.setattr(native, "causal", causal)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))  # no decision kept by an earlier test
    monkeypatch.setattr(kernel_attention, "_causal_faster", lambda *shape: True)
    return calls


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@torch.inference_mode()
def test_generates_prefill_attends_without_a_mask(backend, sdpa_calls):
    model = llama_tiny()
    engine = DecoderEngine(model, backend=backend)
    run = engine.start([PROMPT], SamplingParams(max_new_tokens=17))
    sdpa_calls.clear()  # (building the engine measures attention)
    logits = run.prefill()
    assert sdpa_calls and all(c == (len(PROMPT), False, True, True) for c in sdpa_calls), sdpa_calls
    torch.testing.assert_close(logits[0], model(torch.tensor([PROMPT]))[0, -1], atol=1e-4, rtol=0)
    sdpa_calls.clear()
    run.verify(torch.tensor([list(range(3, 20))]))  # 17 tokens after the prompt (past the native reader's
    assert sdpa_calls and all(mask and not causal for _, mask, causal, _ in sdpa_calls), sdpa_calls  # rows): a mask


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@torch.inference_mode()
def test_a_serving_steps_fresh_prompts_attend_without_a_mask(backend, sdpa_calls):
    """Two fresh prompts of one length ([2, 20] rows), then a step of their next chunks: the first step
    has no mask, the second reads the cache through one."""
    model = llama_tiny()
    engine = DecoderEngine(model, backend=backend)
    cache = engine.paged_cache(num_blocks=20, block_size=4)
    other = [p + 1 for p in PROMPT]
    sdpa_calls.clear()  # (building the engine measures attention)
    logits = engine.step(cache, [Chunk(PROMPT, 0, list(range(8))), Chunk(other, 0, list(range(8, 16)))])
    assert sdpa_calls and all(not mask and causal for _, mask, causal, _ in sdpa_calls), sdpa_calls
    full = model(torch.tensor([PROMPT, other]))[:, -1]
    torch.testing.assert_close(logits, full, atol=1e-4, rtol=0)
    sdpa_calls.clear()
    more = [60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76]  # 17 rows: past the reader
    logits = engine.step(cache, [Chunk(more, 20, list(range(10))), Chunk(more, 20, list(range(8, 16)) + [16, 17])])
    assert sdpa_calls and all(mask and not causal for _, mask, causal, _ in sdpa_calls), sdpa_calls
    torch.testing.assert_close(logits[0], model(torch.tensor([PROMPT + more]))[0, -1], atol=1e-4, rtol=0)


@pytest.mark.parametrize("make", [llama_tiny, gemma3_tiny, deepseek_tiny], ids=["llama", "gemma3", "deepseek"])
@torch.inference_mode()
def test_a_fresh_group_of_a_flat_batch_attends_without_a_mask(make, sdpa_calls):
    """A flat batch of a fresh 20-token prompt and another sequence's 3-token chunk: the fresh group is
    causal over its own keys (with Gemma 3's window, that window's mask), the other reads the cache;
    both give their full forward's logits."""
    model = make()
    engine = DecoderEngine(model)
    cache = engine.paged_cache(num_blocks=20, block_size=4)
    earlier = [30, 31, 32, 33, 34]
    engine.step(cache, [Chunk(earlier, 0, [10, 11])])
    sdpa_calls.clear()
    logits = engine.step(cache, [Chunk(PROMPT, 0, list(range(5)), logits=20), Chunk([35, 36, 37], 5, [10, 11])])
    fresh = [c for c in sdpa_calls if c[0] in (len(PROMPT), len(PROMPT) * 2)]  # (latent: heads folded)
    assert any(causal and not mask for _, mask, causal, _ in fresh), sdpa_calls
    expected = torch.cat([model(torch.tensor([PROMPT]))[0], model(torch.tensor([earlier + [35, 36, 37]]))[0, -1:]])
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)
