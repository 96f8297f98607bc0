"""A fused q/k/v kept as row runs in formats of their own (SplitRowsWeight) through every engine path: the
engine gives each run a linear layer of its own (SplitLinear), on both backends, and the profiler counts
the runs' ops as the one linear of the shape trace."""

from __future__ import annotations

import torch

from anatomy import build_model, get_preset
from anatomy.analysis.profile.positions import profiled_paths
from anatomy.inference.engine import DecoderEngine
from anatomy.weights.choice import install
from anatomy.weights.formats import Int4Weight, Int8GroupWeight
from anatomy.weights.modules import SplitLinear
from anatomy.weights.split import SplitRowsWeight

TOKENS = [5, 17, 33, 2, 9, 41, 8, 60]


def split_model():
    """A tiny LLaMA whose every q/k/v is int4 q and k rows beside int8g v rows, and its float twin."""
    torch.manual_seed(0)
    config = get_preset("llama-7b", vocab_size=96, d_model=128, n_heads=4, n_kv_heads=2, d_ff=256, n_layers=2,
                        max_seq_len=32)
    model = build_model(config).eval()
    qk = config.n_heads * config.head_dim + config.n_kv_heads * config.head_dim
    formats = {}
    for i, block in enumerate(model.stack.blocks):
        w = block.attn.qkv.weight.detach()
        formats[f"stack.blocks.{i}.attn.qkv.weight"] = SplitRowsWeight(
            [Int4Weight.from_float(w[:qk]), Int8GroupWeight.from_float(w[qk:])], label=f"qkv{i}")
    install(model, formats, dtype=torch.float32)
    return model


def test_the_engine_runs_each_run_as_a_layer_on_both_backends():
    model = split_model()
    with torch.no_grad():
        want = model(torch.tensor([TOKENS]))[0]  # each run's stored values, exactly
    for backend in ("cpu", "torch"):
        engine = DecoderEngine(model, backend=backend)
        assert all(isinstance(b.attn.qkv, SplitLinear) for b in engine.model.stack.blocks)
        got = engine.logits(torch.tensor([TOKENS]))[0]
        assert (got - want).abs().max() < 2e-2 * want.abs().max(), backend  # int8/bf16 activations at most
    torch.testing.assert_close(DecoderEngine(model, backend="torch").logits(torch.tensor([TOKENS]))[0], want,
                               atol=1e-4, rtol=1e-4)  # torch's dense products of the same values: fp32


def test_the_profiler_counts_the_runs_as_their_linear():
    engine = DecoderEngine(split_model(), backend="torch")
    paths = profiled_paths(engine.model)
    assert paths["stack.blocks.0.attn.qkv"] == "stack.blocks.0.attn.qkv"
    assert paths["stack.blocks.0.attn.qkv.parts.0"] is None and paths["stack.blocks.0.attn.qkv.parts.1"] is None
