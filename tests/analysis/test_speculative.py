"""The speculative-decoding prediction against hand arithmetic: on a machine whose compute is free,
a round costs only the bytes it reads, so the speedup is E(a, k) x (bytes of a plain step) /
(bytes of a verification), with E the geometric sum 1 + a + ... + a^k."""

from __future__ import annotations

import pytest

from anatomy import get_preset
from anatomy.analysis.hardware import Hardware
from anatomy.analysis.speculative import SpeculativeOptions, speculative_report

CONFIG = get_preset("llama-7b", n_layers=2, d_model=256, n_heads=4, d_ff=512, vocab_size=1000, max_seq_len=512)
FREE_COMPUTE = Hardware("bytes-only", {"any": 1e30}, bandwidth=1e9)
SLOW_COMPUTE = Hardware("flops-only", {"any": 1e6}, bandwidth=1e30)
COMMON = dict(context=100, weight_dtype="f32", kv_dtype="f32", compute_dtype="f32")


def report(options: SpeculativeOptions, hardware: Hardware = FREE_COMPUTE) -> dict:
    return speculative_report(CONFIG, hardware, options, **COMMON)


def test_memory_bound_ngram_speedup_is_tokens_per_round_times_the_byte_ratio():
    r = report(SpeculativeOptions(k=4, acceptance=0.8))
    tokens = 1 + 0.8 + 0.8 ** 2 + 0.8 ** 3 + 0.8 ** 4
    kv_per_token = 2 * CONFIG.n_layers * CONFIG.n_kv_heads * CONFIG.head_dim * 4
    assert r["expected_tokens_per_forward"] == pytest.approx(tokens)
    assert r["expected_acceptance_rate"] == pytest.approx((tokens - 1) / 4)
    assert r["verify"]["bytes"] - r["step"]["bytes"] == 4 * kv_per_token  # k more tokens' K/V written
    assert r["speedup"] == pytest.approx(tokens * r["step"]["bytes"] / r["verify"]["bytes"])
    assert r["target_weight_bytes_per_token"] == pytest.approx(r["plain_weight_bytes_per_token"] / tokens)


def test_compute_bound_verification_never_pays():
    """When every FLOP counts, k + 1 rows cost k + 1 steps, and a round yields fewer tokens than that
    unless every guess is right."""
    r = report(SpeculativeOptions(k=4, acceptance=0.9), SLOW_COMPUTE)
    assert r["speedup"] < 1.0 and r["break_even_acceptance"] == pytest.approx(1.0)


def test_a_draft_costs_its_steps():
    free = report(SpeculativeOptions(k=4, acceptance=0.8))
    same = report(SpeculativeOptions(k=4, acceptance=0.8, draft=CONFIG, draft_name="itself"))
    assert same["draft_step"]["bytes"] == same["step"]["bytes"]  # the draft is the model itself
    assert same["speedup"] == pytest.approx(free["expected_tokens_per_forward"] * same["step"]["time_s"]
                                            / (same["verify"]["time_s"] + 4 * same["draft_step"]["time_s"]))
    assert same["speedup"] < 1.0  # a draft as dear as the target cannot pay
    int4 = report(SpeculativeOptions(k=4, acceptance=0.8, draft=CONFIG, draft_dtype="int4"))
    assert same["speedup"] < int4["speedup"] < free["speedup"]


def test_break_even_and_best_k():
    r = report(SpeculativeOptions(k=4, acceptance=0.8))
    a = r["break_even_acceptance"]
    at = report(SpeculativeOptions(k=4, acceptance=a))
    assert at["speedup"] == pytest.approx(1.0, abs=1e-6)
    assert r["best_speedup"] >= r["speedup"] and 1 <= r["best_k"] <= 32
