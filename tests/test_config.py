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
