"""Weight decay on matrices only, the warmup + cosine schedule, clipping."""

from __future__ import annotations

import math

import torch

from anatomy import build_model, get_preset
from anatomy.training.optim import Schedule, clip_gradients, make_optimizer


def _names(model, params):
    ids = {id(p) for p in params}
    return {n for n, p in model.named_parameters() if id(p) in ids}


def test_weight_decay_excludes_biases_and_norms():
    config = get_preset("gpt2", d_model=32, n_layers=2, n_heads=2, d_ff=64, vocab_size=50, max_seq_len=16,
                        bos_token_id=None, eos_token_id=None)
    model = build_model(config)
    opt = make_optimizer(model, lr=1e-3, weight_decay=0.1)
    decayed, plain = opt.param_groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    decayed_names, plain_names = _names(model, decayed["params"]), _names(model, plain["params"])
    assert all(n.endswith("bias") or "norm" in n for n in plain_names)
    assert {"stack.blocks.0.attn_norm.weight", "stack.blocks.0.attn.qkv.bias", "stack.final_norm.bias"} <= plain_names
    assert {"stack.blocks.0.attn.qkv.weight", "stack.blocks.1.ffn.down.weight", "stack.embed.tokens.weight"} <= decayed_names
    assert len(decayed["params"]) + len(plain["params"]) == len(list(model.parameters()))  # tied head once


def test_decay_really_skips_biases():
    config = get_preset("gpt2", d_model=32, n_layers=1, n_heads=2, d_ff=64, vocab_size=50, max_seq_len=16,
                        bos_token_id=None, eos_token_id=None)
    model = build_model(config)
    opt = make_optimizer(model, lr=0.1, weight_decay=0.5)
    bias, weight = model.stack.blocks[0].attn.qkv.bias, model.stack.blocks[0].attn.qkv.weight
    with torch.no_grad():
        bias.fill_(1.0)
    w0 = weight.detach().clone()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    assert torch.equal(bias, torch.ones_like(bias))  # zero gradient, no decay: unchanged
    assert torch.allclose(weight, w0 * (1 - 0.1 * 0.5))  # AdamW: w <- w - lr * wd * w


def test_schedule_warmup_then_cosine():
    s = Schedule(lr=1.0, min_lr=0.1, warmup=10, steps=110)
    assert s(0) == 0.1 and s(9) == 1.0
    assert s(10) == 1.0
    assert math.isclose(s(60), 0.55)
    assert math.isclose(s(110), 0.1) and math.isclose(s(500), 0.1)


def test_clip_returns_the_norm_before_clipping():
    model = torch.nn.Linear(3, 1, bias=False)
    model.weight.grad = torch.tensor([[3.0, 4.0, 0.0]])
    assert float(clip_gradients(model, 1.0)) == 5.0
    assert torch.allclose(model.weight.grad, torch.tensor([[0.6, 0.8, 0.0]]), atol=1e-6)
    model.weight.grad = torch.tensor([[3.0, 4.0, 0.0]])
    assert float(clip_gradients(model, 0)) == 5.0 and model.weight.grad[0, 0] == 3.0
