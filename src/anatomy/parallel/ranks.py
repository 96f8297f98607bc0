"""A rank's engine: rank 0 drives, every other rank follows.

    engine = sharded_engine(model, world)   # rank 0: a ParallelEngine over its shard; any other rank:
                                            # follows rank 0's calls on its own shard until rank 0
                                            # closes its engine, then None
"""

from __future__ import annotations

from torch import nn

from anatomy.inference.engine import DecoderEngine
from anatomy.parallel.channel import Channel
from anatomy.parallel.driver import ParallelEngine
from anatomy.parallel.follower import follow
from anatomy.parallel.shard import shard_model


def sharded_engine(model: nn.Module, world, **options) -> ParallelEngine | None:
    """`options` are DecoderEngine's (attention, plan_cache); the decode step is never captured."""
    shard = shard_model(model, world.place)
    if world.is_driver:
        return ParallelEngine(shard, world, **options)
    follow(DecoderEngine(shard, capture=False, **options), Channel(world.control, start_heartbeat=False))
    return None
