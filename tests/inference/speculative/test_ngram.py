"""Prompt lookup: the continuation of the latest earlier occurrence of the longest matching ending."""

from __future__ import annotations

import pytest
from anatomy.errors import InputError
from anatomy.inference.sampling import SamplingParams
from anatomy.inference.speculative import NgramProposer, Proposal
from anatomy.inference.speculative.ngram import NgramIndex


def test_the_longest_ending_with_an_earlier_occurrence_wins():
    #              0  1  2  3  4  5  6  7  8  9
    index = NgramIndex([1, 2, 3, 9, 7, 2, 3, 4, 5, 2], min_n=1, max_n=3)
    assert index.continuation(3) == [3, 4, 5]  # "2" last occurred at 5 (latest), followed by 3 4 5
    index.extend([3])  # ending "2 3": earlier at 1-2 and 5-6; the latest is followed by 4 5 2
    assert index.continuation(3) == [4, 5, 2]
    index.extend([9])  # "2 3 9" occurred at 1-3, the longest match: followed by 7 2 3
    assert index.continuation(3) == [7, 2, 3]


def test_the_ending_itself_is_not_an_earlier_occurrence():
    assert NgramIndex([4, 5, 6], min_n=1, max_n=3).continuation(2) == []
    assert NgramIndex([4, 5, 6], min_n=1, max_n=3).continuation(0) == []


def test_a_continuation_that_runs_into_the_ending_copies_itself_on():
    assert NgramIndex([7, 8, 7, 8], min_n=2, max_n=2).continuation(5) == [7, 8, 7, 8, 7]


def test_min_n_ignores_shorter_matches():
    assert NgramIndex([1, 2, 3, 2], min_n=2, max_n=3).continuation(2) == []
    assert NgramIndex([1, 2, 3, 2], min_n=1, max_n=3).continuation(2) == [3, 2]


def test_the_proposer_gives_each_sequence_its_own_index():
    proposer = NgramProposer(max_n=2)
    rows = [proposer.guesser([1, 2, 3, 1, 2]), proposer.guesser([9, 8])]
    assert [row.continuation(3) for row in rows] == [[3, 1, 2], []]
    for row, emitted in zip(rows, [[3, 7], [9, 8]]):
        row.extend(emitted)
    assert [row.continuation(2) for row in rows] == [[], [9, 8]]  # row 1: "9 8" seen before, then 9 8


def test_proposals_pad_rows_of_fewer_guesses():
    proposal = Proposal.rows([[3, 1, 2], []])
    assert proposal.tokens.tolist() == [[3, 1, 2], [0, 0, 0]] and proposal.lengths.tolist() == [3, 0]
    assert proposal.valid().tolist() == [[True] * 3, [False] * 3] and proposal.proposed() == 3


def test_sizes_are_checked():
    with pytest.raises(InputError, match="min_n=0, max_n=3 need 1 <= min_n <= max_n"):
        NgramProposer(min_n=0)
