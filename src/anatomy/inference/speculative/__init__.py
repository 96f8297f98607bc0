"""Speculative decoding: more tokens per read of the weights, the output unchanged.

A proposer guesses the next k tokens cheaply; the target verifies all k in one forward and keeps
the longest prefix it agrees with plus one token of its own (greedy output equals plain greedy
decoding; sampling keeps the target's distribution). rounds.py: a sequence's rounds, the one driver (the
serving loop runs them; decoder.py, offline generation, is a client of that loop); proposal.py, ngram.py,
draft.py: what proposes; acceptance.py: greedy and rejection sampling; policy.py: k per round;
setup.py: generate()'s options as a checked Speculation.
"""

from anatomy.inference.speculative.decoder import SpeculativeDecoder
from anatomy.inference.speculative.draft import DraftProposer, first_layers
from anatomy.inference.speculative.ngram import NgramProposer
from anatomy.inference.speculative.proposal import Proposal, Proposer
from anatomy.inference.speculative.setup import Speculation
from anatomy.inference.speculative.stats import SpeculativeStats

__all__ = [
           "DraftProposer",
           "NgramProposer",
           "Proposal",
           "Proposer",
           "Speculation",
           "SpeculativeDecoder",
           "SpeculativeStats",
           "first_layers",
]
