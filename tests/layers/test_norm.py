"""LayerNorm and RMSNorm against torch's LayerNorm and HF's LlamaRMSNorm."""

from __future__ import annotations

import pytest
import torch

from anatomy import ModelConfig
from anatomy.layers import LayerNorm, RMSNorm, make_norm


def _randomize(norm: torch.nn.Module) -> None:
    with torch.no_grad():
        for p in norm.parameters():
            p.normal_()


def test_layernorm_matches_torch():
    ours = LayerNorm(32, eps=1e-6)
    _randomize(ours)
    ref = torch.nn.LayerNorm(32, eps=1e-6)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(2, 5, 32) * 3 + 1
    assert (ours(x) - ref(x)).abs().max() <= 1e-5


def test_layernorm_without_bias():
    ours = LayerNorm(16, bias=False)
    assert ours.bias is None and [n for n, _ in ours.named_parameters()] == ["weight"]
    x = torch.randn(3, 16)
    expected = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)
    assert (ours(x) - expected).abs().max() <= 1e-5


def test_rmsnorm_matches_hf():
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    ours = RMSNorm(32, eps=1e-5)
    _randomize(ours)
    ref = llama.LlamaRMSNorm(32, eps=1e-5)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(2, 5, 32) * 4
    assert (ours(x) - ref(x)).abs().max() <= 1e-5


def test_rmsnorm_computes_in_fp32_for_half_inputs():
    ours = RMSNorm(64).half()
    x = torch.randn(4, 64) * 100
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)  # by the formula, in fp32
    got = ours(x.half())
    assert got.dtype == torch.float16
    assert (got.float() - expected).abs().max() <= 4e-3  # fp16 rounding of input and result only


@pytest.mark.parametrize("norm, cls", [("layernorm", LayerNorm), ("rmsnorm", RMSNorm)])
def test_make_norm_follows_the_config(norm, cls):
    config = ModelConfig(vocab_size=10, d_model=8, n_layers=1, n_heads=2, d_ff=16, norm=norm, norm_eps=1e-3,
                         norm_bias=False)
    made = make_norm(config)
    assert type(made) is cls and made.eps == 1e-3 and made.weight.shape == (8,)
    assert getattr(made, "bias", None) is None
