"""Adaptive k: the k with the most expected tokens per second; plain steps when none pays; probes
and shadow scoring to come back."""

from __future__ import annotations

import pytest

from anatomy.inference.speculative.policy import PROBE_FIRST, AdaptiveK, expected_tokens


def test_expected_tokens_per_round():
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)  # 1 + .5 + .25


def timed(policy: AdaptiveK, per_row: float, base: float = 1.0) -> AdaptiveK:
    """Target forwards measured at 1..k_max+1 rows: base + per_row * (rows - 1) seconds."""
    for rows in range(1, policy.k_max + 2):
        for _ in range(2):
            policy.target_time(rows, base + per_row * (rows - 1))
    return policy


def test_high_acceptance_and_flat_cost_propose_the_most():
    policy = timed(AdaptiveK(6, free=True), per_row=0.0)
    for _ in range(10):
        policy.kept(6, 6)
    assert policy.acceptance > 0.95 and policy.next_k() == 6


def test_k_shrinks_as_acceptance_falls_and_plain_steps_take_over():
    policy = timed(AdaptiveK(8, free=True), per_row=0.1)
    ks = []
    for accepted in (8, 8, 4, 2, 1) + (0,) * 10:
        policy.kept(8, accepted)
        ks.append(policy.next_k())
    assert ks[0] >= 6 and ks == sorted(ks, reverse=True) and ks[-1] == 0
    assert policy.rate(0) > policy.rate(1)  # the fallback: a plain step beats any speculation


def test_a_draft_costs_its_steps():
    policy = timed(AdaptiveK(5, free=False), per_row=0.0)
    policy.kept(5, 3)
    assert policy.next_k() > 0
    policy.draft_time(0.9)  # a draft almost as slow as the target: never worth it at this acceptance
    assert policy.next_k() == 0


def test_a_failing_draft_is_probed_after_8_then_16_plain_steps():
    policy = timed(AdaptiveK(4, free=False), per_row=0.2)
    policy.draft_time(0.3)
    for _ in range(10):
        policy.kept(4, 0)
    ks = [policy.next_k() for _ in range(3 * PROBE_FIRST)]
    probes = [i for i, k in enumerate(ks) if k > 0]
    assert probes == [PROBE_FIRST - 1, 3 * PROBE_FIRST - 1]


def test_a_free_proposer_is_never_probed():
    policy = timed(AdaptiveK(4, free=True), per_row=0.5)
    for _ in range(10):
        policy.kept(4, 0)
    assert all(policy.next_k() == 0 for _ in range(100))
    for _ in range(5):  # scored guesses that would have been kept bring speculation back
        policy.kept(4, 4)
    assert policy.next_k() > 0


def test_times_are_medians_and_unmeasured_row_counts_are_read_off_a_line():
    policy = AdaptiveK(8, free=True)
    assert policy.forward_s(3) == 1.0  # nothing measured: flat
    policy.target_time(3, 3.0)
    assert policy.forward_s(3) == 1.0  # one measurement is not enough
    for seconds in (3.0, 50.0, 3.2):  # an outlier
        policy.target_time(3, seconds)
    assert policy.forward_s(3) == pytest.approx(3.1)
    assert policy.forward_s(1) == pytest.approx(3.1)  # a plain step: no dearer than the cheapest known
    policy.target_time(5, 4.1)
    policy.target_time(5, 4.1)
    assert policy.forward_s(7) == pytest.approx(5.1)  # 3.1 + 0.5 per row
    assert policy.forward_s(1) == pytest.approx(3.1)  # never below the cheapest measured
