"""Feed-forward networks against HF's modules and the activation formulas."""

from __future__ import annotations

import math

import pytest
import torch

from anatomy import ModelConfig
from anatomy.layers import GLU, MLP, make_ffn
from anatomy.layers.ffn import ACTIVATIONS


def config(**changes) -> ModelConfig:
    return ModelConfig(**{**dict(vocab_size=10, d_model=16, n_layers=1, n_heads=2, d_ff=40), **changes})


def test_swiglu_matches_hf_llama_mlp():
    """Our fused gate_up rows are [gate; up]: HF's separate gate_proj and up_proj, stacked."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaMLP

    ours = GLU(config(ffn="glu", activation="silu"))
    hf_config = transformers.LlamaConfig(hidden_size=16, num_attention_heads=2, intermediate_size=40, hidden_act="silu")
    ref = LlamaMLP(hf_config)
    with torch.no_grad():
        gate, up = ours.gate_up.weight.split(40)
        ref.gate_proj.weight.copy_(gate)
        ref.up_proj.weight.copy_(up)
        ref.down_proj.weight.copy_(ours.down.weight)
    x = torch.randn(2, 5, 16)
    assert (ours(x) - ref(x)).abs().max() <= 1e-6


def test_gpt2_mlp_matches_hf_with_conv1d_transposed():
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt2.modeling_gpt2 import GPT2MLP

    ours = MLP(config(activation="gelu_tanh", ffn_bias=True))
    ref = GPT2MLP(40, transformers.GPT2Config(n_embd=16, activation_function="gelu_new"))
    with torch.no_grad():
        ref.c_fc.weight.copy_(ours.up.weight.T)
        ref.c_fc.bias.copy_(ours.up.bias)
        ref.c_proj.weight.copy_(ours.down.weight.T)
        ref.c_proj.bias.copy_(ours.down.bias)
    x = torch.randn(2, 5, 16)
    assert (ours(x) - ref.eval()(x)).abs().max() <= 1e-6


@pytest.mark.parametrize("name, formula", [
    ("relu", lambda x: max(x, 0.0)),
    ("gelu", lambda x: 0.5 * x * (1 + math.erf(x / math.sqrt(2)))),
    ("gelu_tanh", lambda x: 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))),
    ("silu", lambda x: x / (1 + math.exp(-x))),
])
def test_activations_are_their_formulas(name, formula):
    xs = [-3.0, -0.5, 0.0, 0.7, 2.5]
    got = ACTIVATIONS[name](torch.tensor(xs, dtype=torch.float64)).tolist()
    assert got == pytest.approx([formula(x) for x in xs], abs=1e-12)


def test_geglu_and_biases():
    ffn = make_ffn(config(ffn="glu", activation="gelu", ffn_bias=True))
    assert isinstance(ffn, GLU) and ffn.gate_up.weight.shape == (80, 16) and ffn.gate_up.bias is not None
    x = torch.randn(3, 16)
    h = x @ ffn.gate_up.weight.T + ffn.gate_up.bias
    expected = (torch.nn.functional.gelu(h[:, :40]) * h[:, 40:]) @ ffn.down.weight.T + ffn.down.bias
    assert (ffn(x) - expected).abs().max() <= 1e-5
    plain = make_ffn(config())
    assert isinstance(plain, MLP) and plain.up.bias is None
