"""The sliding-window layers' own group of KV blocks in the serving loop (serving/window_blocks.py):
blocks wholly outside a sequence's window are given back as it goes, and greedy output stays the
engine's own (static cache, rings) alone, 16 at once, from the prefix cache, after preemption and
while speculating."""

from __future__ import annotations

import pytest

from anatomy.inference.engine import DecoderEngine, PagedKVCache
from anatomy.inference.sampling import SamplingParams
from anatomy.serving.blocks import BlockManager
from anatomy.serving.loop import ServingLoop, split_blocks
from anatomy.serving.scheduler import Scheduler
from anatomy.serving.window_blocks import WindowBlocks

from ..inference.conftest import gemma3_tiny, gpt_oss_tiny
from .conftest import engine_tokens, random_prompts, run_all
from .test_scheduler import run_step, seq

GREEDY = SamplingParams(max_new_tokens=12, ignore_eos=True)


def test_the_split_gives_the_window_group_what_its_sequences_hold_at_once():
    config = gemma3_tiny().config  # window 4; layers 0 and 1 windowed, layer 2 full
    whole = PagedKVCache.block_bytes(config, 4, "f32")
    assert PagedKVCache.block_bytes(config, 4, "f32", windowed=True) == 2 * whole // 3
    full, window = split_blocks(config, 1000 * whole, 4, "f32", max_seqs=8, max_step_tokens=16)
    assert window == 8 * (-(-(4 + 16) // 4) + 1)  # each sequence: its window, a step's tokens, one block more
    assert full == (1000 * whole - window * 2 * whole // 3) // (whole // 3)
    assert split_blocks(config, 40 * whole, 4, "f32", max_seqs=8, max_step_tokens=16) == (40, None), \
        "one group where an even split holds no more"
    assert split_blocks(config.replace(sliding_window=None, sliding_window_layers=None, sliding_rope_theta=None),
                        1000 * whole, 4, "f32",
                        max_seqs=8, max_step_tokens=16) == (1000, None)


def test_a_sequence_gives_back_the_blocks_behind_its_window():
    window = WindowBlocks(BlockManager(64, 4), window=6)
    s = Scheduler(BlockManager(64, 4), max_seqs=4, max_step_tokens=8, window=window)
    a = seq(30)
    s.add(a)
    for _ in range(8):
        run_step(s)
    # 34 tokens computed: the next query (position 34) reads keys 29..34, blocks 7 and 8
    assert a.computed == 34 and len(a.blocks) == len(a.window_blocks) == 9
    assert a.window_blocks[:7] == [-1] * 7 and min(a.window_blocks[7:]) >= 0
    assert window.manager.used == 2 and s.blocks.used == 9
    s.finish(a)
    assert window.manager.used == 0 and s.blocks.used == 0 and a.window_blocks == []


@pytest.mark.parametrize("make", [gemma3_tiny, gpt_oss_tiny], ids=["gemma3", "gpt-oss"])
def test_windowed_serving_gives_the_engines_tokens(make):
    engine = DecoderEngine(make())
    prompts = random_prompts(16, longest=60)
    solo = [engine_tokens(engine, p, GREEDY) for p in prompts]
    loop = ServingLoop(engine, kv_bytes=10 ** 6, block_size=4, max_seqs=16, max_step_tokens=24)
    assert loop.window is not None and loop.cache.window_blocks == loop.window.manager.num_blocks
    events = [[] for _ in prompts]
    for i, prompt in enumerate(prompts):
        loop.submit(prompt, GREEDY, events[i].append)
    held = []
    while loop.step():
        held.append(max((sum(b >= 0 for b in q.window_blocks) for q in loop.scheduler.running), default=0))
    assert [[e.token for e in ev] for ev in events] == solo, "16 at once, prefills chunked"
    assert max(held) <= -(-(4 + 24) // 4) + 1, "a sequence holds its window and a step's tokens"
    assert loop.window.manager.used == 0 and loop.blocks.used == 0
    again = [run_all(loop, [p], GREEDY)[0] for p in prompts[:4] for _ in range(2)]
    assert [[e.token for e in ev] for ev in again] == [t for t in solo[:4] for _ in range(2)], \
        "prefixes from both groups' cached blocks"
    assert loop.blocks.hit_tokens > 0


def test_windowed_serving_preempts_and_speculates_to_the_same_tokens():
    engine = DecoderEngine(gemma3_tiny())
    prompts = random_prompts(8, longest=60, seed=3)
    solo = [engine_tokens(engine, p, GREEDY) for p in prompts]
    whole = PagedKVCache.block_bytes(engine.config, 4, engine.kv_dtype)
    tight = ServingLoop(engine, kv_bytes=20 * whole, block_size=4, max_seqs=4, max_step_tokens=8)
    assert tight.window is not None
    assert [[e.token for e in ev] for ev in run_all(tight, prompts, GREEDY)] == solo
    assert tight.scheduler.preemptions > 0, "the full layers. 28 blocks cannot hold 4 sequences"
    loop = ServingLoop(engine, kv_bytes=10 ** 6, block_size=4, max_seqs=8, max_step_tokens=24)
    speculated = run_all(loop, prompts, GREEDY, speculative_tokens=3)
    assert [[e.token for e in ev] for ev in speculated] == solo
    assert loop.metrics.draft_tokens > 0
