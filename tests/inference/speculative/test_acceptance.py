"""The acceptance rules on hand-made distributions: greedy keeps the agreeing prefix; rejection
sampling emits tokens distributed exactly as the target's, checked by a chi-square test."""

from __future__ import annotations

import torch

from anatomy.inference.speculative import Proposal
from anatomy.inference.speculative.acceptance import accept_greedy, accept_sampled, leading

P_VALUE = 1e-4  # a chi-square test fails only if a deviation this unlikely is seen (seeded: deterministic)


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of observed counts [V] against probabilities [V] (cells with p = 0 must be empty)."""
    assert counts[probs == 0].sum() == 0, "a token with probability 0 was emitted"
    keep = probs > 0
    n = counts.sum()
    expected = n * probs[keep]
    stat = ((counts[keep] - expected) ** 2 / expected).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat.double() / 2))


def test_leading_counts_the_true_prefix():
    ok = torch.tensor([[True, True, False, True], [False, True, True, True], [True] * 4])
    assert leading(ok).tolist() == [2, 0, 4]


def test_greedy_keeps_the_prefix_the_target_agrees_with():
    V = 6
    choice = torch.tensor([[3, 4, 5, 1], [3, 4, 5, 1], [2, 2, 2, 2]])  # the target's argmax at each row
    logits = torch.nn.functional.one_hot(choice, V).float()
    proposal = Proposal(torch.tensor([[3, 4, 5], [3, 0, 5], [2, 2, 2]]), lengths=torch.tensor([3, 3, 2]))
    tokens, accepted = accept_greedy(logits, proposal)
    assert accepted.tolist() == [3, 1, 2]  # all kept (bonus 1); wrong at 2nd; only 2 were proposed
    assert tokens.tolist() == choice.tolist()


def distributions(k: int, V: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(k + 1, V, generator=g) * 1.5, dim=-1)
    q = torch.softmax(torch.randn(k, V, generator=g) * 1.5, dim=-1)
    p[:, 0] = 0  # a token the target never emits, which the draft proposes
    return p / p.sum(-1, keepdim=True), q


def test_rejection_sampling_keeps_the_targets_distribution():
    """200,000 rounds of k = 2 proposals drawn from q: the first emitted token follows p_0 and, in the
    rounds that kept the first proposal, the second follows p_1 (chi-square, p > 1e-4)."""
    k, V, n = 2, 8, 200_000
    p, q = distributions(k, V, seed=1)
    g = torch.Generator().manual_seed(2)
    drafts = torch.stack([torch.multinomial(q[i], n, replacement=True, generator=g) for i in range(k)], dim=1)
    proposal = Proposal(drafts, probs=q.expand(n, k, V))
    tokens, accepted = accept_sampled(p.expand(n, k + 1, V), proposal, g)
    assert chi_square_p(torch.bincount(tokens[:, 0], minlength=V).double(), p[0]) > P_VALUE
    kept = accepted >= 1
    assert chi_square_p(torch.bincount(tokens[kept, 1], minlength=V).double(), p[1]) > P_VALUE
    assert torch.equal(tokens[kept, 0], drafts[kept, 0])
    rate = float(torch.minimum(p[0], q[0]).sum())  # P(keep the first) = sum_x min(p(x), q(x))
    assert abs(kept.double().mean().item() - rate) < 4 * (rate * (1 - rate) / n) ** 0.5


def test_a_deterministic_proposal_is_kept_with_the_targets_probability():
    """n-gram proposals (q one-hot): d is kept with probability p(d), and the token still follows p."""
    k, V, n = 1, 8, 200_000
    p, _ = distributions(k, V, seed=3)
    proposal = Proposal(torch.full((n, k), 4))
    tokens, accepted = accept_sampled(p.expand(n, k + 1, V), proposal, torch.Generator().manual_seed(4))
    assert chi_square_p(torch.bincount(tokens[:, 0], minlength=V).double(), p[0]) > P_VALUE
    assert abs(accepted.double().mean().item() - p[0, 4].item()) < 4 * (p[0, 4].item() / n) ** 0.5


def test_a_draft_token_the_target_never_emits_is_always_rejected():
    k, V = 1, 8
    p, q = distributions(k, V, seed=5)
    proposal = Proposal(torch.zeros(1000, 1, dtype=torch.long), probs=q.expand(1000, k, V))
    tokens, accepted = accept_sampled(p.expand(1000, k + 1, V), proposal, torch.Generator().manual_seed(0))
    assert accepted.sum() == 0 and (tokens[:, 0] != 0).all()


def test_the_penalties_along_a_proposal_are_what_each_position_has_seen_and_counted():
    """`along` against Python sets and counters built token by token: position i of a round has seen the
    prompt, the output so far and the proposal's first i tokens, and counted the output's and those."""
    from collections import Counter

    from anatomy.inference.sampling import Penalties, SamplingParams
    from anatomy.inference.speculative.acceptance import along

    V, prompts, outputs = 12, [[1, 2, 3], [4, 4]], [[5, 1], [7, 7]]
    drafts = torch.tensor([[3, 5, 5], [9, 4, 10]])
    penalties = Penalties.of(prompts, SamplingParams(repetition_penalty=1.2, frequency_penalty=0.5), vocab=V)
    penalties.observe(torch.tensor(outputs))
    seen, counts = along(penalties, drafts)
    for b in range(2):
        for i in range(drafts.shape[1] + 1):
            before = drafts[b, :i].tolist()
            want_seen = set(prompts[b]) | set(outputs[b]) | set(before)
            want_counts = Counter(outputs[b] + before)
            assert {t for t in range(V) if seen[b, i, t]} == want_seen
            assert {t: int(counts[b, i, t]) for t in range(V) if counts[b, i, t]} == dict(want_counts)
    assert along(Penalties(), drafts) == (None, None)
