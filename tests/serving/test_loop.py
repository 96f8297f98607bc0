"""The serving loop against the engine: greedy output is the same alone, in a batch of 16, from cached
prefix blocks and after preemption; cancelling frees at once; sampling options behave as the engine's."""

from __future__ import annotations

import pytest
import torch

from anatomy.inference.engine import DecoderEngine
from anatomy.inference.sampling import SamplingParams
from anatomy.serving.loop import ServingLoop
from anatomy.inference.engine import PagedKVCache

from .conftest import engine_tokens, random_prompts, run_all

GREEDY = SamplingParams(max_new_tokens=12, ignore_eos=True)


def tokens_of(events) -> list[int]:
    return [e.token for e in events]


def test_greedy_alone_batched_and_from_the_prefix_cache_equal_the_engine(tiny):
    engine = DecoderEngine(tiny)
    prompts = random_prompts(16)
    solo = [engine_tokens(engine, p, GREEDY) for p in prompts]
    loop = ServingLoop(engine, kv_bytes=10 ** 7, block_size=4, max_step_tokens=24)
    assert [tokens_of(run_all(loop, [p], GREEDY)[0]) for p in prompts[:3]] == solo[:3], "alone"
    hits = loop.blocks.hit_tokens
    batch = run_all(loop, prompts, GREEDY)
    assert [tokens_of(e) for e in batch] == solo, "16 at once, prefills chunked"
    assert loop.blocks.hit_tokens > hits, "the first three prompts' blocks were reused"
    again = run_all(loop, prompts, GREEDY)
    assert [tokens_of(e) for e in again] == solo, "every full prompt block from the prefix cache"
    assert loop.blocks.used == 0 and loop.scheduler.running == [] and not loop.scheduler.waiting


def test_compact_weights_run_on_the_engines_planned_kernels(int4_tiny):
    """weights="int4" (what `anatomy serve` keeps of a Q4 GGUF by default): the loop computes with the
    engine's planned view, so a request alone gives the engine's own greedy tokens on that view."""
    engine = DecoderEngine(int4_tiny)
    loop = ServingLoop(engine, kv_bytes=10 ** 7, block_size=4)
    for prompt in random_prompts(3, vocab=96, longest=16):
        assert tokens_of(run_all(loop, [prompt], GREEDY)[0]) == engine_tokens(engine, prompt, GREEDY)


@pytest.mark.parametrize("fields", [
    dict(sliding_window=3, sliding_window_layers=(0,)),  # prompts longer than the window, one windowed layer
    dict(rope_scaling=dict(kind="dynamic", factor=2.0, original_max_seq_len=6)),  # angles by each row's reach
    dict(n_experts=4, n_experts_per_token=2, qk_norm=True),
    dict(position="alibi"),
], ids=["sliding-window", "dynamic-ntk", "moe", "alibi"])
def test_the_new_parts_decode_as_a_full_forward_does(fields):
    """Window masks, per-row RoPE reach, experts and ALiBi through the paged cache: each greedy token,
    in a batch of rows of different lengths, is the argmax of a full forward over that row alone."""
    from anatomy import build_model, get_preset

    torch.manual_seed(0)
    model = build_model(get_preset("llama-7b", vocab_size=97, d_model=64, n_heads=4, max_seq_len=64, n_layers=2,
                                   n_kv_heads=2, d_ff=96, **fields)).eval()
    prompts = [[5, 9, 2, 7, 11, 3, 8], [4, 6], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]
    loop = ServingLoop(DecoderEngine(model), kv_bytes=10 ** 6, block_size=4)
    for prompt, events in zip(prompts, run_all(loop, prompts, SamplingParams(max_new_tokens=6, ignore_eos=True))):
        ids = list(prompt)
        with torch.no_grad():
            for token in tokens_of(events):
                assert token == int(model(torch.tensor([ids]))[0, -1].argmax())
                ids.append(token)


def test_preemption_recomputes_to_the_same_output(tiny):
    engine = DecoderEngine(tiny)
    prompts = random_prompts(16, seed=2)
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    solo = [engine_tokens(engine, p, params) for p in prompts]
    block = PagedKVCache.block_bytes(tiny.config, 4, torch.float32)
    loop = ServingLoop(engine, kv_bytes=20 * block, block_size=4, max_step_tokens=24)
    out = run_all(loop, prompts, params)
    assert loop.scheduler.preemptions > 0, "20 blocks of 4 cannot hold 16 sequences"
    assert [tokens_of(e) for e in out] == solo


def finishing(loop, lows, high, *, warmup: int) -> tuple[list[int], list[list[int]]]:
    """Submit the low-priority prompts (priority 1 where the policy ranks, else 0), run `warmup` steps,
    submit the high-priority one (0); the order in which they finish (the high one is index len(lows))
    and each one's tokens."""
    ranked = loop.scheduler.policy == "priority"
    events, order = [[] for _ in range(len(lows) + 1)], []

    def sink(i):
        def take(event):
            events[i].append(event)
            if event.finish_reason is not None:
                order.append(i)
        return take

    for i, prompt in enumerate(lows):
        loop.submit(prompt, LONG, sink(i), priority=int(ranked))
    for _ in range(warmup):
        loop.step()
    loop.submit(high, SHORT, sink(len(lows)))
    while loop.step():
        pass
    return order, [tokens_of(e) for e in events]


LONG, SHORT = SamplingParams(max_new_tokens=24, ignore_eos=True), SamplingParams(max_new_tokens=4, ignore_eos=True)


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("full", ["slots", "blocks"])
def test_a_high_priority_request_into_a_full_loop_finishes_first(tiny, policy, full):
    """Every batch slot (or every KV block) is held by long low-priority sequences when a short
    high-priority one arrives: under "priority" the worst-ranked running one is preempted and the new
    one finishes first; under "fcfs" (the default) it waits its turn and finishes last. Greedy outputs,
    preempted or not, are each prompt's alone (fp32)."""
    engine = DecoderEngine(tiny)
    g = torch.Generator().manual_seed(4)
    lows, high = [torch.randint(3, 97, (12,), generator=g).tolist() for _ in range(3)], [5, 9, 2, 7, 11]
    block = PagedKVCache.block_bytes(tiny.config, 4, torch.float32)
    # blocks: after 8 steps the three hold 20 tokens each, 5 blocks of 4: all 15 of the pool
    size = dict(max_seqs=3, kv_bytes=10 ** 7) if full == "slots" else dict(max_seqs=8, kv_bytes=15 * block)
    loop = ServingLoop(engine, block_size=4, max_step_tokens=64, scheduling_policy=policy, **size)
    order, outputs = finishing(loop, lows, high, warmup=8)
    assert (order[0] == len(lows)) == (policy == "priority"), order
    assert (loop.scheduler.preemptions > 0) == (policy == "priority" or full == "blocks")
    assert outputs == [engine_tokens(engine, p, LONG) for p in lows] + [engine_tokens(engine, high, SHORT)]
    assert loop.blocks.used == 0


def test_a_priority_needs_the_priority_policy(tiny):
    loop = ServingLoop(DecoderEngine(tiny), kv_bytes=10 ** 7, block_size=4)
    with pytest.raises(ValueError, match="priority 3 needs the priority scheduling policy"):
        loop.submit([5, 6, 7], SHORT, lambda e: None, priority=3)


def test_penalties_and_seeded_sampling_match_the_engine(tiny):
    engine = DecoderEngine(tiny)
    prompt = random_prompts(1, seed=3)[0]
    for params in (SamplingParams(max_new_tokens=16, presence_penalty=1.5, frequency_penalty=0.5,
                                  repetition_penalty=1.3, ignore_eos=True),
                   SamplingParams(max_new_tokens=16, temperature=0.9, top_k=20, top_p=0.9, seed=7, ignore_eos=True)):
        loop = ServingLoop(engine, kv_bytes=10 ** 7, block_size=4)
        assert tokens_of(run_all(loop, [prompt], params)[0]) == engine_tokens(engine, prompt, params)


def test_seeds_reproduce_and_differ(tiny):
    loop = ServingLoop(DecoderEngine(tiny), kv_bytes=10 ** 7, block_size=4)
    prompt = random_prompts(1)[0]
    runs = [tokens_of(run_all(loop, [prompt], SamplingParams(max_new_tokens=16, temperature=1.0, seed=s,
                                                              ignore_eos=True))[0]) for s in (1, 1, 2)]
    assert runs[0] == runs[1] and runs[0] != runs[2]


@torch.inference_mode()
def test_logprobs_are_the_models(tiny):
    assert_logprobs_are_the_models(tiny)


def test_a_logit_soft_cap_is_applied_as_the_models_forward_does():
    from anatomy import build_model, get_preset

    torch.manual_seed(0)
    capped = build_model(get_preset("llama-7b", vocab_size=97, d_model=64, n_heads=4, max_seq_len=64, n_layers=2,
                                    n_kv_heads=2, d_ff=96, logit_softcap=0.5)).eval()
    assert_logprobs_are_the_models(capped)


@torch.no_grad()
def assert_logprobs_are_the_models(model) -> None:
    """The loop's logprobs of 3 greedy tokens equal the log-softmax of the model's own forward."""
    loop = ServingLoop(DecoderEngine(model), kv_bytes=10 ** 7, block_size=4)
    prompt = random_prompts(1)[0]
    events = run_all(loop, [prompt], SamplingParams(max_new_tokens=3, ignore_eos=True), logprobs=5)[0]
    ids = list(prompt)
    for event in events:
        expected = model(torch.tensor([ids]))[0, -1].log_softmax(-1)
        top = expected.topk(5)
        assert abs(event.logprob.logprob - float(expected[event.token])) < 1e-4
        assert event.logprob.top_ids == top.indices.tolist() and event.token == top.indices[0]
        assert torch.allclose(torch.tensor(event.logprob.top_logprobs), top.values, atol=1e-4)
        ids.append(event.token)


def test_a_cancelled_sequence_frees_its_blocks_within_one_step(tiny):
    loop = ServingLoop(DecoderEngine(tiny), kv_bytes=10 ** 7, block_size=4)
    events = []
    seq = loop.submit(random_prompts(1)[0], SamplingParams(max_new_tokens=30, ignore_eos=True), events.append)
    loop.step()
    loop.step()
    assert loop.blocks.used > 0 and len(events) == 2
    loop.cancel(seq)
    assert not loop.step(), "the cancel is taken at the start of the next step, leaving nothing to run"
    assert loop.blocks.used == 0 and seq.finished and len(events) == 2


def test_length_and_context_limits(tiny):
    loop = ServingLoop(DecoderEngine(tiny), kv_bytes=10 ** 7, block_size=4)
    events = run_all(loop, [[5, 6, 7]], SamplingParams(max_new_tokens=4, ignore_eos=True))[0]
    assert len(events) == 4 and events[-1].finish_reason == "length"
    assert [e.finish_reason for e in events[:-1]] == [None] * 3
    with pytest.raises(ValueError, match="more than the context of 64"):
        loop.submit([1] * 60, SamplingParams(max_new_tokens=5), lambda e: None)


@pytest.mark.slow
def test_smollm2_sixteen_at_once_equal_the_engine_alone(smollm2, smollm2_tokenizer):
    """The real model, fp32: 16 chat prompts decoded together (prefilled in chunks of a 256-token
    budget) give each prompt's greedy tokens from the engine alone, and so do they again from the
    prefix cache."""
    from anatomy.inference.generate import encode_prompt

    engine = DecoderEngine(smollm2)
    questions = ["What is the capital of France?", "Name three rivers.", "What is 7 times 8?", "Say hello.",
                 "What color is the sky?", "Who wrote Hamlet?", "Define gravity.", "What is Python?",
                 "Count to five.", "What is a cat?", "Why is the sea salty?", "What is the moon?",
                 "Give me a fruit.", "What is rain?", "Name a planet.", "What is music?"]
    prompts = [encode_prompt([{"role": "user", "content": q}], smollm2_tokenizer) for q in questions]
    params = SamplingParams(max_new_tokens=20)
    loop = ServingLoop(engine, smollm2_tokenizer, kv_bytes=2 ** 28, max_step_tokens=256)
    together = [tokens_of(events) for events in run_all(loop, prompts, params)]
    alone = []
    for p in prompts:  # the engine alone, up to and with the EOS (which the loop reports as its last token)
        ids = engine_tokens(engine, p, params)
        alone.append(ids[:ids.index(2) + 1] if 2 in ids else ids)
    assert together == alone
    hits = loop.blocks.hit_tokens
    assert [tokens_of(events) for events in run_all(loop, prompts, params)] == alone, "from cached prefix blocks"
    assert loop.blocks.hit_tokens - hits >= 16 * 16, "every prompt's full blocks were reused"


def test_a_failing_step_ends_its_sequences_with_an_error_and_the_loop_goes_on(tiny, capsys):
    import queue

    engine = DecoderEngine(tiny)
    loop = ServingLoop(engine, kv_bytes=10 ** 7, block_size=4)
    step, calls = engine.step, []

    def broken(cache, chunks, **options):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug in a step")
        return step(cache, chunks, **options)

    engine.step = broken  # this test's own engine
    loop.start()
    try:
        events: queue.Queue = queue.Queue()
        loop.submit([5, 6, 7], GREEDY, events.put)
        failed = events.get(timeout=30)
        assert failed.finish_reason == "error" and "internal error" in failed.error
        assert loop.blocks.used == 0 and not loop.scheduler.running
        done = queue.Queue()
        loop.submit([5, 6, 7], GREEDY, done.put)
        assert [done.get(timeout=30).token for _ in range(12)][-1] is not None
    finally:
        loop.stop()
    assert "RuntimeError: a bug in a step" in capsys.readouterr().err
