"""The decode engine on tiny random models: batching with left padding gives each prompt's tokens
alone, sampling is reproducible with a seed, the cache is sized to prompt + new tokens."""

from __future__ import annotations

import pytest
import torch

from anatomy.inference.engine import DecoderEngine
from anatomy.inference.sampling import SamplingParams

from .conftest import llama_tiny

PROMPTS = [[5, 17, 33, 2, 9, 41, 8], [60, 3], [11, 12, 13, 14]]


def run(engine: DecoderEngine, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    steps = torch.stack(list(engine.tokens(prompts, params)), dim=1)  # [B, max_new_tokens]
    return steps.tolist()


def test_greedy_batch_equals_each_prompt_alone(decoder_tiny):
    engine = DecoderEngine(decoder_tiny)
    params = SamplingParams(max_new_tokens=12)
    batched = run(engine, PROMPTS, params)
    alone = [run(engine, [p], params)[0] for p in PROMPTS]
    assert batched == alone


def test_greedy_tokens_are_the_argmax_of_a_full_forward():
    model = llama_tiny()
    out = run(DecoderEngine(model), [PROMPTS[0]], SamplingParams(max_new_tokens=6))[0]
    ids = list(PROMPTS[0])
    with torch.no_grad():
        for token in out:
            assert token == int(model(torch.tensor([ids]))[0, -1].argmax())
            ids.append(token)


def test_seeded_sampling_reproduces_and_differs_by_seed():
    engine = DecoderEngine(llama_tiny())
    sample = lambda seed: run(engine, PROMPTS, SamplingParams(max_new_tokens=10, temperature=1.0, seed=seed))
    assert sample(3) == sample(3)
    assert sample(3) != sample(4)


def test_repetition_penalty_avoids_repeats():
    engine = DecoderEngine(llama_tiny())
    plain = run(engine, [PROMPTS[1]], SamplingParams(max_new_tokens=20))[0]
    penalised = run(engine, [PROMPTS[1]], SamplingParams(max_new_tokens=20, repetition_penalty=1e6))[0]
    assert len(set(plain)) < len(plain)  # the random model repeats itself greedily
    assert len(set(penalised)) == len(penalised) and not set(penalised) & set(PROMPTS[1])


def test_cache_holds_exactly_prompt_plus_new_tokens():
    engine = DecoderEngine(llama_tiny())
    run(engine, PROMPTS, SamplingParams(max_new_tokens=5))
    assert engine.last_cache.max_len == 7 + 5 and engine.last_cache[0].k.shape[0] == 3


@pytest.mark.slow
def test_compiled_step_gives_the_eager_tokens_and_compiles_once_per_shape():
    model = llama_tiny()
    eager, compiled = DecoderEngine(model), DecoderEngine(model, compile=True)
    params = SamplingParams(max_new_tokens=10)
    for prompts in (PROMPTS[:2], PROMPTS[:1], PROMPTS[:2]):
        assert run(compiled, prompts, params) == run(eager, prompts, params)
    assert len(compiled._caches) == 2  # (B=2, T=256) and (B=1, T=256), reused
