"""What a proposer hands the target to verify, and the interface every proposer has.

    proposer.start(run)                          before the first token: the target's Run (its batch, sampling
                                                 parameters and generator); a draft model prefills the prompts
    proposal = proposer.propose(k)               up to k guessed tokens per row
    proposer.advance(emitted [B, m], n)          the target emitted m tokens per row: the proposal's first n,
                                                 then one of its own (a draft model rewinds to that)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from anatomy.inference.engine import Run


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


class Proposer(Protocol):
    """Guesses the next tokens of every row of one generation (one object per generation)."""

    name: str
    free: bool  # proposing runs no model: the policy may score proposals it does not verify
    forwards: int  # model forwards run so far (a draft model's)

    def start(self, run: Run) -> None: ...

    def propose(self, k: int) -> Proposal: ...

    def advance(self, emitted: Tensor, accepted: int) -> None: ...
