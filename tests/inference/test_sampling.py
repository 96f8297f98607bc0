"""Sampling filters keep exactly the right tokens on hand-made distributions; seeds reproduce."""

from __future__ import annotations

import math

import pytest
import torch

from anatomy.errors import InputError
from anatomy.inference.sampling import (
    SamplingParams, apply_repetition_penalty, filter_min_p, filter_top_k, filter_top_p, make_generator,
    next_tokens)

PROBS = torch.tensor([[0.05, 0.40, 0.10, 0.25, 0.20]])  # sorted: 1 (.40), 3 (.25), 4 (.20), 2 (.10), 0 (.05)
LOGITS = PROBS.log()


def kept(logits: torch.Tensor) -> set[int]:
    return set(torch.nonzero(torch.isfinite(logits[0])).flatten().tolist())


@pytest.mark.parametrize("k, expected", [(1, {1}), (2, {1, 3}), (3, {1, 3, 4}), (0, {0, 1, 2, 3, 4}),
                                         (9, {0, 1, 2, 3, 4})])
def test_top_k(k, expected):
    assert kept(filter_top_k(LOGITS, k)) == expected


@pytest.mark.parametrize("p, expected", [
    (0.30, {1}),  # 0.40 alone reaches 0.30
    (0.39, {1}),
    (0.41, {1, 3}),  # 0.65
    (0.65, {1, 3}),
    (0.66, {1, 3, 4}),  # 0.85
    (0.90, {1, 3, 4, 2}),  # 0.95
    (1.00, {0, 1, 2, 3, 4}),
])
def test_top_p_keeps_the_smallest_set_reaching_p(p, expected):
    assert kept(filter_top_p(LOGITS, p)) == expected


@pytest.mark.parametrize("p, expected", [
    (0.45, {1, 3, 4}),  # threshold 0.18
    (0.6, {1, 3}),  # threshold 0.24
    (0.2, {1, 3, 4, 2}),  # threshold 0.08
    (1.0, {1}),
])
def test_min_p_keeps_tokens_above_a_fraction_of_the_top(p, expected):
    assert kept(filter_min_p(LOGITS, p)) == expected


def test_filters_keep_the_relative_probabilities_of_survivors():
    probs = filter_top_k(LOGITS, 3).softmax(-1)[0]
    assert probs[1].item() == pytest.approx(0.40 / 0.85) and probs[4].item() == pytest.approx(0.20 / 0.85)


def test_repetition_penalty_lowers_seen_tokens_of_either_sign():
    logits = torch.tensor([[2.0, -2.0, 1.0]])
    seen = torch.tensor([[True, True, False]])
    assert apply_repetition_penalty(logits, seen, 2.0).tolist() == [[1.0, -4.0, 1.0]]


def test_greedy_is_argmax_and_temperature_zero():
    params = SamplingParams()
    assert params.greedy and next_tokens(LOGITS, params).tolist() == [1]


def test_seeded_sampling_is_reproducible_and_follows_the_distribution():
    params = SamplingParams(temperature=1.0, seed=7)
    logits = LOGITS.expand(4000, 5)
    a = next_tokens(logits, params, generator=make_generator(7))
    b = next_tokens(logits, params, generator=make_generator(7))
    c = next_tokens(logits, params, generator=make_generator(8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    freq = torch.bincount(a, minlength=5).float() / 4000
    assert torch.allclose(freq, PROBS[0], atol=0.03)


def test_sampling_draws_only_kept_tokens():
    params = SamplingParams(temperature=1.5, top_k=3, top_p=0.7, seed=0)
    drawn = next_tokens(LOGITS.expand(2000, 5), params, generator=make_generator(0))
    # top-k keeps 1, 3, 4; at temperature 1.5 they have probabilities .423, .310, .267, and the
    # first two reach 0.7, so top-p drops token 4
    assert set(drawn.tolist()) == {1, 3}


def test_temperature_sharpens():
    cold = SamplingParams(temperature=0.05)
    drawn = next_tokens(LOGITS.expand(500, 5), cold, generator=make_generator(0))
    assert (drawn == 1).float().mean() > 0.99


@pytest.mark.parametrize("field, value", [
    ("temperature", -0.1), ("temperature", math.nan), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -1),
    ("min_p", 1.5), ("repetition_penalty", 0.0), ("max_new_tokens", 0), ("stop", [""]), ("stop", None),
    ("temperature", "hot"), ("top_k", 2.5), ("max_new_tokens", True), ("stop_ids", ["a"]), ("stop_ids", 3.5),
    ("seed", 2 ** 70), ("seed", "42"),
])
def test_bad_values_are_input_errors_naming_the_field(field, value):
    with pytest.raises(InputError, match=field if field != "stop" else "stop strings"):
        SamplingParams(**{field: value})


def test_presence_and_frequency_penalties_follow_openais_formula():
    from anatomy.inference.sampling import apply_presence_frequency

    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    counts = torch.tensor([[0, 1, 3, 0]])
    out = apply_presence_frequency(logits, counts, presence=0.5, frequency=0.25)
    assert out.tolist() == [[1.0, 2.0 - 0.25 - 0.5, 3.0 - 0.75 - 0.5, 4.0]]
    for name in ("presence_penalty", "frequency_penalty"):
        with pytest.raises(InputError, match=rf"{name}=2.5 must be in \[-2, 2\]"):
            SamplingParams(**{name: 2.5})


def test_token_logprobs_are_the_log_softmax():
    from anatomy.inference.sampling import token_logprobs

    logits = torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]])
    chosen, top, ids = token_logprobs(logits, torch.tensor([0, 0]), top=2)
    expected = logits.log_softmax(-1)
    assert torch.allclose(chosen, expected[[0, 1], [0, 0]])
    assert ids.tolist() == [[2, 1], [0, 1]] and torch.allclose(top, expected.gather(1, ids))
    assert token_logprobs(logits, torch.tensor([0, 0]))[1].shape == (2, 0)


def test_penalties_keep_each_rows_prompt_and_output_tokens():
    """A run's rows and a served sequence keep one Penalties: seen = the row's prompt and output tokens,
    counts = how often each output token came (Python sets and counters as the reference)."""
    from collections import Counter

    from anatomy.inference.sampling import Penalties

    prompts, outputs = [[5, 9, 5], [1]], [[9, 2, 2], [7, 1, 7]]
    both = SamplingParams(repetition_penalty=1.3, presence_penalty=0.5)
    penalties = Penalties.of(prompts, both, vocab=12)
    for step in range(3):
        penalties.observe(torch.tensor([[row[step]] for row in outputs]))
    for row, (prompt, output) in enumerate(zip(prompts, outputs)):
        assert set(penalties.seen[row].nonzero().flatten().tolist()) == set(prompt) | set(output)
        assert {i: c for i, c in enumerate(penalties.counts[row].tolist()) if c} == Counter(output)
    assert Penalties.of(prompts, SamplingParams(), vocab=12).none
    assert Penalties.of(prompts, SamplingParams(frequency_penalty=0.1), vocab=12).seen is None


def test_greedy_is_argmax_ties_and_nan_included():
    """greedy (torch.max's indices) picks argmax's token: the first of equal logits, a NaN as the largest."""
    from anatomy.inference.sampling import greedy

    x = torch.randn(3, 5, 4099, generator=torch.Generator().manual_seed(0))
    x[0, 0, [9, 4000]] = 50.0  # a tie: the first wins
    x[1, 1, :] = 2.0  # every logit equal
    x[2, 2, 77] = float("nan")
    for t in (x, x.bfloat16(), x[:, 0]):
        assert torch.equal(greedy(t), t.argmax(dim=-1))
    assert greedy(x)[0, 0] == 9 and greedy(x)[1, 1] == 0 and greedy(x)[2, 2] == 77
