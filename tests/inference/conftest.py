"""Tiny random models of each family, shared by the inference tests."""

from __future__ import annotations

import pytest

from anatomy import build_model, get_preset

SMALL = dict(vocab_size=97, d_model=64, n_heads=4, max_seq_len=64)


def llama_tiny():
    """LLaMA-style: RMSNorm, RoPE, SwiGLU, GQA (4 query heads share 2 kv heads), untied head."""
    return build_model(get_preset("llama-7b", **SMALL, n_layers=2, n_kv_heads=2, d_ff=96)).eval()


def gpt2_tiny():
    """GPT-2-style: LayerNorm, learned positions, GELU MLP, biases, tied head."""
    return build_model(get_preset("gpt2", **SMALL, n_layers=2, d_ff=128, bos_token_id=1, eos_token_id=2)).eval()


def seq2seq_tiny():
    """The original Transformer: Post-LN, sinusoidal positions, cross-attention."""
    return build_model(get_preset("transformer-base", **SMALL, n_layers=2, n_decoder_layers=2, d_ff=128,
                                  dropout=0.0)).eval()


@pytest.fixture(params=["llama", "gpt2"])
def decoder_tiny(request):
    return {"llama": llama_tiny, "gpt2": gpt2_tiny}[request.param]()
