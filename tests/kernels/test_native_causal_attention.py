"""anatomy::causal_attention, a prompt's causal attention over its own keys, against float64 math: GQA, head
dims on and off the AVX-512 path, prompts shorter and longer than a tile and a key block, keys before the
prompt (T > S), q a strided view of a fused projection, on every vector path this CPU has; bad input is
refused; the engine runs it for a fresh prompt only where it measured faster than SDPA, and its logits
are SDPA's."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import anatomy.kernels.attention as attention
from anatomy.inference.engine import DecoderEngine
from anatomy.inference.sampling import SamplingParams
from anatomy.kernels import native
from anatomy.kernels.cache import CACHE_ENV
from anatomy.layers.attention import Attention

from ..inference.conftest import llama_tiny

needs_library = pytest.mark.skipif(not native.loaded(), reason="the native library is built by make")
ISAS = native.vector_paths()  # the portable loops and this CPU's vector paths


def float64_attention(q, k, v, scale):
    """softmax(q k^T * scale) v in float64, row s seeing keys t <= s + T - S, k and v repeated per query head."""
    rep = q.shape[1] // k.shape[1]
    q, k, v = q.double(), k.double().repeat_interleave(rep, 1), v.double().repeat_interleave(rep, 1)
    S, T = q.shape[2], k.shape[2]
    seen = torch.ones(S, T, dtype=torch.bool).tril(T - S)
    return ((q @ k.transpose(-1, -2)) * scale).masked_fill(~seen, float("-inf")).softmax(-1) @ v


@needs_library
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("B, H, H_kv, S, T, d", [
    (1, 9, 3, 300, 300, 64),  # SmolLM2's heads: tiles of 6 rows, blocks of 64 keys and ragged ends
    (2, 4, 2, 67, 67, 128),   # two batch rows, a head dim of two passes of 64
    (1, 2, 1, 5, 5, 80),      # fewer rows than a tile; 80 = 64 + 16
    (1, 3, 3, 130, 200, 64),  # 70 keys before the prompt
    (1, 8, 2, 1, 1, 64),      # one row
    (1, 2, 2, 33, 33, 36),    # a head dim off the vector path (portable loops)
])
def test_causal_attention_is_float64_math(isa, B, H, H_kv, S, T, d):
    """float32 to 1e-5 of the largest output, q a [B, S, heads, d] projection's transposed view."""
    torch.manual_seed(0)
    fused = torch.randn(B, S, H + 2, d)
    q = fused[:, :, :H].transpose(1, 2)  # [B, H, S, d], rows strided as a layer's view
    k, v = torch.randn(B, H_kv, T, d), torch.randn(B, H_kv, T, d)
    with native.limited(isa):
        got = native.causal(q, k, v, scale=d ** -0.5)
    want = float64_attention(q, k, v, d ** -0.5)
    assert got.shape == (B, H, S, d) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


@needs_library
@pytest.mark.parametrize("q, k, rule", [
    (torch.randn(1, 2, 4, 16, dtype=torch.float64), torch.randn(1, 2, 4, 16), "float32"),
    (torch.randn(1, 2, 5, 16), torch.randn(1, 2, 4, 16), "T >= S"),
    (torch.randn(1, 3, 4, 16), torch.randn(1, 2, 4, 16), "multiple of H_kv"),
    (torch.randn(1, 2, 4, 512), torch.randn(1, 2, 4, 512), "head dim 512 > 256"),
])
def test_bad_shapes_and_dtypes_are_refused(q, k, rule):
    with pytest.raises(RuntimeError, match=rule):
        native.causal(q, k.to(q.dtype) if rule != "float32" else k, k.clone(), scale=0.25)


@needs_library
@pytest.mark.parametrize("faster", [True, False])
def test_the_engine_attends_prompts_natively_only_where_it_measured_faster(monkeypatch, tmp_path, faster):
    """The kernel is set on the view's causal layers where it measured faster (float32 branches; never on the
    caller's model) and runs once per layer for a fresh prompt; the prompt's logits are those of SDPA's causal
    kernel, 1e-4."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))  # no decision kept by an earlier test
    monkeypatch.setattr(attention, "_causal_faster", lambda *shape: faster)
    torch.manual_seed(0)
    model = llama_tiny()
    engine = DecoderEngine(model)
    chosen = faster and engine.branch_dtype == torch.float32
    kernels = {m.causal_kernel for m in engine.model.modules() if isinstance(m, Attention)}
    assert kernels == ({native.causal} if chosen else {None})
    assert all(m.causal_kernel is None for m in model.modules() if isinstance(m, Attention))
    calls = []
    for m in engine.model.modules():
        if isinstance(m, Attention) and m.causal_kernel is not None:
            m.causal_kernel = lambda *a, **kw: calls.append(1) or native.causal(*a, **kw)
    sdpa = DecoderEngine(model)
    sdpa._attend_prompts(None)
    prompt = [(7 * i) % 90 + 3 for i in range(60)]  # 10 tiles of 6 rows
    got = engine.start([prompt], SamplingParams(max_new_tokens=1)).prefill()
    want = sdpa.start([prompt], SamplingParams(max_new_tokens=1)).prefill()
    assert len(calls) == (model.config.n_layers if chosen else 0)
    tolerance = 1e-4 if engine.branch_dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance)


def test_without_the_library_no_prompt_kernel_is_chosen(monkeypatch):
    monkeypatch.setattr(native, "loaded", lambda: False)
    assert attention.prompt_attention(llama_tiny().config, torch.float32) is None


@needs_library
def test_a_head_dim_past_the_kernels_keeps_sdpa(monkeypatch):
    """No race is run (the kernel would refuse the shape): SDPA stays."""
    monkeypatch.setattr(attention, "_causal_faster", lambda *shape: pytest.fail("measured a shape it refuses"))
    config = dataclasses.replace(llama_tiny().config, head_dim=native.CAUSAL_MAX_DIM + 64)
    assert attention.prompt_attention(config, torch.float32, cache=False) is None
