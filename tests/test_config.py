"""ModelConfig: validated on construction, errors that name the field, the value and the rule."""

from __future__ import annotations

import dataclasses

import pytest

from anatomy import ModelConfig
from anatomy.errors import ConfigError

BASE = dict(vocab_size=100, d_model=64, n_layers=2, n_heads=4, d_ff=128)


def make(**changes) -> ModelConfig:
    return ModelConfig(**{**BASE, **changes})


def test_defaults_are_derived():
    c = make()
    assert (c.n_kv_heads, c.head_dim, c.q_dim, c.kv_dim) == (4, 16, 64, 64)
    gqa = make(n_kv_heads=2)
    assert (gqa.q_dim, gqa.kv_dim) == (64, 32)
    decoupled = make(n_heads=3, head_dim=20)
    assert decoupled.q_dim == 60


@pytest.mark.parametrize("changes, message", [
    (dict(d_model=66, n_heads=4), "d_model=66 is not divisible by n_heads=4"),
    (dict(n_kv_heads=3), "n_heads=4 is not divisible by n_kv_heads=3"),
    (dict(norm="batchnorm"), "norm='batchnorm' is not one of 'layernorm', 'rmsnorm'"),
    (dict(norm_position="sandwich"), "norm_position='sandwich' is not one of 'pre', 'post'"),
    (dict(ffn="moe"), "ffn='moe' is not one of 'mlp', 'glu'"),
    (dict(activation="tanh"), "activation='tanh' is not one of 'relu', 'gelu', 'gelu_tanh', 'silu'"),
    (dict(position="xpos"), "position='xpos' is not one of 'sinusoidal', 'learned', 'rope', 'alibi', 'none'"),
    (dict(architecture="decoder-encoder"), "architecture='decoder-encoder' is not one of"),
    (dict(vocab_size=0), "vocab_size=0 must be a positive integer"),
    (dict(n_layers=2.0), "n_layers=2.0 must be a positive integer"),
    (dict(d_ff=True), "d_ff=True must be a positive integer"),
    (dict(n_kv_heads=0), "n_kv_heads=0 must be a positive integer"),
    (dict(position="rope", n_heads=2, head_dim=15), "head_dim=15 must be even for position='rope'"),
    (dict(position="sinusoidal", d_model=63, n_heads=3), "d_model=63 must be even for position='sinusoidal'"),
    (dict(architecture="encoder-decoder"), "n_decoder_layers=0 must be > 0 for architecture='encoder-decoder'"),
    (dict(n_decoder_layers=2), "n_decoder_layers=2 is only for architecture='encoder-decoder'"),
    (dict(dropout=1.0), "dropout=1.0 must be in [0, 1)"),
    (dict(norm_eps=0.0), "norm_eps=0.0 must be > 0"),
    (dict(rope_theta=-1.0), "rope_theta=-1.0 must be > 0"),
    (dict(type_vocab_size=-1), "type_vocab_size=-1 must be >= 0"),
    (dict(eos_token_id=100), "eos_token_id=100 is outside [0, vocab_size=100)"),
    (dict(pad_token_id=-1), "pad_token_id=-1 is outside [0, vocab_size=100)"),
    (dict(norm_eps="1e-5"), "norm_eps='1e-5' must be a number"),
    (dict(type_vocab_size=None), "type_vocab_size=None must be an integer"),
    (dict(bos_token_id=1.0), "bos_token_id=1.0 must be an integer or None"),
])
def test_bad_values_are_named(changes, message):
    with pytest.raises(ConfigError) as e:
        make(**changes)
    assert message in str(e.value)
    assert isinstance(e.value, ValueError)  # callers may catch ValueError


def test_frozen_and_replace_revalidates():
    c = make()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.d_model = 32
    assert c.replace(n_layers=4).n_layers == 4
    with pytest.raises(ConfigError, match="n_heads=4 is not divisible by n_kv_heads=3"):
        c.replace(n_kv_heads=3)


def test_dict_round_trip_and_unknown_fields():
    c = make(n_kv_heads=2, position="rope", norm="rmsnorm")
    assert ModelConfig.from_dict(c.to_dict()) == c
    with pytest.raises(ConfigError, match=r"unknown ModelConfig field\(s\) \['d_modle'\]"):
        ModelConfig.from_dict({**BASE, "d_modle": 64})


def test_architecture_properties():
    assert make().causal and make().is_decoder
    enc = make(architecture="encoder")
    assert enc.is_encoder and not enc.causal
    s2s = make(architecture="encoder-decoder", n_decoder_layers=1)
    assert s2s.is_seq2seq and not s2s.causal


# -- the parts of today's decoders -------------------------------------------------------------------
DECODER = dict(BASE, position="rope", norm="rmsnorm", ffn="glu", activation="silu")


@pytest.mark.parametrize("changes, message", [
    (dict(n_experts=8, n_experts_per_token=9), r"n_experts_per_token=9 must be in \[1, n_experts=8\]"),
    (dict(n_experts=8), r"n_experts_per_token=0 must be in \[1, n_experts=8\]"),
    (dict(n_experts_per_token=2), "n_experts_per_token=2 needs n_experts > 0"),
    (dict(router_bias=True), "router_bias=True needs n_experts > 0"),
    (dict(router_scoring="sigmoid"), "router_scoring='sigmoid' needs n_experts > 0"),
    (dict(n_experts=4, n_experts_per_token=2, router_scoring="tanh"), "router_scoring='tanh' is not one of"),
    (dict(n_experts=4, n_experts_per_token=2, router_groups=3), "the groups must divide n_experts=4"),
    (dict(kv_lora_rank=16), "latent attention is for RoPE decoders whose heads have dims without RoPE"),
    (dict(kv_lora_rank=16, rotary_dim=8, qk_norm=True), "latent attention has no q/k/v biases, q/k norm"),
    (dict(q_lora_rank=8), "q_lora_rank=8 is for latent attention: it needs kv_lora_rank > 0"),
    (dict(kv_lora_rank=-1), "kv_lora_rank=-1 must be an integer >= 0"),
    (dict(swiglu_limit=7.0, activation="gelu"), "swiglu_limit=7.0 clamps a SwiGLU: it needs ffn='glu' and "
                                                "activation='silu'"),
    (dict(swiglu_limit=-1.0), "swiglu_limit=-1.0 must be a positive number"),
    (dict(swiglu_alpha=1.7), "swiglu_alpha=1.7 is the gain of the clamped SwiGLU: it needs swiglu_limit"),
    (dict(sliding_rope_theta=10.0), "sliding_rope_theta=10.0 is the RoPE base of sliding-window layers"),
    (dict(sliding_rope_scaling=dict(kind="linear", factor=2.0)), "sliding_rope_scaling is set but sliding_rope_theta"),
    (dict(nope_layers=(5,)), r"nope_layers=\[5\] must be increasing layer indices"),
    (dict(nope_layers=(0,), position="alibi"), "nope_layers=\\(0,\\) names layers without RoPE"),
    (dict(n_experts=4, n_experts_per_token=2, moe_layers=(2,)), r"moe_layers=\[2\] must be increasing layer indices"),
    (dict(n_experts=4, n_experts_per_token=2, shared_expert_gate=True), "shared_expert_gate=True needs a shared"),
    (dict(sliding_window=0), "sliding_window=0 must be a positive integer"),
    (dict(sliding_window_layers=(0,)), "sliding_window_layers is set but sliding_window is None"),
    (dict(sliding_window=4, sliding_window_layers=(1, 0)), r"sliding_window_layers=\[1, 0\] must be increasing"),
    (dict(rotary_dim=15), "rotary_dim=15 must be even and <= head_dim=16"),
    (dict(rotary_dim=32), "rotary_dim=32 must be even and <= head_dim=16"),
    (dict(rope_scaling=dict(kind="ntk")), "rope_scaling kind='ntk' is not one of 'linear', 'dynamic', 'yarn'"),
    (dict(rope_scaling=dict(kind="llama3", factor=8.0)), "rope_scaling kind='llama3' needs original_max_seq_len"),
    (dict(rope_scaling=dict(kind="linear", factor=-2.0)), "rope_scaling.factor=-2.0 must be a positive number"),
    (dict(rope_scaling=dict(kind="longrope", original_max_seq_len=8, short_factor=[1.0], long_factor=[1.0])),
     "rope_scaling.short_factor has 1 entries; rotary_dim/2 = 8 needed"),
    (dict(attn_softcap=0.0), "attn_softcap=0.0 must be a positive number or None"),
    (dict(qk_norm=True, norm="layernorm"), "qk_norm=True normalises q and k with RMSNorm"),
    (dict(branch_output_norm=True, norm_position="post"), "branch_output_norm=True .* needs norm_position='pre'"),
])
def test_new_fields_name_field_value_and_rule(changes, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig(**{**DECODER, **changes})


def test_windows_and_experts_only_where_they_apply():
    with pytest.raises(ConfigError, match="sliding_window=4 is for causal decoders"):
        make(architecture="encoder", sliding_window=4)
    with pytest.raises(ConfigError, match="mixture-of-experts FFNs are for decoders"):
        make(architecture="encoder", n_experts=2, n_experts_per_token=1)
    with pytest.raises(ConfigError, match="rotary_dim=8 is only for position='rope'"):
        make(rotary_dim=8)


def test_per_layer_choices_are_data():
    c = ModelConfig(**{**DECODER, "n_layers": 4, "sliding_window": 3, "sliding_window_layers": [0, 2],
                       "n_experts": 4, "n_experts_per_token": 2, "moe_layers": [1, 2, 3]})
    assert [c.layer_window(i) for i in range(4)] == [3, None, 3, None]
    assert [c.layer_is_moe(i) for i in range(4)] == [False, True, True, True] and c.n_moe_layers == 3
    assert c.sliding_window_layers == (0, 2) and c.d_ff_expert == c.d_ff and c.rotary_dim == c.head_dim
    assert c.kv_values(10) == 2 * 4 * 16 * (3 + 10 + 3 + 10)  # two sliding layers keep 3 positions, two keep 10
    sub = c.with_layers([2, 3])  # layers built like layers 2 and 3
    assert (sub.n_layers, sub.sliding_window_layers, sub.moe_layers) == (2, (0,), (0, 1))


def test_rope_scaling_round_trips_through_dicts():
    c = ModelConfig(**{**DECODER, "rope_scaling": dict(kind="longrope", original_max_seq_len=8,
                                                       short_factor=[1.0] * 8, long_factor=[2.0] * 8)})
    assert isinstance(c.rope_scaling.short_factor, tuple)
    assert ModelConfig.from_dict(c.to_dict()) == c
