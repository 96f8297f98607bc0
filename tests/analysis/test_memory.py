"""Weights, KV cache and attention-score memory against the seed figures and the real cache."""

from __future__ import annotations

import pytest

from anatomy.analysis import memory
from anatomy.inference.engine.kv_cache import KVCache
from anatomy.presets import get_preset


def test_llama_2_7b_kv_cache_at_4096_tokens_fp16_is_2_gib_per_sequence():
    config = get_preset("llama-2-7b")
    assert memory.kv_cache_bytes(config, batch=1, tokens=4096, kv_dtype="f16") == 2_147_483_648


def test_llama_3_8b_gqa_kv_cache_is_128_kib_per_token_bf16():
    assert memory.kv_bytes_per_token(get_preset("llama-3-8b"), "bf16") == 128 * 1024


def test_kv_cache_counts_head_dim_not_d_model_over_heads():
    config = get_preset("llama-7b", d_model=256, n_heads=4, n_kv_heads=2, head_dim=96, d_ff=512, n_layers=3,
                        vocab_size=100, bos_token_id=None, eos_token_id=None)
    assert memory.kv_bytes_per_token(config, "f32") == 2 * 3 * 2 * 96 * 4  # not 2 * 3 * 2 * (256 / 4) * 4
    cache = KVCache(config, batch=2, max_len=7, device="meta")  # the inference engine's cache, allocated on meta
    scratch = memory.kv_cache_bytes(config, batch=1, tokens=cache.paged.block_size, kv_dtype="f32")  # one block
    assert cache.nbytes == memory.kv_cache_bytes(config, batch=2, tokens=7, kv_dtype="f32") + scratch


def test_int_kv_dtypes_and_encoders():
    config = get_preset("llama-2-7b")
    values = 2 * 32 * 4096  # K and V, 32 layers, 32 heads of 128
    assert memory.kv_bytes_per_token(config, "f16") == 2 * values
    scales = 2 * 32 * 32 * 2  # an f16 scale per token, layer and head, for K and for V
    assert memory.kv_bytes_per_token(config, "int8") == values + scales  # 266,240 B: 50.8% of f16's
    assert memory.kv_bytes_per_token(config, "int4") * 4 == memory.kv_bytes_per_token(config, "f16")
    assert memory.kv_bytes_per_token(get_preset("bert-base"), "f16") == 0  # no decoding, no cache


def test_naive_scores_llama_7b_4096_fp32_are_2_gib_per_layer_per_sequence():
    assert memory.naive_scores_bytes(get_preset("llama-7b"), batch=1, seq=4096, dtype="f32") == 2 ** 31


def test_weights_by_dtype():
    n = 6_738_415_616
    assert [memory.weights_bytes(n, d) for d in ("f32", "bf16", "f16", "int8", "int4")] == [
        4 * n, 2 * n, 2 * n, n, n // 2]
    with pytest.raises(ValueError, match="fp8"):
        memory.weights_bytes(n, "fp8")


def test_training_activations_fused_vs_naive_and_checkpointing():
    config = get_preset("bert-base")
    fused = memory.training_activations(config, batch=2, seq=256, dtype="bf16", backend="sdpa")
    naive = memory.training_activations(config, batch=2, seq=256, dtype="bf16", backend="eager")
    # the naive block keeps the scores and probabilities (and dropout mask) of every head; fused keeps
    # a log-sum-exp row instead: the difference is at least one [B, H, S, S] bf16 matrix per block
    scores = memory.naive_scores_bytes(config, batch=2, seq=256, dtype="bf16")
    assert naive.per_block - fused.per_block >= scores
    assert fused.checkpointed < fused.total and naive.checkpointed < naive.total
    assert fused.blocks == 12 and fused.block_input == 2 * 256 * 768 * 2


@pytest.mark.parametrize("name", ["gpt2", "transformer-base"])
def test_two_measured_blocks_per_stack_extrapolate_exactly(monkeypatch, name):
    config = get_preset(name, n_layers=5, **({"n_decoder_layers": 4} if name == "transformer-base" else {}))
    shallow = memory.training_activations(config, batch=1, seq=32, dtype="f32", backend="eager")
    monkeypatch.setattr(memory, "MEASURED_LAYERS", 100)  # run every block instead
    full = memory.training_activations(config, batch=1, seq=32, dtype="f32", backend="eager")
    assert shallow == full


def test_f32_training_state_is_what_adamw_really_keeps():
    """Weights + gradients + AdamW's exp_avg and exp_avg_sq of a real f32 training step."""
    import torch

    from anatomy.models import build_model
    from anatomy.training.optim import make_optimizer

    model = build_model(get_preset("gpt2", d_model=32, n_layers=2, n_heads=2, d_ff=64, vocab_size=50,
                                   bos_token_id=None, eos_token_id=None))
    optimizer = make_optimizer(model, lr=1e-3, weight_decay=0.1)
    model(torch.randint(0, 50, (2, 8))).sum().backward()
    optimizer.step()
    params = list(model.parameters())
    kept = {"weights": sum(p.nbytes for p in params), "gradients": sum(p.grad.nbytes for p in params),
            "adam_moments": sum(s[k].nbytes for s in optimizer.state.values() for k in ("exp_avg", "exp_avg_sq"))}
    state = memory.training_state(sum(p.numel() for p in params), dtype="f32")
    assert (state.weights, state.gradients, state.adam_moments, state.master_weights) == (*kept.values(), 0)
    assert state.total == 16 * sum(p.numel() for p in params)


def test_mixed_precision_training_state_keeps_an_f32_master_copy():
    state = memory.training_state(1000, dtype="bf16")
    assert (state.weights, state.gradients, state.master_weights, state.adam_moments) == (2000, 2000, 4000, 8000)
    assert state.total == 16_000


def test_sliding_windows_cap_the_kv_cache():
    """Mistral 7B keeps 4096 positions per layer however long the context; Gemma 2 every other layer."""
    mistral = get_preset("mistral-7b")
    per_token = memory.kv_bytes_per_token(mistral, "bf16")
    assert memory.kv_cache_bytes(mistral, batch=1, tokens=32768, kv_dtype="bf16") == 4096 * per_token
    assert memory.kv_cache_bytes(mistral, batch=1, tokens=32768, kv_dtype="bf16", windowed=False) == 32768 * per_token
    gemma = get_preset("gemma-2-9b")
    half = memory.kv_bytes_per_token(gemma, "bf16") // 2  # 21 windowed layers, 21 full ones
    assert memory.kv_cache_bytes(gemma, batch=1, tokens=8192, kv_dtype="bf16") == 4096 * half + 8192 * half


def test_layers_of_different_kinds_are_each_measured(monkeypatch):
    """Windowed and full, dense and mixture layers save different tensors: each kind is measured once."""
    config = get_preset("llama-7b", vocab_size=50, d_model=32, n_layers=5, n_heads=4, d_ff=48, n_experts=4,
                        n_experts_per_token=2, moe_layers=(1, 3, 4), sliding_window=4, sliding_window_layers=(0, 1))
    by_kind = memory.training_activations(config, batch=1, seq=8, dtype="f32", backend="eager")
    monkeypatch.setattr(memory, "_layer_kinds", lambda c: {})
    monkeypatch.setattr(memory, "MEASURED_LAYERS", 100)  # run every block instead
    every = memory.training_activations(config, batch=1, seq=8, dtype="f32", backend="eager")
    assert by_kind == every
