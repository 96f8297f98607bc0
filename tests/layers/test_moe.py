"""The mixture-of-experts FFN: the grouped implementation equals the reference loop (values and
gradients), also when experts get no token; routing; the load-balancing loss against HF's."""

from __future__ import annotations

import pytest
import torch

from anatomy import get_preset
from anatomy.layers.moe import MoE, load_balancing_loss, route

transformers = pytest.importorskip("transformers")


def _config(**overrides):
    return get_preset("llama-7b", d_model=32, n_layers=1, n_heads=4, d_ff=48, vocab_size=50, n_experts=6,
                      n_experts_per_token=2, **overrides)


def _pair(config, seed=0):
    torch.manual_seed(seed)
    loop, grouped = MoE(config, implementation="loop"), MoE(config, implementation="grouped")
    grouped.load_state_dict(loop.state_dict())
    return loop, grouped


@pytest.mark.parametrize("overrides", [{}, {"moe_renormalize": False, "d_ff_shared_expert": 20,
                                            "shared_expert_gate": True}, {"ffn": "mlp", "activation": "gelu"}],
                         ids=["mixtral", "qwen-shared", "mlp-experts"])
def test_grouped_equals_loop_with_gradients(overrides):
    loop, grouped = _pair(_config(**overrides))
    x = torch.randn(3, 5, 32)
    outs, grads = [], []
    for moe in (loop, grouped):
        xi = x.clone().requires_grad_()
        out = moe(xi)
        out.square().sum().backward()
        outs.append(out)
        grads.append([xi.grad] + [p.grad for p in moe.parameters()])
    torch.testing.assert_close(outs[0], outs[1], atol=1e-6, rtol=0)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert grads[1][-1].abs().sum() > 0  # the router learns through the routing weights


def test_experts_without_tokens_are_skipped_and_get_no_gradient():
    loop, grouped = _pair(_config())
    with torch.no_grad():  # experts 0 and 1 win every token
        for moe in (loop, grouped):
            moe.router.weight.zero_()
            moe.router.weight[:2] = 1.0
    x = torch.rand(2, 4, 32) + 0.1
    used = route(grouped.router(x.reshape(-1, 32)), 2, renormalize=True)[1]
    assert set(used.flatten().tolist()) == {0, 1}
    out_loop, out_grouped = loop(x), grouped(x)
    torch.testing.assert_close(out_loop, out_grouped, atol=1e-6, rtol=0)
    out_grouped.sum().backward()
    assert grouped.gate_up.grad[2:].abs().sum() == 0 and grouped.gate_up.grad[:2].abs().sum() > 0


def test_route_is_softmax_then_top_k_then_renormalised():
    logits = torch.tensor([[2.0, 0.0, 1.0, -1.0]])
    probs = logits.softmax(-1)[0]
    weights, experts = route(logits, 2, renormalize=False)
    assert experts.tolist() == [[0, 2]]
    torch.testing.assert_close(weights[0], probs[[0, 2]])
    weights, _ = route(logits, 2, renormalize=True)
    torch.testing.assert_close(weights[0], probs[[0, 2]] / probs[[0, 2]].sum())


@pytest.mark.parametrize("masked", [False, True])
def test_load_balancing_loss_equals_hf(masked):
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    torch.manual_seed(1)
    logits = [torch.randn(12, 8) for _ in range(3)]  # 3 layers, B*S = 12 tokens
    mask = (torch.rand(3, 4) > 0.3).long() if masked else None
    expected = load_balancing_loss_func(tuple(logits), 8, 2, mask)
    torch.testing.assert_close(load_balancing_loss(logits, 8, 2, mask), expected)


def test_load_balancing_loss_is_k_when_balanced():
    logits = [torch.zeros(8, 4)]  # uniform probabilities (P_e = 1/4); ties: top-2 picks experts 0 and 1 (f = 1, 1, 0, 0)
    assert float(load_balancing_loss(logits, 4, 2)) == pytest.approx(4 * (1 + 1) * 0.25)
    balanced = torch.full((8, 4), -10.0)
    for t in range(8):
        balanced[t, [t % 4, (t + 1) % 4]] = 10.0  # every expert chosen equally often
    assert float(load_balancing_loss([balanced], 4, 2)) == pytest.approx(2.0, rel=1e-4)


def test_meta_device_routes_evenly():
    """On meta (shape traces, FLOP counts) routing has no values: the pairs are spread evenly."""
    moe = MoE(_config(), implementation="loop").to("meta")
    assert moe._counts(torch.empty(5, 2, dtype=torch.long, device="meta")) == [2, 2, 2, 2, 1, 1]
    assert moe(torch.zeros(1, 5, 32, device="meta")).shape == (1, 5, 32)
