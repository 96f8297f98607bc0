"""Speculative rounds per sequence, the one driver: offline generation and the server run these in the loop.

    before a step     a decoding sequence asks its policy for k and proposes up to k tokens: "ngram", its
                      guesser over prompt + output (prompt lookup); "draft", k DRAFTED slots that the loop's
                      draft model fills once the step is scheduled (serving/drafting.py)
    the step          its chunk is [last token, d_1..d_k], logits of all k + 1, in the step's one forward
    after             `accept`: the target keeps d_1..d_n and adds its own token (acceptance.verify), so the
                      output is plain decoding's (greedy) or distributed as it (sampling)

The server's policy backs off after rounds that keep nothing (policy.BackOff); generation's picks k from
measured acceptance and step times (AdaptiveK). Details: docs/speculative.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from anatomy.errors import InputError
from anatomy.inference.engine import DecoderEngine
from anatomy.inference.sampling import Penalties, SamplingParams
from anatomy.inference.speculative.acceptance import verify
from anatomy.inference.speculative.ngram import NgramIndex
from anatomy.inference.speculative.policy import AdaptiveK, BackOff, FixedK
from anatomy.inference.speculative.proposal import Guesser, Proposal

MISSES = 2  # rounds in a row that keep nothing before a sequence backs off
MAX_BACKOFF = 64  # plain steps at most between two tries
METHODS = ("ngram", "draft")
DRAFTED = -1  # a slot of a draft model's proposal, reserved before the step and filled once it is scheduled


Policy = AdaptiveK | BackOff | FixedK


@dataclass(frozen=True)
class ServedSpeculation:
    """How the loop speculates: "ngram", prompt lookup with n-grams of `ngram` = (min_n, max_n)
    tokens, or "draft", the tokens of the `draft` engine's model (one vocabulary with the target's),
    drawn as the sequence samples; at most `num_speculative_tokens` per round (a request may ask for
    fewer, or 0 for none). `policy` makes each sequence's policy from its k (default: BackOff);
    `guesser` each sequence's free proposer from its prompt (default: an NgramIndex)."""

    method: str = "ngram"
    num_speculative_tokens: int = 5
    ngram: tuple[int, int] = (1, 3)
    draft: DecoderEngine | None = None
    policy: Callable[[int], Policy] | None = None
    guesser: Callable[[list[int]], Guesser] | None = None

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
        guesser = None
        if self.method == "ngram":
            guesser = self.guesser(tokens) if self.guesser else NgramIndex(tokens, min_n=self.ngram[0],
                                                                           max_n=self.ngram[1])
        policy = self.policy(k) if self.policy else BackOff(k, misses=MISSES, most=MAX_BACKOFF)
        return SequenceSpeculation(guesser, k, min_k, policy=policy)


class SequenceSpeculation:
    """One sequence's proposer state (its guesser, or None: a draft model's proposals, of which the
    draft's KV cache holds the sequence's first `computed` tokens), its policy and its counts."""

    def __init__(self, guesser: Guesser | None, k: int, min_k: int = 0, *, policy: Policy | None = None) -> None:
        self.index, self.k, self.min_k = guesser, k, max(min_k, 1)
        self.policy = policy or BackOff(k, misses=MISSES, most=MAX_BACKOFF)
        self.proposed = self.accepted = self.rounds = self.rejections = 0
        self.computed = self.base = 0  # a draft model's: tokens in its cache; the sequence's length when it drafted
        self.preemptions = 0  # the sequence's preemptions when the draft's cache was last written for it
        self.probs: list[Tensor] = []  # a sampled draft's: the distribution [V] each drafted token came from
        self.shadow: list[int] | None = None  # a guess not verified (plain step), scored against what comes
        self.seen = 0  # of the shadow, tokens matched so far

    def propose(self, room: int) -> list[int]:
        """Up to min(k, room) guessed next tokens, or for a draft model as many DRAFTED slots ([] while
        the policy decodes plainly, without a match, or with fewer than min_k)."""
        k = self.policy.next_k()  # 0: a plain step
        n = min(k, room) if room > 0 else 0
        self.probs = []
        if n == 0:
            self._shade()
            return []
        draft = self.index.continuation(n) if self.index is not None else [DRAFTED] * n
        return draft if len(draft) >= self.min_k else []

    def _shade(self) -> None:
        """An adaptive policy that pays nothing to guess (a free guesser) scores the guess it did not
        verify against the tokens that follow, to learn whether speculating would pay again."""
        if self.shadow is None and self.index is not None and getattr(self.policy, "free", False):
            guess = self.index.continuation(self.k)
            self.shadow, self.seen = (guess, 0) if guess else (None, 0)

    def observe(self, tokens: list[int]) -> None:
        """Tokens appended to the sequence (prompt lookup indexes them; a shadow guess is scored)."""
        if self.index is not None:
            self.index.extend(tokens)
        for token in tokens if self.shadow is not None else ():
            if token != self.shadow[self.seen]:
                self.policy.kept(len(self.shadow), self.seen)
                self.shadow = None
                break
            self.seen += 1
            if self.seen == len(self.shadow):
                self.policy.kept(self.seen, self.seen)
                self.shadow = None
                break

    def kept(self, proposed: int, accepted: int) -> None:
        """A round verified `proposed` tokens and kept `accepted`: a draft model's cache is right up to
        the sequence as it was plus the kept ones (its later guesses are written over next time)."""
        self.rounds, self.proposed, self.accepted = self.rounds + 1, self.proposed + proposed, self.accepted + accepted
        self.rejections += accepted < proposed
        self.computed = min(self.computed, self.base + accepted)
        self.shadow = None
        self.policy.kept(proposed, accepted)

    def timed(self, rows: int, seconds: float) -> None:
        """A target forward that ran `rows` of this sequence's tokens took `seconds` (the policy's estimate)."""
        self.policy.target_time(rows, seconds)


def accept(logits: Tensor, draft: list[int], params: SamplingParams, generator: torch.Generator | None,
           penalties: Penalties | None = None, probs: list[Tensor] | None = None) -> tuple[list[int], int]:
    """logits [k+1, V] of [last, d_1..d_k] -> (the tokens to emit: d_1..d_n and the target's own, n), each
    position under the sequence's penalties as its own decode step would be (acceptance.verify); `probs`:
    the distributions [V] the draft drew d_1..d_k from (None or empty: chosen deterministically)."""
    q = torch.stack(probs[:len(draft)])[None] if probs else None
    proposal = Proposal(torch.tensor([draft], device=logits.device), None, q)
    tokens, kept = verify(logits[None], proposal, params, generator, penalties)
    n = int(kept[0])
    return tokens[0, :n + 1].tolist(), n
