"""Joining the ranks: the process group torchrun (or `anatomy ... --tensor-parallel-size N`, which
starts torch's own launcher, launch.py) set up, and the groups the parallel modules talk over.

    world = join(Layout(tp=2, pp=1))      # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment
    world.place                           # this rank's stage, tp rank and tensor-parallel Comm (shard.py)
    world.control                         # the gloo group rank 0's orders go over (channel.py), on any device
    leave(world)

gloo on CPUs, NCCL on GPUs; every collective times out after ANATOMY_PARALLEL_TIMEOUT seconds (300).
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from anatomy.errors import InputError
from anatomy.parallel.collectives import Comm
from anatomy.parallel.layout import PP_OPTION, TP_OPTION, Layout
from anatomy.parallel.shard import Place

TIMEOUT_ENV = "ANATOMY_PARALLEL_TIMEOUT"
DEFAULT_TIMEOUT_S = 300.0


@dataclass
class World:
    layout: Layout
    rank: int
    device: torch.device
    place: Place
    control: object  # the gloo process group of the orders

    @property
    def is_driver(self) -> bool:
        return self.rank == 0


def launched() -> bool:
    """Is this process one of several ranks (started by torchrun or by anatomy's launcher)?"""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def timeout_s() -> float:
    value = os.environ.get(TIMEOUT_ENV, str(DEFAULT_TIMEOUT_S))
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise InputError(f"{TIMEOUT_ENV}={value!r} must be a positive number of seconds")
    return seconds


def join(layout: Layout) -> World:
    """This rank's place in `layout`, the process groups made (every rank makes every group, in order)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size != layout.world:
        raise InputError(f"{size} ranks were started (WORLD_SIZE), but {TP_OPTION} {layout.tp} x {PP_OPTION} "
                         f"{layout.pp} needs {layout.world}")
    device = _device()
    timeout = datetime.timedelta(seconds=timeout_s())
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=timeout, **({"device_id": device} if device.type == "cuda" else {}))
    rank = dist.get_rank()
    tp = None
    for stage in range(layout.pp):
        ranks = [layout.rank(stage, r) for r in range(layout.tp)]
        group = dist.new_group(ranks, timeout=timeout)
        if rank in ranks:
            tp = Comm(group, ranks=ranks, rank=rank)
    control = dist.new_group(backend="gloo", timeout=timeout)
    return World(layout, rank, device, Place(layout, rank, tp), control)


def leave(world: World | None) -> None:
    if world is not None and dist.is_initialized():
        dist.destroy_process_group()


def _device() -> torch.device:
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")
