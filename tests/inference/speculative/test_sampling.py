"""Speculative sampling through the whole loop on hand-set Markov-chain models: the tokens it emits
follow the target's distribution exactly (a chi-square test over all 3-token continuations), with
a draft model that disagrees with the target and with n-gram proposals, in batches of 4 rows
(each row keeps the fewest proposals any row kept)."""

from __future__ import annotations

import itertools

import pytest
import torch

from anatomy.inference.engine import DecoderEngine
from anatomy.inference.sampling import SamplingParams
from anatomy.inference.speculative import DraftProposer, NgramProposer, SpeculativeDecoder

from .conftest import markov_decoder
from .test_acceptance import P_VALUE, chi_square_p

TARGET = [[.1, .6, .3], [.5, .2, .3], [.25, .25, .5]]
DRAFT = [[.6, .2, .2], [.1, .1, .8], [.3, .6, .1]]
PROMPT = [0, 1, 2, 0, 1, 2, 0]  # n-grams that recur: the n-gram proposer always has a guess
ROWS, RUNS = 4, 800


def continuations(chain: list[list[float]], last: int) -> torch.Tensor:
    """Probabilities [27] of the 2nd-4th new tokens (itertools.product order), the 1st summed out:
    those are the tokens a round of k = 2 proposals emits after the prefill's token."""
    out = []
    for seq in itertools.product(range(3), repeat=3):
        total = 0.0
        for first in range(3):
            p, prev = chain[last][first], first
            for t in seq:
                p, prev = p * chain[prev][t], t
            total += p
        out.append(total)
    return torch.tensor(out, dtype=torch.float64)


@pytest.fixture
def one_thread():
    """Tiny ops on a loaded 2-core machine are 20x faster on one thread (no thread wake-ups)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_the_markov_model_is_its_chain():
    probs = markov_decoder(TARGET)(torch.tensor([[2, 0, 1]])).softmax(-1)[0].double()
    torch.testing.assert_close(probs, torch.tensor([TARGET[2], TARGET[0], TARGET[1]], dtype=torch.float64),
                               atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_speculative_sampling_follows_the_target_distribution(method, one_thread):
    """3,200 continuations (800 batches of 4 rows) with k = 2 proposals every round: chi-square of the
    27 possible 2nd-4th tokens against the target chain, p > 1e-4 (seeded); the draft's own chain fails."""
    engine = DecoderEngine(markov_decoder(TARGET))
    proposer = DraftProposer(DecoderEngine(markov_decoder(DRAFT))) if method == "draft" else NgramProposer()
    decoder = SpeculativeDecoder(engine, proposer, k=2, adaptive=False)
    counts = torch.zeros(27, dtype=torch.float64)
    proposed = accepted = 0
    for run in range(RUNS):
        params = SamplingParams(max_new_tokens=4, temperature=1.0, seed=run)
        out = torch.stack(list(decoder.tokens([PROMPT] * ROWS, params)), dim=1)  # [ROWS, 4]
        counts += torch.bincount(out[:, 1] * 9 + out[:, 2] * 3 + out[:, 3], minlength=27).double()
        proposed, accepted = proposed + decoder.stats.proposed, accepted + decoder.stats.accepted
    assert 0 < accepted < proposed  # rounds kept some proposals and rejected others
    assert chi_square_p(counts, continuations(TARGET, PROMPT[-1])) > P_VALUE
    assert chi_square_p(counts, continuations(DRAFT, PROMPT[-1])) < P_VALUE
