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


FAMILY = dict(vocab_size=97, d_model=64, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=96, max_seq_len=512,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)


def gemma3_tiny():
    """Gemma 3: windows of 4 on layers 0 and 1 with a RoPE base of their own, q/k norms, sandwich norms."""
    return build_model(get_preset("gemma-3-1b", **FAMILY, n_layers=3, sliding_window=4, sliding_window_layers=(0, 1),
                                  attn_scale=0.25)).eval()


def smollm3_tiny():
    """SmolLM3: no RoPE on layer 3 of 4."""
    return build_model(get_preset("smollm3-3b", **FAMILY, n_layers=4, nope_layers=(3,))).eval()


def gpt_oss_tiny():
    """gpt-oss: attention sinks, a window of 4 on layer 0, 4 experts with biases and a clamped SwiGLU."""
    model = build_model(get_preset("gpt-oss-20b", **{**FAMILY, "d_ff": 32}, n_layers=2, n_experts=4,
                                   n_experts_per_token=2, sliding_window=4, sliding_window_layers=(0,))).eval()
    for name, p in model.named_parameters():  # sinks and biases away from their zeros
        if name.endswith(("sinks", "bias")):
            p.data.normal_(0, 0.5)
    return model


def deepseek_tiny():
    """DeepSeek-V3: latent attention (latent 32, RoPE key 8), a dense layer, then 8 experts in 4 groups."""
    model = build_model(get_preset("deepseek-v3", **{**FAMILY, "n_kv_heads": 4, "head_dim": 24}, rotary_dim=8,
                                   kv_lora_rank=32, q_lora_rank=48, v_head_dim=16, n_layers=3, n_experts=8,
                                   n_experts_per_token=2, d_ff_expert=32, d_ff_shared_expert=32, moe_layers=(1, 2),
                                   router_groups=4, router_topk_groups=2)).eval()
    for name, p in model.named_parameters():
        if name.endswith("score_bias"):
            p.data.normal_(0, 0.1)
    return model


@pytest.fixture(params=["gemma3", "smollm3", "gpt-oss", "deepseek"])
def family_tiny(request):
    return {"gemma3": gemma3_tiny, "smollm3": smollm3_tiny, "gpt-oss": gpt_oss_tiny,
            "deepseek": deepseek_tiny}[request.param]()
