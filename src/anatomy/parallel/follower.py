"""The ranks other than 0: each runs the engine of its own shard and makes, in order, the calls
rank 0's ParallelEngine sends it (driver.py), until rank 0 says stop.

    follow(DecoderEngine(shard, capture=False), channel)     # returns when rank 0 closes its engine

A call the engine refuses (an InputError: rank 0 raised the same and tells its caller) is dropped;
anything else ends the rank with its traceback, and the launcher stops the others.
"""

from __future__ import annotations

import torch

from anatomy.errors import InputError
from anatomy.inference.engine import DecoderEngine
from anatomy.parallel.channel import Channel
from anatomy.parallel.collectives import tagged


class Follower:
    """The paged caches rank 0 made, by id, and the engine calls that act on them."""

    def __init__(self, engine: DecoderEngine) -> None:
        self.engine = engine
        self.caches: dict[int, object] = {}

    def logits(self, ids: list[list[int]], mask: list[list[int]] | None) -> None:
        self.engine.logits(self._tensor(ids), attention_mask=None if mask is None else self._tensor(mask))

    def paged_cache(self, cache_id: int, num_blocks: int, block_size: int, window_blocks: int | None = None) -> None:
        self.caches[cache_id] = self.engine.paged_cache(num_blocks=num_blocks, block_size=block_size,
                                                        window_blocks=window_blocks)

    def step(self, cache_id: int, chunks, blocks: int | None = None) -> None:
        self.engine.step(self.caches[cache_id], chunks, blocks=blocks)

    def ping(self) -> None:
        pass

    def _tensor(self, values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.engine.device)


CALLS = ("logits", "paged_cache", "step", "ping")


def follow(engine: DecoderEngine, channel: Channel) -> int:
    """Make rank 0's calls until it says stop; the number of calls made."""
    follower = Follower(engine)
    made = 0
    while True:
        op, args, _, number = channel.receive()
        if op == "stop":
            return made
        if op not in CALLS:
            raise RuntimeError(f"rank 0 sent an unknown order {op!r}")
        try:
            with tagged(number):
                getattr(follower, op)(*args)
        except InputError:
            pass  # rank 0 refused the same call and tells its caller
        made += 1
