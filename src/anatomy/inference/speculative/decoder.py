"""The speculative generation loop: propose, verify in one target forward, keep the agreed prefix.

    prefill (target; a draft model prefills too) -> first token
    each round: k = policy.next_k()
        k = 0 or nothing proposed: a plain decode step, one token
        else: ids [B, k+1] = last token + proposal at slots s..s+k -> logits [B, k+1, V] (one forward)
              -> acceptance keeps n proposals and adds the target's own token: n + 1 tokens, slot s + n + 1

Rejected proposals leave keys and values in the cache beyond the new write position; they are
never attended to (a query sees only slots up to its own) and the next round writes over them.
The tokens are yielded one at a time as [B] tensors, like DecoderEngine.tokens, so streaming, stop
strings and the step clock work unchanged.

A batch advances together (one write position for all rows, as in the engine): every row keeps
the fewest proposals any row kept (n = min over rows), followed by its own token at that position
— for greedy the target's argmax, for sampling the outcome of its own acceptance test there, which
is distributed as the target's distribution whether that test kept or rejected. Each row's output
is therefore exactly what it would be alone (greedy), or distributed as it would be (sampling);
a batch gains only as much as its least predictable row.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import torch
from torch import Tensor

from anatomy.inference.engine import DecoderEngine
from anatomy.inference.sampling import SamplingParams, make_generator, penalized, sampling_probs
from anatomy.inference.speculative.acceptance import accept_greedy, accept_sampled
from anatomy.inference.speculative.forward import span_logits
from anatomy.inference.speculative.policy import AdaptiveK, FixedK
from anatomy.inference.speculative.proposal import Proposal, Proposer
from anatomy.inference.speculative.stats import SpeculativeStats
from anatomy.inference.steps import DecodeSteps, PaddedBatch


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
        e = self.engine
        config = e.model.config
        batch = PaddedBatch.of(prompts, pad_id=config.pad_token_id or 0, device=e.device)
        B, P = batch.ids.shape
        N = params.max_new_tokens
        self.cache = e.last_cache = e._cache_for(B, P + N)
        self.steps = DecodeSteps(e.model.stack, batch, max_len=self.cache.max_len, dtype=e.branch_dtype)
        self.params, self.generator = params, make_generator(params.seed, e.device)
        self.seen = e._seen(batch) if params.repetition_penalty != 1.0 else None
        self.proposer.start(batch, params, self.generator)
        self.shadow: _Shadow | None = None
        self.stats = SpeculativeStats(self.proposer.name, self.k)
        self.policy = self.make_policy()

        token = e._choose(e._prefill(batch, self.cache), params, self.seen, self.generator)
        self.proposer.advance(token[:, None], 0)
        yield token
        emitted = 1
        while emitted < N:
            tokens = self._round(token, slot=P + emitted - 1, room=N - emitted - 1)  # [B, m]
            for j in range(tokens.shape[1]):
                yield tokens[:, j]
            emitted += tokens.shape[1]
            token = tokens[:, -1]

    def _round(self, token: Tensor, *, slot: int, room: int) -> Tensor:
        """One target forward from `token` [B] at cache slot `slot` -> the tokens it emits [B, m]
        (`room`: how many tokens may follow the first without passing max_new_tokens)."""
        k = min(self.policy.next_k(), room)
        start = time.perf_counter()
        proposal = self.proposer.propose(k) if k > 0 else None
        speculating = proposal is not None and proposal.k > 0
        proposed = time.perf_counter()
        if speculating:
            self.policy.draft_time((proposed - start) / proposal.k)
            tokens, accepted = self._verify(token, proposal, slot)
        else:
            tokens, accepted = self._plain(token, slot), 0
        self.policy.target_time(1 + (proposal.k if speculating else 0), time.perf_counter() - proposed)
        self.proposer.advance(tokens, accepted)
        self.stats.target_forwards += 1
        self.stats.tokens += tokens.shape[1]
        self.stats.draft_forwards = self.proposer.forwards
        return tokens

    def _plain(self, token: Tensor, slot: int) -> Tensor:
        """A plain decode step -> [B, 1]; a free proposer's guess is scored against it meanwhile."""
        e = self.engine
        if self.proposer.free and self.shadow is None:
            guess = self.proposer.propose(self.k)
            self.shadow = _Shadow(guess) if guess.k > 0 else None
        logits = e._decode(token, torch.tensor([slot], device=token.device), self.steps, self.cache)
        token = e._choose(logits, self.params, self.seen, self.generator)
        if self.shadow is not None and (score := self.shadow.push(token.tolist())) is not None:
            self.policy.kept(*score)
            self.shadow = None
        return token[:, None]

    @torch.inference_mode()
    def _verify(self, token: Tensor, proposal: Proposal, slot: int) -> tuple[Tensor, int]:
        """One forward over the last token and the proposal -> (tokens [B, n+1], n proposals kept)."""
        ids = torch.cat([token[:, None], proposal.tokens], dim=1)  # [B, k+1]
        logits = penalized(span_logits(self.engine, ids, slot, self.steps, self.cache), self.params,
                           _seen_along(self.seen, proposal.tokens))  # [B, k+1, V]
        if self.params.greedy:
            tokens, accepted = accept_greedy(logits, proposal)
        else:
            tokens, accepted = accept_sampled(sampling_probs(logits, self.params), proposal, self.generator)
        n = int(accepted.min())
        tokens = tokens[:, :n + 1]
        if self.seen is not None:
            self.seen.scatter_(1, tokens, True)
        self.policy.kept(proposal.k, n)
        self.shadow = None
        self.stats.verifications += 1
        self.stats.proposed += proposal.proposed()
        self.stats.accepted += n * tokens.shape[0]
        self.stats.rejections += tokens.shape[0] if n < proposal.k else 0
        return tokens, n


def _seen_along(seen: Tensor | None, drafts: Tensor) -> Tensor | None:
    """The repetition penalty's seen set [B, V] at each of the k+1 verified positions -> [B, k+1, V]:
    position i has also seen the proposal's first i tokens."""
    if seen is None:
        return None
    B, k = drafts.shape
    marks = torch.zeros(B, k + 1, seen.shape[1], dtype=torch.bool, device=seen.device)
    marks[:, 1:].scatter_(2, drafts[..., None], True)  # position i + 1 marks d_{i+1}
    return seen[:, None] | (marks.cumsum(dim=1) > 0)


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
