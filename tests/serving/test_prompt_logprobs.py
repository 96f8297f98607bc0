"""Prompt log-probabilities in the serving loop against a full forward's log-softmax: computed in
chunks, taken from the prefix cache's kept entries, and after preemption; max_tokens 0 runs the prompt
only."""

from __future__ import annotations

import pytest
import torch

from anatomy.inference.engine import DecoderEngine
from anatomy.inference.sampling import SamplingParams
from anatomy.serving.loop import ServingLoop
from anatomy.serving.prompt_logprobs import PROMPT_TOP

from .conftest import random_prompts, run_all

ONE = SamplingParams(max_new_tokens=1, ignore_eos=True)


def reference(model, prompt: list[int]) -> tuple[list[float], list[list[int]]]:
    """Each prompt token's logprob given what precedes it (positions 1...), and the top ids there."""
    with torch.no_grad():
        logp = model(torch.tensor([prompt]))[0].float().log_softmax(-1)  # [S, V]
    chosen = [float(logp[p - 1, prompt[p]]) for p in range(1, len(prompt))]
    return chosen, [logp[p - 1].topk(PROMPT_TOP).indices.tolist() for p in range(1, len(prompt))]


def check(events, model, prompt, k: int) -> None:
    entries = events[0].prompt_logprobs
    assert entries is not None and len(entries) == len(prompt) and entries[0] is None
    chosen, top = reference(model, prompt)
    assert [e.logprob for e in entries[1:]] == pytest.approx(chosen, abs=1e-4)
    assert [e.top_ids[:k] for e in entries[1:]] == [t[:k] for t in top]
    assert all(events[i].prompt_logprobs is None for i in range(1, len(events)))


def test_prompt_logprobs_equal_a_full_forward_in_chunks_and_from_the_cache(tiny):
    loop = ServingLoop(DecoderEngine(tiny), kv_bytes=10 ** 7, block_size=4, max_step_tokens=10)
    prompts = random_prompts(6, longest=30, seed=3)
    for prompt, events in zip(prompts, run_all(loop, prompts, ONE, prompt_logprobs=2)):
        check(events, tiny, prompt, 2)  # prefills of up to 30 tokens in chunks of at most 10
    kept = len(loop.prompt_store.entries)
    assert kept >= sum(len(p) // 4 for p in prompts) - 6, "the full prompt blocks' entries are kept"
    hits = loop.blocks.hit_tokens
    longer = [p + [5, 6, 7, 8, 9] for p in prompts]
    for prompt, events in zip(longer, run_all(loop, longer, ONE, prompt_logprobs=3)):
        check(events, tiny, prompt, 3)
    assert loop.blocks.hit_tokens > hits, "the cached prefixes were used (less their last block)"


def test_a_prefix_cached_without_logprobs_is_computed_again(tiny):
    loop = ServingLoop(DecoderEngine(tiny), kv_bytes=10 ** 7, block_size=4)
    prompt = random_prompts(1, longest=30, seed=5)[0] + list(range(10, 30))
    run_all(loop, [prompt], ONE)  # its blocks are cached, with no logprobs kept
    assert not loop.prompt_store.entries
    check(run_all(loop, [prompt + [3]], ONE, prompt_logprobs=1)[0], tiny, prompt + [3], 1)


def test_max_tokens_zero_runs_the_prompt_only(tiny):
    loop = ServingLoop(DecoderEngine(tiny), kv_bytes=10 ** 7, block_size=4)
    prompt = [5, 9, 2, 7, 11, 3, 8]
    events = run_all(loop, [prompt], ONE, prompt_logprobs=0, generate=False)[0]
    assert len(events) == 1 and events[0].token is None and events[0].finish_reason == "length"
    check(events, tiny, prompt, 0)
    assert loop.blocks.used == 0 and not loop.scheduler.running
