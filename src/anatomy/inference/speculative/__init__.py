"""Speculative decoding: more tokens per read of the weights, the output unchanged.

At batch 1 a decode step reads every weight to produce one token. A proposer guesses the next k
tokens cheaply; the target verifies all k in one forward over k + 1 rows (reading its weights
once) and keeps the longest prefix it agrees with, plus one token of its own: greedy output is
token for token that of plain greedy decoding, and sampling keeps the target's distribution
exactly (rejection sampling).

    proposal.py   Proposal, the Proposer interface
    ngram.py      prompt lookup: continue the latest earlier occurrence of the text's ending
    draft.py      a draft model (smaller, fewer layers, cheaper weights) with the same vocabulary
    acceptance.py greedy acceptance and the rejection-sampling rule
    policy.py     adaptive k and the fallback to plain decoding
    decoder.py    the loop: propose, verify (the target Run's verify: k + 1 tokens in one forward), keep, rewind
    setup.py      what generate()'s options become: a checked Speculation
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
