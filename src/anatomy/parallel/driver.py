"""ParallelEngine: rank 0's engine, a DecoderEngine over rank 0's shard whose every call that runs the
model is first sent to the other ranks, which make the same call on their shards (follower.py).

    engine = ParallelEngine(shard, world)        # rank 0; the others run follow(DecoderEngine(shard), world)
    logits = engine.step(cache, chunks)          # paged_cache and step are mirrored: serving, and every
    run = engine.start(prompts, params)          # generation's run, whose steps are engine.step

Input rank 0 refuses is refused before any order goes out; a step refused on every rank raises the
same InputError everywhere. The decode step runs eagerly: a traced graph cannot hold the
collectives' process groups (capture.py).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from anatomy.errors import InputError, ParallelError
from anatomy.inference.engine import Chunk, DecoderEngine, PagedKVCache
from anatomy.parallel.channel import Channel
from anatomy.parallel.collectives import tagged, waiting


class ParallelEngine(DecoderEngine):
    """A DecoderEngine whose model calls are mirrored on every rank of `world` (world.py)."""

    def __init__(self, shard: nn.Module, world, *, attention: str | None = None, plan_cache: bool = True,
                 kv_dtype: str | None = None, channel: Channel | None = None) -> None:
        super().__init__(shard, capture=False, attention=attention, plan_cache=plan_cache, kv_dtype=kv_dtype)
        self.shard, self.world = shard, world
        if channel is None:
            channel = Channel(world.control)
            channel.start_heartbeat()
        self.channel = channel
        self._stage = threading.Lock()  # rank 0's own stage: one step at a time, in the orders' order
        self._cache_ids = itertools.count()

    @property
    def layout(self):
        return self.world.layout

    @contextlib.contextmanager
    def mirrored(self, op: str, *args: Any) -> Iterator[None]:
        """Send the order, then run rank 0's part of it inside. Rank 0's stage runs one step at a time
        in the orders' order; it lets the next step in as soon as it waits for the last stage's logits,
        so that steps from several threads (a pipeline's serving lanes) overlap on the stages. A failed
        collective marks the run lost."""
        self._stage.acquire()
        held = [True]

        def release() -> None:
            if held[0]:
                held[0] = False
                self._stage.release()

        try:
            number = self.channel.send(op, *args)
            with tagged(number), waiting(release), watched(self.channel):
                yield
        finally:
            release()

    def logits(self, ids: Tensor, *, attention_mask: Tensor | None = None) -> Tensor:
        """ids [B, S] -> logits [B, S, V] of one full pass, on every rank."""
        mask = None if attention_mask is None else attention_mask.tolist()
        with torch.inference_mode(), self.mirrored("logits", ids.tolist(), mask):
            return self.head(super().hidden_states(ids, attention_mask=attention_mask))

    def hidden_states(self, ids: Tensor, *, attention_mask: Tensor | None = None) -> Tensor:
        raise InputError("a tensor- or pipeline-parallel engine gives no hidden states apart from its logits "
                         "(the head runs on every rank): use engine.logits(ids)")

    def paged_cache(self, *, num_blocks: int, block_size: int, window_blocks: int | None = None) -> PagedKVCache:
        cache = super().paged_cache(num_blocks=num_blocks, block_size=block_size, window_blocks=window_blocks)
        cache.parallel_id = next(self._cache_ids)
        self.channel.send("paged_cache", cache.parallel_id, num_blocks, block_size, window_blocks)
        return cache

    def step(self, cache: PagedKVCache, chunks: list[Chunk], *, blocks: int | None = None) -> Tensor:
        with self.mirrored("step", cache.parallel_id, chunks, blocks):
            return super().step(cache, chunks, blocks=blocks)

    def close(self) -> None:
        """The other ranks leave their loop (the process group stays up: world.leave ends it)."""
        self.channel.close()


@contextlib.contextmanager
def watched(channel: Channel) -> Iterator[None]:
    """A collective of the step that fails (a rank gone) marks the run lost: the server stops."""
    try:
        yield
    except ParallelError as exc:
        channel.lose(exc)
