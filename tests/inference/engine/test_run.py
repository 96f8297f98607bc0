"""The step API of a generation (Run): left padding; every step's PassInputs equal to the one the
model's own checked forward builds from scratch; one pass over several tokens (verification) equal
to their decode steps one by one, for every kind of position and mask rule; a rewind leaving the
cache of a run that never saw the rejected tokens; bad use refused."""

from __future__ import annotations

import pytest
import torch

from anatomy.errors import InputError
from anatomy.inference.engine import DecoderEngine, PaddedBatch
from anatomy.inference.sampling import SamplingParams
from anatomy.inference.speculative import SpeculativeDecoder
from anatomy.models.position_rules import PositionTables

from ..conftest import gpt2_tiny as gpt2_small, llama_tiny
from ..speculative.conftest import KINDS, gpt2_tiny, tiny

PROMPTS = [[5, 17, 33, 2, 9, 41, 8, 3, 12, 70], [60, 3, 44]]


def test_padded_batch_left_pads_and_masks():
    batch = PaddedBatch.of([[1, 2, 3], [4]], pad_id=0)
    assert batch.ids.tolist() == [[1, 2, 3], [0, 0, 4]]
    assert batch.slot_mask(5).tolist() == [[True] * 5, [False, False, True, True, True]]
    assert batch.positions(torch.tensor([3])).tolist() == [[3], [1]]
    assert PaddedBatch.of([[1], [2]]).slot_mask(4) is None


def _reference(stack, batch, slots, T):
    cache = [type("Cache", (), {"max_len": T})()]
    return stack.prepare(torch.zeros(batch.ids.shape[0], len(slots), dtype=torch.long),
                         attention_mask=batch.slot_mask(T), position_ids=batch.positions(slots), cache=cache,
                         input_pos=slots)


@pytest.mark.parametrize("make", [llama_tiny, gpt2_small, lambda: tiny("sliding-window")],
                         ids=["rope", "learned", "window"])
@pytest.mark.parametrize("prompts", [[[1, 2, 3], [4]], [[5, 6]]], ids=["padded", "unpadded"])
@pytest.mark.parametrize("span", [1, 4], ids=["decode", "span"])
def test_step_context_equals_the_models_own(make, prompts, span):
    """Rotary angles and which key slots each row may attend to (sliding windows too), at every slot."""
    stack = make().stack
    batch = PaddedBatch.of(prompts)
    T = 12
    tables = PositionTables(stack.position_rules, length=T, dtype=torch.float32)
    for s in range(batch.ids.shape[1], T - span + 1):
        slots = torch.arange(s, s + span)
        ctx = tables.build(batch.positions(slots), q_slots=slots, key_valid=batch.slot_mask(T), input_pos=slots)
        ref, _ = _reference(stack, batch, slots, T)
        for mine, theirs in ((ctx.mask, ref.mask), (ctx.window_mask, ref.window_mask)):
            if theirs is None:
                assert mine is None
                continue
            assert torch.equal(mine, theirs)
            assert ((mine == 0) | torch.isneginf(mine)).all()
        if ref.rope is None:
            assert ctx.rope is None
        else:
            assert all(torch.equal(a, b) for a, b in zip(ctx.rope, ref.rope))


@pytest.mark.parametrize("make", [*(lambda k=k: tiny(k) for k in KINDS), gpt2_tiny],
                         ids=[*KINDS, "gpt2-learned"])
@pytest.mark.parametrize("prompts", [PROMPTS, PROMPTS[:1]], ids=["padded", "alone"])
def test_one_pass_over_several_tokens_equals_their_decode_steps(make, prompts):
    """Rows of run.verify == each token's own run.decode (sliding window, RoPE angles of a
    length-dependent rule, ALiBi, learned positions, left padding)."""
    engine = DecoderEngine(make())
    new = torch.tensor([[7, 8, 9, 10, 11, 12]] * len(prompts))  # [B, 6]
    params = SamplingParams(max_new_tokens=8)
    run = engine.start(prompts, params)
    run.prefill()
    together = run.verify(new)  # [B, 6, V]
    run = engine.start(prompts, params)
    run.prefill()
    alone = torch.stack([run.decode(new[:, i]) for i in range(6)], dim=1)
    torch.testing.assert_close(together, alone, atol=2e-5, rtol=1e-5)


class Script:
    """A proposer that guesses the known greedy continuation with some tokens wrong: guesses at rounds
    in `wrong` have their second token replaced."""

    name, free = "script", False

    def __init__(self, truth: list[int], wrong: set[int]) -> None:
        self.truth, self.wrong, self.done, self.rounds = truth, wrong, 0, 0

    def guesser(self, tokens: list[int]) -> Script:
        return self

    def continuation(self, k: int) -> list[int]:
        guess = list(self.truth[self.done:self.done + k])
        if self.rounds in self.wrong and len(guess) > 1:
            guess[1] = (guess[1] + 1) % 97
        self.rounds += 1
        return guess

    def extend(self, tokens: list[int]) -> None:
        self.done += len(tokens)


@pytest.mark.parametrize("kind", ["rope-gqa", "sliding-window"])
def test_rejected_guesses_leave_the_tokens_of_a_run_that_never_saw_them(kind):
    """Speculation over the loop's paged cache, with wrong guesses written and rejected in four rounds:
    the plain run's greedy tokens (the rejected keys are written over, never read)."""
    engine = DecoderEngine(tiny(kind), capture=False)
    prompt, N = PROMPTS[0], 24
    params = SamplingParams(max_new_tokens=N)
    truth = [int(t) for t in engine.tokens([prompt], params)]
    decoder = SpeculativeDecoder(engine, Script(truth, wrong={0, 2, 3, 5}), k=4, adaptive=False)
    assert [int(t) for t in decoder.tokens([prompt], params)] == truth
    assert decoder.stats.rejections == 4 and decoder.stats.accepted > 0


def test_bad_use_of_a_run_is_refused():
    engine = DecoderEngine(tiny())
    params = SamplingParams(max_new_tokens=4)
    run = engine.start([[1, 2, 3]], params)
    run.prefill()
    with pytest.raises(InputError, match="rewind to slot 1"):
        run.rewind(1)  # inside the prompt
    with pytest.raises(InputError, match="overflow"):
        run.verify(torch.ones(1, 200, dtype=torch.long))
    newer = engine.start([[4, 5, 6]], params)  # the same shape while `run` lives: another cache
    assert newer.cache is not run.cache
    newer.prefill()
    run.decode(torch.tensor([1]))
    kept = [run.cache, newer.cache]
    del run, newer
    assert engine.start([[4, 5, 6]], params).cache is kept[0]  # lent again once its run is gone
    with pytest.raises(InputError, match="prompt"):
        engine.start([[1, 200]], params)  # a token id past the vocabulary
    with pytest.raises(InputError, match="at least one token"):
        engine.start([[]], params)


def test_a_run_is_a_client_of_the_engines_step(monkeypatch):
    """Every model call of a run (prefill, decode, verify) is one engine.step over its rows' chunks in a
    paged cache; no static decode path is left (capture.py traces paged steps only)."""
    from anatomy.inference.engine import PagedKVCache, capture

    engine = DecoderEngine(llama_tiny())
    calls, step = [], engine.step
    monkeypatch.setattr(engine, "step", lambda cache, chunks, **kw: calls.append((cache, chunks)) or step(cache, chunks, **kw))
    run = engine.start(PROMPTS, SamplingParams(max_new_tokens=40))
    token = run.choose(run.prefill())
    assert len(calls) == 1 and [c.tokens for c in calls[0][1]] == PROMPTS  # unpadded, one forward
    for _ in range(36):
        token = run.choose(run.decode(token))
    run.verify(torch.stack([token, token], dim=1))
    assert len(calls) == 38 and all(isinstance(cache, PagedKVCache) and cache is run.cache for cache, _ in calls)
    assert [len(c.tokens) for c in calls[-1][1]] == [2, 2] and engine.captured_graphs == 1
    assert not hasattr(capture, "capture_static") and not hasattr(capture, "StaticBody")
