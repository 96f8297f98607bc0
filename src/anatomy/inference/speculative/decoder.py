"""The speculative generation loop: propose, verify in one target forward, keep the agreed prefix.

Each round asks the policy for k; k = 0 (or no proposal) is a plain decode step, otherwise the last
token and k proposals go through the target Run's `verify` in one forward and acceptance keeps
n + 1 tokens. Rejected proposals' cache entries are never attended to and are written over. Tokens
are yielded one at a time as [B] tensors, like DecoderEngine.tokens. A batch advances together:
every row keeps the fewest proposals any row kept, so each row's output is exactly (greedy) or in
distribution (sampling) what it would be alone. Details: docs/speculative.md, "How it works".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import torch
from torch import Tensor

from anatomy.inference.engine import DecoderEngine
from anatomy.inference.sampling import SamplingParams
from anatomy.inference.speculative.acceptance import verify
from anatomy.inference.speculative.policy import AdaptiveK, FixedK
from anatomy.inference.speculative.proposal import Proposal, Proposer
from anatomy.inference.speculative.stats import SpeculativeStats


class SpeculativeDecoder:
    """`for tokens in SpeculativeDecoder(engine, proposer, k=5).tokens(prompts, params)` yields [B]
    token tensors, as DecoderEngine.tokens does; `stats` counts what speculation did."""

    def __init__(self, engine: DecoderEngine, proposer: Proposer, *, k: int, adaptive: bool = True,
                 policy: Callable[[], AdaptiveK | FixedK] | None = None) -> None:
        """`policy` makes each generation's policy (default: AdaptiveK, or FixedK(k) if not adaptive)."""
        self.engine, self.proposer, self.k = engine, proposer, k
        self.make_policy = policy or ((lambda: AdaptiveK(k, free=proposer.free)) if adaptive else (lambda: FixedK(k)))
        self.stats = SpeculativeStats(proposer.name, k)

    def tokens(self, prompts: list[list[int]], params: SamplingParams) -> Iterator[Tensor]:
        run = self.run = self.engine.start(prompts, params)
        N = params.max_new_tokens
        self.proposer.start(run)
        self.shadow: _Shadow | None = None
        self.stats = SpeculativeStats(self.proposer.name, self.k)
        self.policy = self.make_policy()

        token = run.choose(run.prefill())
        self.proposer.advance(token[:, None], 0)
        yield token
        emitted = 1
        while emitted < N:
            tokens = self._round(token, room=N - emitted - 1)  # [B, m]
            for j in range(tokens.shape[1]):
                yield tokens[:, j]
            emitted += tokens.shape[1]
            token = tokens[:, -1]

    def _round(self, token: Tensor, *, room: int) -> Tensor:
        """One target forward from `token` [B] at the run's slot -> the tokens it emits [B, m]
        (`room`: how many tokens may follow the first without passing max_new_tokens)."""
        k = min(self.policy.next_k(), room)
        start = time.perf_counter()
        proposal = self.proposer.propose(k) if k > 0 else None
        speculating = proposal is not None and proposal.k > 0
        proposed = time.perf_counter()
        if speculating:
            self.policy.draft_time((proposed - start) / proposal.k)
            tokens, accepted = self._verify(token, proposal)
        else:
            tokens, accepted = self._plain(token), 0
        self.policy.target_time(1 + (proposal.k if speculating else 0), time.perf_counter() - proposed)
        self.proposer.advance(tokens, accepted)
        self.stats.target_forwards += 1
        self.stats.tokens += tokens.shape[1]
        self.stats.draft_forwards = self.proposer.forwards
        return tokens

    def _plain(self, token: Tensor) -> Tensor:
        """A plain decode step -> [B, 1]; a free proposer's guess is scored against it meanwhile."""
        if self.proposer.free and self.shadow is None:
            guess = self.proposer.propose(self.k)
            self.shadow = _Shadow(guess) if guess.k > 0 else None
        token = self.run.choose(self.run.decode(token))
        if self.shadow is not None and (score := self.shadow.push(token.tolist())) is not None:
            self.policy.kept(*score)
            self.shadow = None
        return token[:, None]

    @torch.inference_mode()
    def _verify(self, token: Tensor, proposal: Proposal) -> tuple[Tensor, int]:
        """One forward over the last token and the proposal -> (tokens [B, n+1], n proposals kept);
        the run rewinds to after the kept ones."""
        run = self.run
        start = run.slot
        ids = torch.cat([token[:, None], proposal.tokens], dim=1)  # [B, k+1]
        tokens, accepted = verify(run.verify(ids), proposal, run.params, run.generator, run.penalties)
        n = int(accepted.min())
        tokens = tokens[:, :n + 1]
        run.rewind(start + n + 1)  # the token and the n kept proposals are in the cache; the new token is not
        run.observe(tokens)
        self.policy.kept(proposal.k, n)
        self.shadow = None
        self.stats.verifications += 1
        self.stats.proposed += proposal.proposed()
        self.stats.accepted += n * tokens.shape[0]
        self.stats.rejections += tokens.shape[0] if n < proposal.k else 0
        return tokens, n


class _Shadow:
    """A free proposal that was not verified (plain decoding): scored against the tokens the target
    emits next, so that the policy knows what speculating would have gained."""

    def __init__(self, proposal: Proposal) -> None:
        self.rows = proposal.tokens.tolist()
        self.lengths = proposal.lengths.tolist() if proposal.lengths is not None else [proposal.k] * len(self.rows)
        self.k, self.position = proposal.k, 0

    def push(self, emitted: list[int]) -> tuple[int, int] | None:
        """The next emitted token of each row -> (tried, kept) once the proposal is decided, else None."""
        j = self.position
        if all(j < n and row[j] == t for row, n, t in zip(self.rows, self.lengths, emitted)):
            self.position += 1
            return (self.k, self.k) if self.position == self.k else None
        return self.k, j
