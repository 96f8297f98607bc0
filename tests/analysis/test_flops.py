"""Analytic FLOPs against the seed tables and against torch's FlopCounterMode."""

from __future__ import annotations

import pytest
import torch

from anatomy.analysis.flops import (
    attended_pairs,
    count_flops,
    decode_flops,
    forward_flops,
    layer_flops,
    training_time,
)
from anatomy.inference.engine.kv_cache import KVCache
from anatomy.models import build_model
from anatomy.presets import get_preset

SMALL = {"vocab_size": 101, "d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 96, "max_seq_len": 64,
         "bos_token_id": None, "eos_token_id": None}
FAMILIES = {
    "llama-gqa": get_preset("llama-7b", **SMALL, n_kv_heads=2),
    "gpt2": get_preset("gpt2", **SMALL),
    "bert": get_preset("bert-base", **SMALL),
    "transformer": get_preset("transformer-base", **SMALL, n_decoder_layers=3),
    # today's decoders: experts on some layers (k of E, a gated shared expert), a window on others
    "moe-window": get_preset("llama-7b", **{**SMALL, "n_layers": 3}, n_kv_heads=2, n_experts=4, n_experts_per_token=2,
                             d_ff_expert=32, d_ff_shared_expert=40, shared_expert_gate=True, moe_layers=(1, 2),
                             sliding_window=3, sliding_window_layers=(0, 1), qk_norm=True),
}


def test_bert_base_layer_at_512_matches_seed_004_with_attention_matmuls():
    layer = layer_flops(get_preset("bert-base"), batch=1, q_len=512, kv_len=512, causal=False)
    projections = layer["qkv_projection"] + layer["output_projection"]
    attention = layer["attention_scores"] + layer["attention_values"]
    assert round(projections / 1e9, 2) == 2.42
    assert round(attention / 1e9, 2) == 0.81
    assert round(layer["ffn"] / 1e9, 2) == 4.83
    assert round(sum(layer.values()) / 1e9, 2) == 8.05
    full = forward_flops(get_preset("bert-base"), batch=1, seq=512)
    assert round(full.total / 1e9, 1) == 96.6
    # seed 004's "MHA 2.4 + FFN 4.8 = 7.2, x12 ~ 86" leaves the QK^T and AV matmuls out:
    without = full.total - full.attention_matmuls
    assert round((projections + layer["ffn"]) / 1e9, 2) == 7.25 and round(without / 1e9) == 87


def test_mha_attention_formula_and_per_step_table_of_seed_000():
    config = get_preset("llama-7b")
    B, S, D, H, d_h = 2, 64, 4096, 32, 128
    layer = layer_flops(config, batch=B, q_len=S, kv_len=S)
    assert layer["qkv_projection"] == 6 * B * S * D ** 2
    assert layer["attention_scores"] == layer["attention_values"] == 2 * B * H * S ** 2 * d_h
    assert layer["output_projection"] == 2 * B * S * D ** 2
    attention = sum(v for k, v in layer.items() if k != "ffn")
    assert attention == 8 * B * S * D ** 2 + 4 * B * S ** 2 * D


def test_swiglu_ffn_is_16_d_squared_per_token_at_f_8d_over_3():
    D = 768
    config = get_preset("llama-7b", d_model=D, d_ff=8 * D // 3, n_heads=12)
    assert layer_flops(config, batch=3, q_len=5, kv_len=5)["ffn"] == 16 * D ** 2 * 15


def test_causal_halving_counts_the_lower_triangle():
    assert attended_pairs(10, 10, causal=True) == 55
    assert attended_pairs(10, 10, causal=False) == 100
    assert attended_pairs(1, 20, causal=True) == 20  # a decode step sees every cached position
    halved = forward_flops(get_preset("llama-7b"), batch=1, seq=4096, causal_halving=True)
    dense = forward_flops(get_preset("llama-7b"), batch=1, seq=4096)
    assert halved.attention_matmuls * 4096 == dense.attention_matmuls * (4096 + 1) // 2


@pytest.mark.parametrize("family", FAMILIES)
def test_analytic_equals_flop_counter_mode(family):
    config = FAMILIES[family]
    B, S, T = 2, 7, 11
    for head in ("auto", "mlm") if config.is_encoder else ("auto",):
        model = build_model(config, device="meta", head=head).to("meta").eval()
        ids = torch.zeros(B, S, dtype=torch.long, device="meta")
        measured = count_flops(lambda m=model, x=ids: m(x, x) if config.is_seq2seq else m(x))
        assert measured == forward_flops(config, batch=B, seq=S, head=head).total
    if config.is_encoder:
        return
    cache = KVCache(config, batch=B, max_len=T, device="meta")
    one = torch.zeros(B, 1, dtype=torch.long, device="meta")
    pos = torch.tensor([T - 1], device="meta")
    if config.is_seq2seq:
        memory_kv = model.memory_kv(torch.zeros(B, S, config.d_model, device="meta"))
        measured = count_flops(lambda: model.decode(one, memory_kv=memory_kv, cache=cache, input_pos=pos))
    else:
        measured = count_flops(lambda: model(one, cache=cache, input_pos=pos))
    # anatomy's static cache holds all T positions and masks those outside a window: windowed=False
    assert measured == decode_flops(config, batch=B, context=T, source_len=S, windowed=False).total


def test_llama_7b_on_1t_tokens_as_seed_000_should_have_computed():
    total = 6 * 7e9 * 1e12
    assert total == pytest.approx(4.2e22)
    at_450 = training_time(total_flops=total, peak_flops=450e12, mfu=1.0, gpus=512)
    assert at_450.gpu_seconds == pytest.approx(9.33e7, rel=1e-3)  # the seed prints 2.6e8 s
    assert round(at_450.gpu_days, -1) == 1080  # the seed prints ~3000 days
    assert round(at_450.wall_days, 1) == 2.1  # the seed prints ~5.8 days
    at_mfu = training_time(total_flops=total, peak_flops=989e12, mfu=0.45, gpus=512)
    assert round(at_mfu.gpu_hours, -2) == 26_200  # the seed prints 94,000 GPU-hours
    assert round(at_mfu.wall_days, 1) == 2.1  # the seed prints 7.7 days


def test_seq2seq_parts_add_up_and_training_is_three_forwards():
    from anatomy.analysis.flops import training_flops_per_token

    config = get_preset("transformer-base")
    fwd = forward_flops(config, batch=1, seq=64)
    assert fwd.projections + fwd.attention_matmuls + fwd.parts["ffn"] + fwd.parts["lm_head"] == fwd.total
    per_token = training_flops_per_token(config, seq=64)
    assert per_token["three_forward"] == 3 * fwd.total / 64
    assert per_token["attention_term"] == 3 * fwd.attention_matmuls / 64


def test_moe_flops_follow_k_of_e_experts():
    """A token goes through the router and k experts: FLOPs grow with k, not with E."""
    base = get_preset("mixtral-8x7b")
    per_token = forward_flops(base, batch=1, seq=1).parts["ffn"] / base.n_layers
    D, F = 4096, 14336
    assert per_token == 2 * D * 8 + 2 * 2 * 3 * D * F
    more_experts = forward_flops(base.replace(n_experts=64), batch=1, seq=1).parts["ffn"] / base.n_layers
    assert more_experts - per_token == 2 * D * (64 - 8)  # only the router grows


def test_sliding_window_caps_decode_attention_and_the_skipping_count():
    config = get_preset("mistral-7b")
    long = decode_flops(config, batch=1, context=32768)
    dense = decode_flops(config, batch=1, context=32768, windowed=False)
    assert long.attention_matmuls == decode_flops(config, batch=1, context=4096).attention_matmuls
    assert dense.attention_matmuls == 8 * long.attention_matmuls
    assert attended_pairs(6, 6, causal=True, window=2) == 1 + 2 * 5
