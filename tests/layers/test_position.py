"""Positions against their definitions: the sinusoid formula, HF's rotary embedding, the ALiBi
paper's slopes."""

from __future__ import annotations

import math

import pytest
import torch

from anatomy import ModelConfig
from anatomy.layers import LearnedPositions, Rotary, SinusoidalPositions, alibi_bias, alibi_slopes, apply_rope


def config(**changes) -> ModelConfig:
    return ModelConfig(**{**dict(vocab_size=10, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=50), **changes})


def test_sinusoidal_table_is_the_formula():
    """PE(pos, i) = sin(pos / 10000^(2i/D)) in column i, cos(...) in column D/2 + i (halves, not interleaved)."""
    table = SinusoidalPositions(config(position="sinusoidal")).table
    D = 16
    for pos in (0, 1, 7, 49):
        for i in range(D // 2):
            angle = pos / 10000 ** (2 * i / D)
            assert table[pos, i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, D // 2 + i].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_sinusoidal_matches_marian():
    marian = pytest.importorskip("transformers.models.marian.modeling_marian")
    expected = marian.MarianSinusoidalPositionalEmbedding(50, 16).create_weight()
    assert (SinusoidalPositions(config()).table - expected).abs().max() <= 1e-6


def test_learned_lookup():
    table = LearnedPositions(config())
    ids = torch.tensor([[0, 3, 49]])
    assert torch.equal(table(ids)[0], table.weight[[0, 3, 49]])


def test_rope_matches_hf():
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    transformers = pytest.importorskip("transformers")
    hf_config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, rope_theta=5000.0)
    c = config(d_model=64, n_heads=4, position="rope", rope_theta=5000.0)
    pos = torch.tensor([[0, 1, 2, 9, 31], [3, 4, 5, 6, 7]])
    q, k = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 5, 16)
    ref_cos, ref_sin = llama.LlamaRotaryEmbedding(hf_config)(q, pos)  # [B, S, d_h]
    cos, sin = Rotary(c)(pos)  # [B, S, 1, d_h]: for q/k laid out [B, S, heads, d_h]
    assert (cos[:, :, 0] - ref_cos).abs().max() <= 1e-6 and (sin[:, :, 0] - ref_sin).abs().max() <= 1e-6
    ref_q, _ = llama.apply_rotary_pos_emb(q, q, ref_cos, ref_sin)
    ref_k, _ = llama.apply_rotary_pos_emb(k, k, ref_cos, ref_sin)
    assert (apply_rope(q.transpose(1, 2), cos, sin).transpose(1, 2) - ref_q).abs().max() <= 1e-5
    assert (apply_rope(k.transpose(1, 2), cos, sin).transpose(1, 2) - ref_k).abs().max() <= 1e-5


def test_rope_scores_depend_only_on_distance():
    rotary = Rotary(config(position="rope"))
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(m, n):
        cq, sq = rotary(torch.tensor([[m]]))
        ck, sk = rotary(torch.tensor([[n]]))
        return (apply_rope(q, cq, sq) * apply_rope(k, ck, sk)).sum().item()
    assert score(5, 2) == pytest.approx(score(13, 10), abs=1e-5)
    assert score(5, 2) != pytest.approx(score(5, 4), abs=1e-3)


@pytest.mark.parametrize("n, expected", [
    (8, [2 ** -i for i in range(1, 9)]),
    (16, [2 ** -(i / 2) for i in range(1, 17)]),
    (12, [2 ** -i for i in range(1, 9)] + [2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5]),
    (1, [2 ** -8]),
])
def test_alibi_slopes_are_the_papers(n, expected):
    """Press et al.: 2^(-8/n * i); other head counts take the power-of-two series and every other
    slope of the next one."""
    assert alibi_slopes(n).tolist() == pytest.approx(expected)


def test_alibi_bias():
    slopes = torch.tensor([0.5, 0.25])
    pos = torch.arange(3)
    causal = alibi_bias(slopes, pos, pos, causal=True)
    assert causal.shape == (1, 2, 3, 3)
    assert causal[0, 0].tolist() == [[0, 0.5, 1.0], [-0.5, 0, 0.5], [-1.0, -0.5, 0]]  # future masked elsewhere
    assert alibi_bias(slopes, pos, pos, causal=False)[0, 1].tolist() == [[0, -0.25, -0.5], [-0.25, 0, -0.25],
                                                                           [-0.5, -0.25, 0]]
