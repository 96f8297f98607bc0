"""What speculation did in one generation: the figures `--stats` and GenerationResult report."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class SpeculativeStats:
    """Counts over one generation (a batch's rows summed for proposed/accepted). `tokens` and the
    forwards exclude the prefill and the first token it gives: they are the decode phase's."""

    method: str  # "ngram" or "draft"
    num_speculative_tokens: int  # the most tokens a round may propose (k)
    proposed: int = 0  # proposed tokens the target verified
    accepted: int = 0  # of them, those it kept
    rejections: int = 0  # verifications that rejected a proposed token (per row)
    target_forwards: int = 0  # decode forwards of the target: verifications and plain steps
    verifications: int = 0  # of them, forwards over proposals
    draft_forwards: int = 0  # forwards of the draft model
    tokens: int = 0  # tokens per row the decode forwards emitted

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def acceptance_per_token(self) -> float:
        """The chance a proposed token is kept once the ones before it were: kept / (kept + rejected),
        the `a` of `anatomy inspect --speculative K --acceptance a` (counted per row)."""
        tried = self.accepted + self.rejections
        return self.accepted / tried if tried else 0.0

    @property
    def tokens_per_forward(self) -> float:
        """Mean tokens per target decode forward (1.0: no gain; k + 1 at most)."""
        return self.tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def plain_steps(self) -> int:
        return self.target_forwards - self.verifications

    def to_dict(self) -> dict:
        return asdict(self) | {"acceptance_rate": self.acceptance_rate, "acceptance_per_token": self.acceptance_per_token,
                               "tokens_per_forward": self.tokens_per_forward}

    def summary(self) -> str:
        draft = f", {self.draft_forwards} draft forwards" if self.method == "draft" else ""
        return (f"speculative {self.method} (k <= {self.num_speculative_tokens}): {self.proposed} proposed, "
                f"{self.accepted} accepted ({self.acceptance_rate:.0%}; per token a = {self.acceptance_per_token:.2f}), "
                f"{self.tokens_per_forward:.2f} tokens per "
                f"target forward ({self.verifications} verifications, {self.plain_steps} plain steps{draft})")
