"""One forward over several tokens (verification) equals their decode steps one by one, for every
kind of position and mask rule; and a rewind leaves the cache as a run that never saw the
rejected tokens."""

from __future__ import annotations

import pytest
import torch

from anatomy.inference.engine import DecoderEngine
from anatomy.inference.kv_cache import KVCache
from anatomy.inference.sampling import SamplingParams
from anatomy.inference.speculative import Proposal, SpeculativeDecoder
from anatomy.inference.speculative.forward import span_logits
from anatomy.inference.steps import DecodeSteps, PaddedBatch

from .conftest import KINDS, gpt2_tiny, tiny

PROMPTS = [[5, 17, 33, 2, 9, 41, 8, 3, 12, 70], [60, 3, 44]]


def setup(engine: DecoderEngine, prompts: list[list[int]], extra: int):
    batch = PaddedBatch.of(prompts)
    cache = KVCache(engine.model.config, batch=len(prompts), max_len=batch.ids.shape[1] + extra)
    steps = DecodeSteps(engine.model.stack, batch, max_len=cache.max_len, dtype=engine.dtype)
    engine._prefill(batch, cache)
    return batch, cache, steps


@pytest.mark.parametrize("make", [*(lambda k=k: tiny(k) for k in KINDS), gpt2_tiny],
                         ids=[*KINDS, "gpt2-learned"])
@pytest.mark.parametrize("prompts", [PROMPTS, PROMPTS[:1]], ids=["padded", "alone"])
def test_one_pass_over_several_tokens_equals_their_decode_steps(make, prompts):
    """Rows of the verification forward == each token's own decode step (sliding window, RoPE angles
    of a length-dependent rule, ALiBi, learned positions, left padding)."""
    engine = DecoderEngine(make())
    new = torch.tensor([[7, 8, 9, 10, 11, 12]] * len(prompts))  # [B, 6]
    batch, cache, steps = setup(engine, prompts, extra=8)
    P = batch.ids.shape[1]
    together = span_logits(engine, new, P, steps, cache)  # [B, 6, V]
    batch, cache, steps = setup(engine, prompts, extra=8)
    alone = torch.stack([engine._decode(new[:, i], torch.tensor([P + i]), steps, cache) for i in range(6)], dim=1)
    torch.testing.assert_close(together, alone, atol=2e-5, rtol=1e-5)


def test_span_context_equals_the_models_own():
    """The masks of DecodeSteps.span are those the model's own checked forward builds for the same slots."""
    stack = tiny("sliding-window").stack
    batch = PaddedBatch.of(PROMPTS)
    T, slots = 16, torch.arange(10, 14)
    ctx, positions = DecodeSteps(stack, batch, max_len=T, dtype=torch.float32).span(slots)
    cache = [type("Cache", (), {"max_len": T})()]
    ref, ref_positions = stack.prepare(torch.zeros(2, 4, dtype=torch.long), attention_mask=batch.slot_mask(T),
                                       position_ids=batch.positions(slots), cache=cache, input_pos=slots)
    assert torch.equal(positions, ref_positions)
    for mine, theirs in ((ctx.mask, ref.mask), (ctx.window_mask, ref.window_mask)):
        assert torch.equal(mine.expand(2, 1, 4, T) == 0, theirs.expand(2, 1, 4, T))
    assert all(torch.allclose(a, b) for a, b in zip(ctx.rope, ref.rope))


class Script:
    """A proposer that proposes the known greedy continuation with some tokens wrong: proposals at
    rounds in `wrong` have their second token replaced."""

    name, free, forwards = "script", False, 0

    def __init__(self, truth: list[int], wrong: set[int]) -> None:
        self.truth, self.wrong, self.done, self.rounds = truth, wrong, 0, 0

    def start(self, batch, params, generator) -> None:
        pass

    def propose(self, k: int) -> Proposal:
        guess = list(self.truth[self.done:self.done + k])
        if self.rounds in self.wrong and len(guess) > 1:
            guess[1] = (guess[1] + 1) % 97
        self.rounds += 1
        return Proposal.rows([guess])

    def advance(self, emitted: torch.Tensor, accepted: int) -> None:
        self.done += emitted.shape[1]


@pytest.mark.parametrize("kind", ["rope-gqa", "sliding-window"])
def test_rewind_leaves_the_cache_of_a_run_that_never_saw_the_rejected_tokens(kind):
    engine = DecoderEngine(tiny(kind))
    prompt, N = PROMPTS[0], 24
    params = SamplingParams(max_new_tokens=N)
    truth = [int(t) for t in engine.tokens([prompt], params)]
    plain = engine.last_cache
    script = Script(truth, wrong={0, 2, 3, 5})
    decoder = SpeculativeDecoder(engine, script, k=4, adaptive=False)
    out = [int(t) for t in decoder.tokens([prompt], params)]
    assert out == truth
    assert decoder.stats.rejections == 4 and decoder.stats.accepted > 0
    written = len(prompt) + N - 1  # the last token is never fed back
    for mine, theirs in zip(decoder.cache, plain):
        torch.testing.assert_close(mine.k[:, :, :written], theirs.k[:, :, :written], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(mine.v[:, :, :written], theirs.v[:, :, :written], atol=1e-5, rtol=1e-5)
