"""Speculative decoding in the serving loop: prompt-lookup drafts and a draft model's, verified in the
step, give plain serving's greedy tokens (alone, batched with sequences that do not speculate, across
preemption), sample from the same distributions, keep the right prompt-cache blocks, and back off when
they fail."""

from __future__ import annotations

import pytest
import torch

from anatomy.errors import InputError
from anatomy.inference.engine import DecoderEngine
from anatomy.inference.sampling import SamplingParams
from anatomy.inference.speculative.ngram import NgramIndex
from anatomy.serving.loop import ServingLoop
from anatomy.inference.speculative.rounds import ServedSpeculation, SequenceSpeculation

from ..inference.conftest import llama_tiny
from ..inference.speculative.conftest import markov_decoder
from ..inference.speculative.test_acceptance import P_VALUE, chi_square_p
from ..inference.speculative.test_sampling import PROMPT, TARGET, continuations
from .conftest import engine_tokens, random_prompts, run_all

GREEDY = SamplingParams(max_new_tokens=24, ignore_eos=True)


def repeating(n: int, seed: int = 3) -> list[list[int]]:
    """Prompts that repeat a random phrase, so that prompt lookup has right and wrong guesses."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 97, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist() * 4
            for _ in range(n)]


def tokens_of(events) -> list[int]:
    return [e.token for e in events]


@pytest.mark.parametrize("kv_bytes", [10 ** 7, 60_000], ids=["roomy", "preempting"])
def test_verified_drafts_give_plain_greedy_tokens(tiny, kv_bytes):
    """Ten sequences at once (repetitive prompts and random ones), also in a KV memory so small that
    sequences are preempted and recomputed: plain greedy tokens, in fewer steps than plain serving."""
    engine = DecoderEngine(tiny)
    prompts = repeating(6) + random_prompts(4)
    plain = [engine_tokens(engine, p, GREEDY) for p in prompts]
    loops = [ServingLoop(engine, kv_bytes=kv_bytes, block_size=4, speculation=spec)
             for spec in (None, ServedSpeculation())]
    for loop in loops:
        assert [tokens_of(e) for e in run_all(loop, prompts, GREEDY)] == plain
        assert loop.blocks.used == 0 and not loop.scheduler.running
    if kv_bytes < 10 ** 6:
        assert loops[1].scheduler.preemptions > 0
    else:
        assert loops[1].steps < loops[0].steps, "several tokens per step for some sequences"


@pytest.mark.parametrize("draft", ["itself", "another"])
@pytest.mark.parametrize("kv_bytes", [10 ** 7, 60_000], ids=["roomy", "preempting"])
def test_a_draft_models_proposals_give_plain_greedy_tokens(tiny, draft, kv_bytes):
    """A draft model in the loop (the target itself: every guess right; another random model of the same
    vocabulary: most wrong), ten sequences at once, also preempted and recomputed: plain greedy tokens,
    and with the target as its own draft in fewer steps."""
    engine = DecoderEngine(tiny)
    torch.manual_seed(7)
    drafter = engine if draft == "itself" else DecoderEngine(llama_tiny())
    prompts = repeating(6) + random_prompts(4)
    plain = [engine_tokens(engine, p, GREEDY) for p in prompts]
    loop = ServingLoop(engine, kv_bytes=kv_bytes, block_size=4, speculation=ServedSpeculation(
        method="draft", num_speculative_tokens=4, draft=drafter))
    assert [tokens_of(e) for e in run_all(loop, prompts, GREEDY)] == plain
    assert loop.blocks.used == 0 and not loop.scheduler.running and loop.drafter.forwards > 0
    if draft == "itself" and kv_bytes > 10 ** 6:  # 24 tokens: 1 from the prefill, then 5 per step
        assert loop.steps <= 2 + 23 // 5, "the target's own guesses are all kept"


def test_a_draft_model_needs_the_targets_vocabulary(tiny):
    other = DecoderEngine(markov_decoder(TARGET))  # 3 tokens
    with pytest.raises(InputError, match="vocabulary"):
        ServingLoop(DecoderEngine(tiny), kv_bytes=10 ** 7, block_size=4,
                    speculation=ServedSpeculation(method="draft", draft=other))
    with pytest.raises(InputError, match="needs a draft model"):
        ServedSpeculation(method="draft")


def test_a_request_that_asks_speculates_beside_one_that_does_not(tiny):
    engine = DecoderEngine(tiny)
    prompts = repeating(2)
    plain = [engine_tokens(engine, p, GREEDY) for p in prompts]
    loop = ServingLoop(engine, kv_bytes=10 ** 7, block_size=4)  # no server default
    events = [[], []]
    loop.submit(prompts[0], GREEDY, events[0].append, speculative_tokens=4)
    loop.submit(prompts[1], GREEDY, events[1].append)
    while loop.step():
        pass
    assert [tokens_of(e) for e in events] == plain


def test_logprobs_of_verified_tokens_are_the_models(tiny):
    engine = DecoderEngine(tiny)
    prompt = repeating(1)[0]
    loop = ServingLoop(engine, kv_bytes=10 ** 7, block_size=4)
    plain = run_all(loop, [prompt], GREEDY, logprobs=3)[0]
    fast = run_all(loop, [prompt], GREEDY, logprobs=3, speculative_tokens=5)[0]
    assert tokens_of(fast) == tokens_of(plain)
    for a, b in zip(fast, plain):
        assert a.logprob.top_ids == b.logprob.top_ids
        assert a.logprob.logprob == pytest.approx(b.logprob.logprob, abs=1e-4)


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_sampled_speculation_follows_the_target_distribution(method):
    """1,200 seeded sequences of a hand-set Markov chain, served with k = 2 drafts at temperature 1
    (prompt lookup's, or the chain's own argmax as a draft model's): chi-square of the 27 possible
    2nd-4th tokens against the chain, p > 1e-4 (as the offline test)."""
    engine = DecoderEngine(markov_decoder(TARGET))
    loop = ServingLoop(engine, kv_bytes=10 ** 7, block_size=4, max_seqs=64, speculation=ServedSpeculation(
        method=method, num_speculative_tokens=2, draft=engine if method == "draft" else None))
    events = [[] for _ in range(1200)]
    for seed, sink in enumerate(events):
        loop.submit(PROMPT, SamplingParams(max_new_tokens=4, temperature=1.0, seed=seed), sink.append)
    while loop.step():
        pass
    out = torch.tensor([tokens_of(e) for e in events])  # [1200, 4]
    counts = torch.bincount(out[:, 1] * 9 + out[:, 2] * 3 + out[:, 3], minlength=27).double()
    assert loop.steps < 1200 // 64 * 4, "rounds emitted several tokens"
    assert chi_square_p(counts, continuations(TARGET, PROMPT[-1])) > P_VALUE


def test_a_sequence_backs_off_when_its_guesses_fail():
    spec = SequenceSpeculation(NgramIndex([1, 2, 1, 2], min_n=1, max_n=2), k=3)
    assert spec.propose(10) == [1, 2, 1]
    spec.kept(3, 0)
    spec.kept(3, 0)  # two misses in a row: wait 1 step
    assert spec.propose(10) == [] and spec.propose(10) == [1, 2, 1]
    spec.kept(3, 0)
    spec.kept(3, 0)  # again: wait 2
    assert [spec.propose(10) for _ in range(3)] == [[], [], [1, 2, 1]]
    spec.kept(3, 2)  # a round that keeps something resets it
    assert spec.policy.backoff == 1 and spec.propose(2) == [1, 2]


def test_a_request_with_penalties_speculates_and_gets_its_plain_tokens():
    """Repetition, presence and frequency penalties: each verified position is penalized as its own decode
    step would be (the draft's tokens before it seen and counted), so the greedy tokens are plain
    generation's with those penalties, in fewer steps (the LLaMA: the tiny GPT-2's logits are so flat that
    the penalties turn nearly every unpenalized guess)."""
    tiny = llama_tiny()
    engine = DecoderEngine(tiny)
    params = SamplingParams(max_new_tokens=24, ignore_eos=True, repetition_penalty=1.3, presence_penalty=0.4,
                            frequency_penalty=0.3)
    prompts = repeating(6)
    plain = [engine_tokens(engine, p, params) for p in prompts]
    draft = ServedSpeculation(method="draft", draft=DecoderEngine(tiny))  # the target, without the penalties
    loops = [ServingLoop(engine, kv_bytes=10 ** 7, block_size=4, speculation=spec) for spec in (None, draft)]
    for loop in loops:
        assert [tokens_of(e) for e in run_all(loop, prompts, params)] == plain
    assert loops[1].metrics.accepted_tokens > 0 and loops[1].steps < loops[0].steps


def test_what_turns_speculation_off_for_a_request():
    spec = ServedSpeculation(num_speculative_tokens=4)
    assert spec.for_sequence([1, 2], SamplingParams(repetition_penalty=1.2)) is not None  # penalties apply along
    assert spec.for_sequence([1, 2], SamplingParams(), k=0) is None
    assert spec.for_sequence([1, 2], SamplingParams(), k=9).k == 4  # never more than the server's
