"""Attention maps: the weights each model returns equal a hand computation of
softmax(Q K^T / sqrt(d_h) + mask) for that layer, made here from the layer's own parameters and
the block's input, independently of layers/attention.py (RoPE, GQA and the norms written out
again in float64); and the maps API: selection, truncation, bad input."""

from __future__ import annotations

import math

import pytest
import torch

import anatomy
from anatomy import build_model, get_preset
from anatomy.analysis.attention_maps import attention, attention_weights
from anatomy.errors import InputError

TEXT = "The quick brown fox jumps over the lazy dog because it was bored."
SMALL_S2S = dict(vocab_size=64, d_model=32, n_layers=2, n_decoder_layers=2, n_heads=4, d_ff=48, max_seq_len=32,
                 dropout=0.0, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)


@pytest.fixture(scope="module")
def minilm():
    model = anatomy.load("all-minilm-l6-v2")
    return model, anatomy.load_tokenizer("all-minilm-l6-v2")


@pytest.fixture(scope="module")
def seq2seq():
    torch.manual_seed(0)
    return build_model(get_preset("transformer-base", **SMALL_S2S)).eval()


def _capture_input(module: torch.nn.Module):
    """The first positional input of `module`'s next call."""
    seen: list[torch.Tensor] = []
    handle = module.register_forward_pre_hook(lambda _, args: seen.append(args[0].detach()))
    return seen, handle


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """x [heads, S, d_h] rotated by position, the pair (i, i + d_h/2) as one complex number."""
    heads, S, d_h = x.shape
    freqs = torch.tensor([theta ** (-2 * i / d_h) for i in range(d_h // 2)], dtype=torch.float64)
    angles = torch.arange(S, dtype=torch.float64)[:, None] * freqs  # [S, d_h/2]
    pairs = torch.complex(x[..., :d_h // 2], x[..., d_h // 2:]) * torch.polar(torch.ones_like(angles), angles)
    return torch.cat([pairs.real, pairs.imag], dim=-1)


def _softmax_scores(q: torch.Tensor, k: torch.Tensor, *, causal: bool) -> torch.Tensor:
    """q [H, S_q, d_h], k [H, S_k, d_h] (one k head per q head) -> weights [H, S_q, S_k]."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        S_q, S_k = scores.shape[-2:]
        future = torch.ones(S_q, S_k, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1)


def _heads(x: torch.Tensor, n: int) -> torch.Tensor:
    S, width = x.shape
    return x.view(S, n, width // n).transpose(0, 1)  # [n, S, d_h]


@pytest.mark.slow
@pytest.mark.parametrize("layer", [0, 17, 29])
def test_decoder_weights_equal_a_hand_computation(smollm2, smollm2_tokenizer, layer):
    """SmolLM2 (RMSNorm, RoPE theta 1e5, GQA 9/3): the layer's normed input times its own Q and K."""
    c = smollm2.config
    ids = torch.tensor([smollm2_tokenizer.encode(TEXT)])
    block = smollm2.stack.blocks[layer]
    seen, handle = _capture_input(block)
    try:
        weights = attention_weights(smollm2, ids)["self"]  # [L, B, H, S, S]
    finally:
        handle.remove()
    x = seen[0][0].double()  # [S, D]: the block's input
    h = _rms(x, block.attn_norm.weight.double(), c.norm_eps)
    W = block.attn.qkv.weight.double()
    q_dim, kv_dim = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    q = _rope(_heads(h @ W[:q_dim].T, c.n_heads), c.rope_theta)
    k = _rope(_heads(h @ W[q_dim:q_dim + kv_dim].T, c.n_kv_heads), c.rope_theta)
    k = k.repeat_interleave(c.n_heads // c.n_kv_heads, dim=0)  # head h reads kv head h // 3
    expected = _softmax_scores(q, k, causal=True)
    got = weights[layer, 0].double()
    assert got.shape == (c.n_heads, ids.shape[1], ids.shape[1])
    assert (got - expected).abs().max().item() <= 1e-5
    assert torch.allclose(got.sum(-1), torch.ones(c.n_heads, ids.shape[1], dtype=torch.float64), atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("layer", [0, 5])
def test_encoder_weights_equal_a_hand_computation(minilm, layer):
    """all-MiniLM-L6-v2 (Post-Norm BERT): bidirectional, Q K from the block input with biases."""
    model, tokenizer = minilm
    c = model.config
    ids = torch.tensor([tokenizer.encode(TEXT)])
    block = model.stack.blocks[layer]
    seen, handle = _capture_input(block)
    try:
        weights = attention_weights(model, ids)["self"]
    finally:
        handle.remove()
    x = seen[0][0].double()  # Post-Norm: attention reads the block input itself
    W, b = block.attn.qkv.weight.double(), block.attn.qkv.bias.double()
    D = c.d_model
    q = _heads(x @ W[:D].T + b[:D], c.n_heads)
    k = _heads(x @ W[D:2 * D].T + b[D:2 * D], c.n_heads)
    expected = _softmax_scores(q, k, causal=False)
    assert (weights[layer, 0].double() - expected).abs().max().item() <= 1e-5
    assert (weights[layer, 0, :, 0, -1] > 0).all()  # bidirectional: the first token sees the last


@pytest.mark.parametrize("layer", [0, 1])
def test_encoder_decoder_weights_equal_a_hand_computation(seq2seq, layer):
    """Encoder self-, decoder causal self- and cross-attention of a small random Transformer."""
    c = seq2seq.config
    src = torch.tensor([[5, 9, 13, 2, 40, 7, 21]])
    tgt = torch.tensor([[0, 11, 3, 8, 30]])
    enc_block, dec_block = seq2seq.encoder.blocks[layer], seq2seq.decoder.blocks[layer]
    enc_seen, h1 = _capture_input(enc_block)
    dec_seen, h2 = _capture_input(dec_block)
    cross_seen, h3 = _capture_input(dec_block.cross_attn)
    try:
        weights = attention_weights(seq2seq, src, target_ids=tgt)
    finally:
        for handle in (h1, h2, h3):
            handle.remove()
    D, H = c.d_model, c.n_heads

    def qk(block_attn, x):
        W, b = block_attn.qkv.weight.double(), block_attn.qkv.bias
        b = b.double() if b is not None else torch.zeros(3 * D, dtype=torch.float64)
        return _heads(x @ W[:D].T + b[:D], H), _heads(x @ W[D:2 * D].T + b[D:2 * D], H)

    q, k = qk(enc_block.attn, enc_seen[0][0].double())  # Post-Norm: the block input
    assert (weights["encoder"][layer, 0].double() - _softmax_scores(q, k, causal=False)).abs().max() <= 1e-5
    q, k = qk(dec_block.attn, dec_seen[0][0].double())
    assert (weights["decoder"][layer, 0].double() - _softmax_scores(q, k, causal=True)).abs().max() <= 1e-5
    memory = seq2seq.encode(src)[0].double()  # [S_src, D]
    cross = dec_block.cross_attn
    bq = cross.q.bias.double() if cross.q.bias is not None else 0.0
    bkv = cross.kv.bias.double()[:D] if cross.kv.bias is not None else 0.0
    q = _heads(cross_seen[0][0].double() @ cross.q.weight.double().T + bq, H)
    k = _heads(memory @ cross.kv.weight.double()[:D].T + bkv, H)  # kv rows: K first, then V
    got = weights["cross"][layer, 0].double()
    assert got.shape == (H, tgt.shape[1], src.shape[1])
    assert (got - _softmax_scores(q, k, causal=False)).abs().max() <= 1e-5


def test_maps_of_an_encoder_decoder_without_a_tokenizer_show_ids(seq2seq):
    maps = attention(seq2seq, "5 9 13 2", target="11 3", name="tiny")
    assert [g.name for g in maps.groups] == ["encoder self-attention", "decoder self-attention", "cross-attention"]
    assert [g.kind for g in maps.groups] == ["bidirectional", "causal", "cross"]
    assert maps.groups[0].queries == ("5", "9", "13", "2")
    assert maps.groups[2].queries == ("0", "11", "3") and maps.groups[2].keys == ("5", "9", "13", "2")
    assert maps.groups[2].weights.shape == (2, 4, 3, 4)
    default = attention(seq2seq, [5, 9, 13, 2], max_new_tokens=4)  # the target: its own greedy output
    assert default.groups[1].queries[0] == "0" and 2 <= len(default.groups[1].queries) <= 5


def test_selecting_a_layer_and_head(seq2seq):
    maps = attention(seq2seq, "5 9 13 2", target="11 3", layer=1, head=2)
    for g in maps.groups:
        assert g.layers == (1,) and g.heads == (2,) and g.weights.shape[:2] == (1, 1)
    full = attention(seq2seq, "5 9 13 2", target="11 3")
    assert torch.equal(maps.groups[2].weights[0, 0], full.groups[2].weights[1, 2])
    assert maps.focus == (1, 2)


@pytest.mark.parametrize("kwargs, message", [
    (dict(layer=2), "layer=2 is out of range: the model has 2 encoder and 2 decoder layers (0 to 1)"),
    (dict(head=-1), "head=-1 is out of range: the model has 4 heads (0 to 3)"),
    (dict(text="hello there"), "the model has no tokenizer: give the text as token ids"),
    (dict(text="5 99"), "token id 99 in the text is outside [0, vocab_size=64)"),
    (dict(text=" "), "give the text as token ids"),
    (dict(text="5 " * 40), "the text is 40 tokens, longer than the model's context of 32 tokens (max_seq_len); "
                           "shorten it or pass truncate=True to keep the first 32"),
    (dict(text="5 " * 20, max_tokens=8), "longer than the 8 tokens the maps are drawn for (max_tokens; the "
                                         "model's context is 32)"),
])
def test_bad_input_names_the_value_and_the_rule(seq2seq, kwargs, message):
    args = {"text": "5 9 13", "target": "3", **kwargs}
    with pytest.raises(InputError) as error:
        attention(seq2seq, args.pop("text"), **args)
    assert message in str(error.value)


def test_truncate_keeps_the_first_tokens(seq2seq):
    maps = attention(seq2seq, " ".join(str(5 + i % 50) for i in range(40)), target="3", truncate=True)
    assert len(maps.groups[0].keys) == 32 and maps.groups[0].keys[:3] == ("5", "6", "7")
