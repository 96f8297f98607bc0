"""A rank's engine: rank 0 drives, every other rank follows.

    engine = sharded_engine(model, world)   # rank 0: a ParallelEngine over its shard; any other rank:
                                            # follows rank 0's calls on its own shard until rank 0
                                            # closes its engine, then None

Rank 0 plans its kernels first, alone on the machine (a cleaner measurement), while the others
wait; a rank whose shard has the same shapes then finds the plan in the plan cache. All ranks
are ready before rank 0's first call, so its first step's time is the step's own.
"""

from __future__ import annotations

import datetime

import torch.distributed as dist
from torch import nn

from anatomy.inference.engine import DecoderEngine
from anatomy.parallel.channel import Channel
from anatomy.parallel.driver import ParallelEngine
from anatomy.parallel.follower import follow
from anatomy.parallel.shard import shard_model

STARTUP_TIMEOUT_S = 3600.0  # a rank measuring its kernel plan waits for no one; the others wait this long


def sharded_engine(model: nn.Module, world, **options) -> ParallelEngine | None:
    """`options` are DecoderEngine's (attention, plan_cache, kv_dtype); the decode step is never captured."""
    shard = shard_model(model, world.place)
    if world.device.type != "cpu":  # NCCL: each rank's shard on its own GPU (untested here: no GPU was at hand)
        shard = shard.to(world.device)
    channel = Channel(world.control)
    if world.is_driver:
        engine = ParallelEngine(shard, world, channel=channel, **options)
        _barrier(world)  # the others plan now
        _barrier(world)  # every rank ready
        channel.start_heartbeat()
        return engine
    _barrier(world)
    engine = DecoderEngine(shard, capture=False, **options)
    _barrier(world)
    follow(engine, channel)
    return None


def _barrier(world) -> None:
    """Every rank here; a rank that does not come is named (gloo's monitored barrier)."""
    dist.monitored_barrier(group=world.control, timeout=datetime.timedelta(seconds=STARTUP_TIMEOUT_S))
