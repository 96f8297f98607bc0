"""Roofline: decode is memory-bound at batch 1 and turns compute-bound where the formula says."""

from __future__ import annotations

import pytest

from anatomy.analysis.hardware import get_hardware
from anatomy.analysis.params import parameter_ledger
from anatomy.analysis.roofline import decode_compute_bound_batch, decode_point, prefill_point, weights_read_bytes
from anatomy.presets import get_preset

DTYPES = {"weight_dtype": "bf16", "kv_dtype": "bf16", "compute_dtype": "bf16"}


def test_llama_7b_decode_at_batch_1_is_memory_bound_prefill_compute_bound():
    config, hw = get_preset("llama-7b"), get_hardware("h100-sxm")
    ledger = parameter_ledger(config)
    decode = decode_point(config, ledger, hw, batch=1, context=2048, source_len=0, **DTYPES)
    assert decode.bound == "memory"
    # at batch 1 decode streams every weight once per token: about 1 FLOP per byte in bf16
    assert 0.9 < decode.intensity < 1.1
    # by hand: LLaMA-7B's 6,738,415,616 parameters less the 32000 x 4096 token table (looked up, not
    # streamed) in bf16, plus K and V of 32 layers x 4096 x 2048 positions in bf16, at H100 SXM's 3.35 TB/s
    streamed = 2 * (6_738_415_616 - 32000 * 4096) + 2 * 32 * 4096 * 2048 * 2
    assert decode.tokens_per_s == pytest.approx(3.35e12 / streamed, rel=1e-12)
    prefill = prefill_point(config, ledger, hw, batch=1, seq=2048, **DTYPES)
    assert prefill.bound == "compute" and prefill.intensity > prefill.ridge


def test_lookup_tables_are_not_streamed():
    ledger = parameter_ledger(get_preset("llama-7b"))  # untied: the token table is only indexed
    assert weights_read_bytes(ledger, "bf16") == 2 * (ledger.total - 32000 * 4096)


def test_decode_turns_compute_bound_at_the_computed_batch():
    config, hw = get_preset("llama-3-8b"), get_hardware("a100-80gb")
    ledger = parameter_ledger(config)
    b = decode_compute_bound_batch(config, ledger, hw, context=256, source_len=0, **DTYPES)
    assert b is not None and b > 1
    at = decode_point(config, ledger, hw, batch=b, context=256, source_len=0, **DTYPES)
    below = decode_point(config, ledger, hw, batch=b - 1, context=256, source_len=0, **DTYPES)
    assert at.bound == "compute" and below.bound == "memory"


def test_long_context_decode_never_turns_compute_bound():
    config, hw = get_preset("llama-7b"), get_hardware("h200")
    ledger = parameter_ledger(config)  # MHA at 2048: the KV reads per sequence outweigh its FLOPs
    assert decode_compute_bound_batch(config, ledger, hw, context=2048, source_len=0, **DTYPES) is None


def test_moe_decode_reads_only_the_experts_its_tokens_use():
    """Mixtral at batch 1 reads 2 of 8 experts per layer; a large batch reaches nearly all of them."""
    from anatomy.analysis.params import parameter_ledger
    from anatomy.analysis.roofline import experts_touched, weights_read_bytes

    config = get_preset("mixtral-8x7b")
    ledger = parameter_ledger(config)
    assert experts_touched(config, 1) == 2 and experts_touched(config, 64) > 7.99
    one = weights_read_bytes(ledger, "bf16", decode=True, tokens=1)
    assert one == 2 * (ledger.active - ledger.lookup_params())
    assert weights_read_bytes(ledger, "bf16", decode=True) == 2 * (ledger.total - ledger.lookup_params())
