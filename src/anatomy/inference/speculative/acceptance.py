"""Which proposed tokens the target keeps, from its logits over the k proposals in one forward.

    ids     [B, k+1] = the last emitted token, then the proposal d_1..d_k
    logits  [B, k+1, V]: row i is the target's next-token distribution p_i after ids[:, :i+1]

Greedy keeps proposals while they equal the target's argmax, then emits the target's own token.
Sampling is rejection sampling (Leviathan et al. 2023, Chen et al. 2023): each emitted token is
distributed exactly as p_i, whatever the proposer (docs/speculative.md, "How it works").
Both return (tokens [B, k+1], accepted [B]): row b emits tokens[b, :accepted[b] + 1]. `verify` is the
round's decision for both callers (a Run's rows, a served sequence): the penalties along the proposal, then
the rule of its sampling parameters.
"""

from __future__ import annotations

import torch
from torch import Tensor

from anatomy.inference.sampling import Penalties, SamplingParams, greedy, penalized, sampling_probs
from anatomy.inference.speculative.proposal import Proposal


def verify(logits: Tensor, proposal: Proposal, params: SamplingParams, generator: torch.Generator | None,
           penalties: Penalties | None = None) -> tuple[Tensor, Tensor]:
    """The target's logits [B, k+1, V] over [last, d_1..d_k] -> (tokens [B, k+1], accepted [B]): each
    position penalized as its own decode step would be (its proposals before it seen and counted), then
    kept by the greedy or the rejection-sampling rule."""
    seen, counts = along(penalties or Penalties(), proposal.tokens)
    rows = penalized(logits, params, seen, counts)  # [B, k+1, V] float32
    if params.greedy:
        return accept_greedy(rows, proposal)
    return accept_sampled(sampling_probs(rows, params), proposal, generator)


def along(penalties: Penalties, drafts: Tensor) -> tuple[Tensor | None, Tensor | None]:
    """The penalties' state [B, V] at each of the k+1 verified positions -> (seen [B, k+1, V] or None,
    counts [B, k+1, V] or None): position i has also seen and counted the proposal's first i tokens."""
    if penalties.none:
        return None, None
    B, k = drafts.shape
    V = next(t for t in (penalties.seen, penalties.counts) if t is not None).shape[1]
    marks = torch.zeros(B, k + 1, V, dtype=torch.int32, device=drafts.device)
    marks[:, 1:].scatter_(2, drafts[..., None], 1)  # position i + 1 marks d_{i+1}
    before = marks.cumsum(dim=1)  # [B, k+1, V]: how often each token was proposed before position i
    seen = penalties.seen[:, None] | (before > 0) if penalties.seen is not None else None
    counts = penalties.counts[:, None] + before if penalties.counts is not None else None
    return seen, counts


def accept_greedy(logits: Tensor, proposal: Proposal) -> tuple[Tensor, Tensor]:
    """logits [B, k+1, V] (penalised, if a repetition penalty is on) -> (argmax tokens [B, k+1], accepted [B])."""
    choice = greedy(logits)  # [B, k+1]
    agree = (choice[:, :-1] == proposal.tokens) & proposal.valid()  # [B, k]
    return choice, leading(agree)


def accept_sampled(probs: Tensor, proposal: Proposal, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """probs [B, k+1, V]: the target's sampling distributions -> (tokens [B, k+1], accepted [B])."""
    B, S, V = probs.shape
    k, d = S - 1, proposal.tokens
    rows = torch.arange(B, device=probs.device)
    p_d = probs[:, :k].gather(2, d[..., None])[..., 0]  # [B, k]
    q_d = proposal.probs.gather(2, d[..., None])[..., 0] if proposal.probs is not None else torch.ones_like(p_d)
    u = torch.rand(B, k, generator=generator, device=probs.device)
    accepted = leading((u * q_d < p_d) & proposal.valid())  # u < p/q, without dividing by q
    p_at = probs[rows, accepted]  # [B, V]: the distribution of the token after the kept ones
    rejected = accepted < (proposal.lengths if proposal.lengths is not None else k)  # [B]
    last = torch.multinomial(_residual(p_at, _q_at(proposal, accepted, V), rejected), 1, generator=generator)[:, 0]
    tokens = torch.cat([d, last[:, None]], dim=1)  # [B, k+1]
    tokens[rows, accepted] = last
    return tokens, accepted


def leading(ok: Tensor) -> Tensor:
    """bool [B, k] -> [B]: how many leading entries of each row are True."""
    return ok.long().cumprod(dim=1).sum(dim=1)


def _q_at(proposal: Proposal, accepted: Tensor, V: int) -> Tensor:
    """[B, V]: the proposal's distribution at each row's first rejected position (anything where none was)."""
    rows = torch.arange(accepted.shape[0], device=accepted.device)
    at = accepted.clamp(max=max(proposal.k - 1, 0))
    if proposal.probs is not None:
        return proposal.probs[rows, at]
    return torch.nn.functional.one_hot(proposal.tokens[rows, at], V).to(proposal.tokens.device).float()


def _residual(p: Tensor, q: Tensor, rejected: Tensor) -> Tensor:
    """max(0, p - q) where a row rejected (normalised by multinomial), p where it kept every proposal.
    A residual with no mass cannot occur for a rejected row (rejection needs q(d) > p(d)); it falls back to p."""
    residual = torch.where(rejected[:, None], (p - q).clamp_min(0), p)
    empty = residual.sum(dim=1, keepdim=True) <= 0
    return torch.where(empty, p, residual)
