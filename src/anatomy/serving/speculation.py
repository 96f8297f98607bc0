"""Speculative decoding per served sequence: proposals verified in the loop's steps.

    before a step     each decoding sequence that speculates proposes up to k tokens: "ngram", its
                      n-gram index over prompt + output (prompt lookup); "draft", k slots that a draft
                      model fills once the step is scheduled (serving/drafting.py); the scheduler gives
                      it 1 + len(draft) slots if blocks allow
    the step          its chunk is [last token, d_1..d_k] at positions computed..computed+k, logits of
                      all k + 1 (one forward for every sequence of the step, as the offline verifier)
    after             the target keeps d_1..d_n and adds its own token (greedy: argmax; sampling: the
                      rejection rule of inference/speculative/acceptance.py), so every sequence's output
                      is what plain serving gives (greedy) or is distributed as it (sampling)

A sequence whose guesses keep failing backs off (policy.BackOff): after MISSES rounds in a row that kept
nothing it proposes again only after 1, 2, 4, ... plain steps, so open-ended text costs few wasted rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from anatomy.errors import InputError
from anatomy.inference.engine import DecoderEngine
from anatomy.inference.sampling import Penalties, SamplingParams
from anatomy.inference.speculative.acceptance import verify
from anatomy.inference.speculative.ngram import NgramIndex
from anatomy.inference.speculative.policy import BackOff
from anatomy.inference.speculative.proposal import Proposal

MISSES = 2  # rounds in a row that keep nothing before a sequence backs off
MAX_BACKOFF = 64  # plain steps at most between two tries
METHODS = ("ngram", "draft")
DRAFTED = -1  # a slot of a draft model's proposal, reserved before the step and filled once it is scheduled


@dataclass(frozen=True)
class ServedSpeculation:
    """How the server speculates: "ngram", prompt lookup with n-grams of `ngram` = (min_n, max_n)
    tokens, or "draft", the greedy tokens of the `draft` engine's model (one vocabulary with the
    target's); at most `num_speculative_tokens` per round (a request may ask for fewer, or 0 for none)."""

    method: str = "ngram"
    num_speculative_tokens: int = 5
    ngram: tuple[int, int] = (1, 3)
    draft: DecoderEngine | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise InputError(f"served speculation method {self.method!r} is not one of {', '.join(map(repr, METHODS))}")
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InputError(f"num_speculative_tokens={k!r} must be an integer >= 1")
        if (self.method == "draft") != (self.draft is not None):
            raise InputError("served speculation 'draft' needs a draft model, and only it takes one "
                             f"(method={self.method!r}, draft={'given' if self.draft is not None else 'none'})")

    def for_sequence(self, tokens: list[int], params: SamplingParams, k: int | None = None,
                     min_k: int = 0) -> SequenceSpeculation | None:
        """The speculation state of one sequence proposing at most k tokens (default: the server's) and
        verifying a proposal of at least min_k (None: it does not speculate, k = 0)."""
        k = self.num_speculative_tokens if k is None else min(k, self.num_speculative_tokens)
        if k <= 0:
            return None
        index = NgramIndex(tokens, min_n=self.ngram[0], max_n=self.ngram[1]) if self.method == "ngram" else None
        return SequenceSpeculation(index, k, min_k)


class SequenceSpeculation:
    """One sequence's proposer state (its n-gram index, or None: a draft model's proposals, of which
    the draft's KV cache holds the sequence's first `computed` tokens) and back-off state."""

    def __init__(self, index: NgramIndex | None, k: int, min_k: int = 0) -> None:
        self.index, self.k, self.min_k = index, k, max(min_k, 1)
        self.policy = BackOff(k, misses=MISSES, most=MAX_BACKOFF)
        self.proposed = self.accepted = self.rounds = 0
        self.computed = self.base = 0  # a draft model's: tokens in its cache; the sequence's length when it drafted
        self.preemptions = 0  # the sequence's preemptions when the draft's cache was last written for it

    def propose(self, room: int) -> list[int]:
        """Up to min(k, room) guessed next tokens, or for a draft model as many DRAFTED slots ([] while
        backing off, without a match, or with fewer than min_k)."""
        k = self.policy.next_k()  # 0 while backing off
        n = min(k, room) if room > 0 else 0
        if n == 0:
            return []
        draft = self.index.continuation(n) if self.index is not None else [DRAFTED] * n
        return draft if len(draft) >= self.min_k else []

    def observe(self, tokens: list[int]) -> None:
        """Tokens appended to the sequence (prompt lookup indexes them)."""
        if self.index is not None:
            self.index.extend(tokens)

    def kept(self, proposed: int, accepted: int) -> None:
        """A round verified `proposed` tokens and kept `accepted`: a draft model's cache is right up to
        the sequence as it was plus the kept ones (its later guesses are written over next time)."""
        self.rounds, self.proposed, self.accepted = self.rounds + 1, self.proposed + proposed, self.accepted + accepted
        self.computed = min(self.computed, self.base + accepted)
        self.policy.kept(proposed, accepted)


def accept(logits: Tensor, draft: list[int], params: SamplingParams, generator: torch.Generator | None,
           penalties: Penalties | None = None) -> tuple[list[int], int]:
    """logits [k+1, V] of [last, d_1..d_k] -> (the tokens to emit: d_1..d_n and the target's own, n), each
    position under the sequence's penalties as its own decode step would be (acceptance.verify)."""
    proposal = Proposal(torch.tensor([draft], device=logits.device))
    tokens, kept = verify(logits[None], proposal, params, generator, penalties)
    n = int(kept[0])
    return tokens[0, :n + 1].tolist(), n
