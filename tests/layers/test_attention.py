"""Attention: against a hand-written softmax(q k^T / sqrt(d_h)) v with repeated kv heads; the sdpa
and eager backends agree (MHA, GQA, MQA, masks, ALiBi); the causal mask blocks the future; an
encoder sees both sides."""

from __future__ import annotations

import math

import pytest
import torch

from anatomy import ModelConfig, build_model
from anatomy.errors import InputError
from anatomy.layers import Attention, attend
from anatomy.layers.attention import BACKENDS


def config(**changes) -> ModelConfig:
    base = dict(vocab_size=50, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=32, qkv_bias=True)
    return ModelConfig(**{**base, **changes})


def reference(q, k, v, *, mask=None, bias=None, causal=False):
    """The textbook formula, with each kv head copied for its group of query heads."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + bias
    if causal:
        S, S_k = scores.shape[-2:]
        scores = scores.masked_fill(~torch.ones(S, S_k, dtype=torch.bool).tril(S_k - S), float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1) @ v


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n_kv", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("kind", ["plain", "causal", "padding", "alibi"])
def test_attend_matches_the_formula(backend, n_kv, kind):
    B, H, S, d = 2, 4, 6, 8
    q, k, v = torch.randn(B, H, S, d), torch.randn(B, n_kv, S, d), torch.randn(B, n_kv, S, d)
    mask = bias = None
    if kind == "padding":
        mask = torch.ones(B, 1, 1, S, dtype=torch.bool)
        mask[1, ..., 4:] = False
    if kind == "alibi":
        bias = torch.randn(1, H, S, S)
    out, _ = attend(q, k, v, mask=mask, bias=bias, is_causal=kind in ("causal", "alibi"), backend=backend)
    expected = reference(q, k, v, mask=mask, bias=bias, causal=kind in ("causal", "alibi"))
    assert (out - expected).abs().max() <= 1e-5


def test_eager_weights_are_probabilities_and_causal():
    q, k, v = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    _, weights = attend(q, k, v, is_causal=True, backend="eager", return_weights=True)
    assert weights.shape == (1, 4, 5, 5)
    assert torch.allclose(weights.sum(-1), torch.ones(1, 4, 5))
    assert weights.triu(1).abs().max() == 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n_kv", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
def test_causal_weights_asked_of_any_backend_are_causal(backend, n_kv):
    """return_weights takes the eager path whatever the backend: the causal mask must come along
    (with sdpa and MHA it once did not, and the weights and output attended to the future)."""
    q, k, v = torch.randn(1, 4, 5, 8), torch.randn(1, n_kv, 5, 8), torch.randn(1, n_kv, 5, 8)
    out, weights = attend(q, k, v, is_causal=True, backend=backend, return_weights=True)
    assert weights.triu(1).abs().max() == 0
    assert (out - reference(q, k, v, causal=True)).abs().max() <= 1e-5


def test_unknown_backend():
    q = torch.randn(1, 1, 2, 4)
    with pytest.raises(InputError, match=r"attention backend='flash' is not one of 'sdpa', 'eager'"):
        attend(q, q, q, backend="flash")
    with pytest.raises(InputError, match="attention backend='flash'"):
        build_model(config(), attention="flash")


def test_attention_module_against_the_formula():
    """The module: fused qkv rows [q | k | v], GQA heads, output projection."""
    c = config(n_kv_heads=2)
    attn = Attention(c, causal=True).eval()
    x = torch.randn(2, 7, 32)
    W, b = attn.qkv.weight, attn.qkv.bias
    q, k, v = (x @ W.T + b).split([32, 16, 16], dim=-1)
    heads = lambda t: t.view(2, 7, -1, 8).transpose(1, 2)  # noqa: E731
    expected = reference(heads(q), heads(k), heads(v), causal=True).transpose(1, 2).reshape(2, 7, 32)
    expected = attn.out(expected)
    with torch.no_grad():
        assert (attn(x) - expected).abs().max() <= 1e-5
        out, weights = attn(x, return_weights=True)
    assert (out - expected).abs().max() <= 1e-5 and weights.shape == (2, 4, 7, 7)


def test_cross_attention_honours_the_memory_mask():
    c = config()
    attn = Attention(c, cross=True).eval()
    x, memory = torch.randn(1, 3, 32), torch.randn(1, 5, 32)
    mask = torch.tensor([True, True, True, False, False])[None, None, None]
    with torch.no_grad():
        base = attn(x, memory_kv=attn.project_memory(memory), mask=mask)
        changed = memory.clone()
        changed[:, 3:] = torch.randn(1, 2, 32)
        assert torch.allclose(attn(x, memory_kv=attn.project_memory(changed), mask=mask), base, atol=1e-6)
        assert not torch.allclose(attn(x, memory_kv=attn.project_memory(changed)), base, atol=1e-3)


@pytest.mark.parametrize("changes", [
    dict(n_kv_heads=2, position="rope", norm="rmsnorm", ffn="glu", activation="silu"),
    dict(position="alibi"),
    dict(position="alibi", n_kv_heads=1),
    dict(architecture="encoder", type_vocab_size=2, norm_position="post", position="learned"),
    dict(architecture="encoder-decoder", n_decoder_layers=2, position="sinusoidal", norm_position="post"),
], ids=["llama-gqa", "alibi", "alibi-mqa", "encoder", "seq2seq"])
def test_sdpa_and_eager_models_agree(changes):
    model = build_model(config(**changes)).eval()
    state = model.state_dict()
    ids = torch.randint(0, 50, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, :3] = 0
    args = (ids, ids[:, :5]) if model.config.is_seq2seq else (ids,)
    kwargs = {"src_mask": mask.flip(1)} if model.config.is_seq2seq else {"attention_mask": mask}
    outputs = []
    for backend in BACKENDS:
        model = build_model(model.config, attention=backend).eval().requires_grad_(False)
        model.load_state_dict(state)
        with torch.no_grad():
            outputs.append((model(*args), model(*args, **kwargs)))
    for a, b in zip(*outputs):
        assert (a - b).abs().max() <= 1e-5


@pytest.mark.parametrize("position", ["rope", "learned", "alibi"])
def test_causal_mask_blocks_the_future(position):
    model = build_model(config(position=position, n_kv_heads=2)).eval()
    ids = torch.randint(0, 50, (1, 10))
    j = 6
    changed = ids.clone()
    changed[0, j] = (ids[0, j] + 1) % 50
    with torch.no_grad():
        a, b = model(ids), model(changed)
    assert torch.equal(a[:, :j], b[:, :j])
    assert (a[:, j:] - b[:, j:]).abs().amax(-1).min() > 1e-4  # position j and every later one see it


def test_encoder_depends_on_both_sides():
    model = build_model(config(architecture="encoder", norm_position="post", type_vocab_size=2)).eval()
    ids = torch.randint(0, 50, (1, 8))
    for j, other in ((0, 7), (7, 0)):
        changed = ids.clone()
        changed[0, j] = (ids[0, j] + 1) % 50
        with torch.no_grad():
            assert (model(ids)[0, other] - model(changed)[0, other]).abs().max() > 1e-4
