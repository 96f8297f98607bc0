"""The speculative loop on tiny random models: greedy output identical to plain greedy decoding for
both proposers, alone and in left-padded batches, with the penalties, stops and max_new_tokens
exactly as without speculation; the counts add up."""

from __future__ import annotations

import functools

import pytest
import torch

import anatomy
from anatomy.inference.engine import DecoderEngine
from anatomy.inference.sampling import SamplingParams
from anatomy.inference.speculative import DraftProposer, NgramProposer, SpeculativeDecoder, first_layers
from anatomy.inference.speculative.policy import AdaptiveK

from .conftest import KINDS, gpt2_tiny, tiny

# prompts that repeat themselves, so that prompt lookup has guesses (right and wrong ones)
PROMPTS = [[5, 17, 33, 2, 9, 41, 8, 5, 17, 33, 2, 9, 41], [60, 3, 60, 3, 60], [11, 12, 13, 14, 11, 12]]


@functools.cache
def engine_of(kind: str, layers: int | None = None) -> DecoderEngine:
    """One engine per tiny model (an engine measures its kernel plan when made); `layers`: a draft
    of the model's first blocks."""
    model = gpt2_tiny() if kind == "gpt2" else tiny(kind)
    return DecoderEngine(first_layers(model, layers) if layers else model)


def proposer_of(kind: str, proposer: str):
    if proposer == "ngram":
        return NgramProposer()
    return DraftProposer(engine_of(kind, 1 if proposer == "draft-first-layer" else None))


def run(decoder_or_engine, prompts, params) -> list[list[int]]:
    return torch.stack(list(decoder_or_engine.tokens(prompts, params)), dim=1).tolist()


@pytest.mark.parametrize("kind, proposer", [*((kind, "ngram") for kind in [*KINDS, "gpt2"]),
                                            ("rope-gqa", "draft-first-layer"), ("gpt2", "draft-first-layer"),
                                            ("sliding-window", "draft-itself"), ("dynamic-ntk", "draft-itself")])
def test_greedy_output_is_plain_greedy_output(kind, proposer):
    engine = engine_of(kind)
    params = SamplingParams(max_new_tokens=20)
    for prompts in (PROMPTS[:1], PROMPTS):  # alone and as a padded batch
        decoder = SpeculativeDecoder(engine, proposer_of(kind, proposer), k=4, adaptive=False)
        assert run(decoder, prompts, params) == run(engine, prompts, params)
        assert decoder.stats.verifications > 0


def test_generations_of_one_shape_run_over_one_lent_cache():
    """The engine lends each generation's loop (and its draft's) a cache per shape: the next generation
    replays the steps recorded over it instead of recording, and holding, more."""
    engine = engine_of("rope-gqa")
    decoder = SpeculativeDecoder(engine, DraftProposer(engine), k=3, adaptive=False)
    run(decoder, PROMPTS[:1], SamplingParams(max_new_tokens=20))
    first = decoder.loop.cache, decoder.loop.drafter.cache
    assert first[0] is not first[1]  # the draft is the target's engine: the live loop's cache is not lent twice
    run(decoder, PROMPTS[:1], SamplingParams(max_new_tokens=24))
    assert (decoder.loop.cache, decoder.loop.drafter.cache) == first


def test_a_draft_that_is_the_target_keeps_everything():
    engine = engine_of("rope-gqa")
    decoder = SpeculativeDecoder(engine, DraftProposer(engine), k=3, adaptive=False)
    run(decoder, PROMPTS[:1], SamplingParams(max_new_tokens=21))
    s = decoder.stats
    assert s.accepted == s.proposed == 15 and s.tokens_per_forward == 4.0 and s.rejections == 0
    assert s.verifications == s.target_forwards == 5 and s.tokens == 20  # 1 (prefill) + 5 x 4
    assert s.draft_forwards == 5 * 3  # k per round (the first catches up on the prompt)


@pytest.mark.parametrize("penalties", [dict(repetition_penalty=1.8),
                                       dict(presence_penalty=0.6, frequency_penalty=0.4),
                                       dict(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.5)])
def test_the_penalties_see_and_count_the_proposed_tokens_before_each_position(penalties):
    engine = engine_of("rope-gqa")
    params = SamplingParams(max_new_tokens=24, **penalties)
    decoder = SpeculativeDecoder(engine, DraftProposer(engine), k=4, adaptive=False)  # the target, unpenalized
    assert run(decoder, PROMPTS, params) == run(engine, PROMPTS, params)
    assert decoder.stats.accepted > 0 and decoder.stats.rejections > 0  # kept guesses, and ones the penalties turned


@pytest.mark.parametrize("new", [1, 2, 3, 7])
def test_exactly_max_new_tokens_however_the_rounds_fall(new):
    engine = engine_of("rope-gqa")
    decoder = SpeculativeDecoder(engine, DraftProposer(engine), k=5, adaptive=False)
    out = run(decoder, PROMPTS[:1], SamplingParams(max_new_tokens=new))
    assert len(out[0]) == new and out == run(engine, PROMPTS[:1], SamplingParams(max_new_tokens=new))


def test_generate_stops_inside_a_round_as_without_speculation():
    """A stop id among the tokens of one verification ends the text there, as it does token by token."""
    engine = engine_of("rope-gqa")
    plain = anatomy.generate(engine, PROMPTS[0], max_new_tokens=20)
    stop = plain.token_ids[6]
    want = anatomy.generate(engine, PROMPTS[0], max_new_tokens=20, stop_ids=[stop])
    got = anatomy.generate(engine, PROMPTS[0], max_new_tokens=20, stop_ids=[stop], speculative="draft",
                           draft_model=engine, num_speculative_tokens=4)
    assert got.token_ids == want.token_ids and got.finish_reason == want.finish_reason == "stop"
    assert got.speculative.method == "draft" and want.speculative is None


def test_sampling_is_reproducible_with_a_seed_when_k_is_fixed():
    engine = engine_of("rope-gqa")
    params = SamplingParams(max_new_tokens=16, temperature=0.9, top_k=20, seed=5)
    runs = [run(SpeculativeDecoder(engine, NgramProposer(), k=3, adaptive=False), PROMPTS, params) for _ in range(2)]
    assert runs[0] == runs[1]


class Costs(AdaptiveK):
    """The adaptive policy with fixed costs instead of measured ones: a target forward costs
    1 + 0.05 per extra row, a draft step 0.1 (so that the test does not depend on the machine's load)."""

    def target_time(self, rows: int, seconds: float) -> None:
        super().target_time(rows, 1 + 0.05 * (rows - 1))

    def draft_time(self, seconds: float) -> None:
        super().draft_time(0.1)


class Wrong:
    """A draft-like proposer (not free) whose every guess is wrong: the last token + 1, never the argmax here."""

    name, free = "wrong", False

    def guesser(self, tokens: list[int]) -> Wrong:
        self.last = tokens[-1]
        return self

    def continuation(self, k: int) -> list[int]:
        return [(self.last + 1) % 97] * k

    def extend(self, tokens: list[int]) -> None:
        self.last = tokens[-1]


def test_adaptive_speculation_falls_back_to_plain_steps_when_guesses_fail():
    """Every guess rejected: after a few rounds the policy decodes plainly, verifying only the probes
    (after 8, 16, 32 plain steps), and the output is plain greedy's."""
    engine = engine_of("rope-gqa")
    params = SamplingParams(max_new_tokens=60)
    truth = run(engine, PROMPTS[:1], params)
    assert all(b != (a + 1) % 97 for a, b in zip(truth[0], truth[0][1:]))
    decoder = SpeculativeDecoder(engine, Wrong(), k=4, policy=lambda: Costs(4, free=False))
    assert run(decoder, PROMPTS[:1], params) == truth
    s = decoder.stats
    assert s.accepted == 0 and s.plain_steps > 4 * s.verifications
