"""What a round hands the target to verify, and what proposes it.

    Proposal(tokens [B, k], lengths, probs)       the guesses acceptance.verify decides on
    Guesser: continuation(k), extend(tokens)      a sequence's free proposer (prompt lookup: NgramIndex)
    Proposer: name, free, guesser(prompt)         what SpeculativeDecoder takes (DraftProposer: a model instead)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor



@dataclass(frozen=True)
class Proposal:
    """tokens [B, k] guessed to follow each row; lengths [B] how many of them each row really
    proposes (the rest is filler; None: all k); probs [B, k, V] the distribution each token was
    drawn from (None: chosen deterministically, as a one-hot distribution)."""

    tokens: Tensor
    lengths: Tensor | None = None
    probs: Tensor | None = None

    @property
    def k(self) -> int:
        return self.tokens.shape[1]

    def valid(self) -> Tensor:
        """bool [B, k]: which tokens were proposed (not filler)."""
        B, k = self.tokens.shape
        if self.lengths is None:
            return torch.ones(B, k, dtype=torch.bool, device=self.tokens.device)
        return torch.arange(k, device=self.tokens.device)[None] < self.lengths[:, None]

    def proposed(self) -> int:
        """Tokens proposed over all rows."""
        return self.tokens.numel() if self.lengths is None else int(self.lengths.sum())

    @classmethod
    def rows(cls, rows: list[list[int]], device: torch.device | str = "cpu") -> Proposal:
        """A deterministic proposal from per-row lists of any lengths (padded with the token 0)."""
        k = max((len(r) for r in rows), default=0)
        tokens = torch.tensor([r + [0] * (k - len(r)) for r in rows], dtype=torch.long, device=device).view(len(rows), k)
        lengths = None if all(len(r) == k for r in rows) else torch.tensor([len(r) for r in rows], device=device)
        return cls(tokens, lengths)


class Guesser(Protocol):
    """A sequence's free proposer: guesses from the tokens so far, no model run."""

    def continuation(self, k: int) -> list[int]: ...

    def extend(self, tokens: list[int]) -> None: ...


class Proposer(Protocol):
    """Makes each sequence's guesser (NgramProposer, or any guessing rule); a draft model is a DraftProposer."""

    name: str
    free: bool  # proposing runs no model: the policy may score proposals it does not verify

    def guesser(self, tokens: list[int]) -> Guesser: ...
