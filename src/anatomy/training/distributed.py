"""Data parallelism under torchrun: DDP (every rank holds the whole model, gradients are averaged)
or FSDP2 (`fully_shard`: parameters, gradients and optimizer state are sharded over the ranks,
each block gathered just in time). gloo on CPU, nccl on GPU.

Only rank 0 logs and writes the run's files; full (unsharded) state dicts are gathered to it when a
checkpoint is written, so a checkpoint does not depend on how many ranks wrote it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn

STRATEGIES = ("ddp", "fsdp")


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1


def init_distributed() -> Dist:
    """Join the process group torchrun set up (RANK/WORLD_SIZE in the environment), or run alone."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if world > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank = dist.get_rank() if world > 1 else 0
    return Dist(rank=rank, world=world, local_rank=local_rank, device=device)


def shutdown(info: Dist) -> None:
    if info.active and dist.is_initialized():
        dist.destroy_process_group()


def wrap(model: nn.Module, strategy: str, info: Dist) -> nn.Module:
    """The module to run forward/backward through. FSDP2 shards each block, then the rest (embeddings,
    head, final norm) at the root; the model object itself is modified in place."""
    if not info.active:
        return model
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[info.device.index] if info.device.type == "cuda" else None)
    from torch.distributed.fsdp import fully_shard

    for module in model.modules():
        if isinstance(module, nn.ModuleList):
            for block in module:
                fully_shard(block)
    fully_shard(model)
    return model


@contextlib.contextmanager
def gradient_sync(wrapped: nn.Module, *, enabled: bool) -> Iterator[None]:
    """Skip the gradient all-reduce on all but the last micro-step of an accumulation."""
    if enabled or not isinstance(wrapped, nn.Module):
        yield
    elif hasattr(wrapped, "no_sync"):  # DDP
        with wrapped.no_sync():
            yield
    elif hasattr(wrapped, "set_requires_gradient_sync"):  # FSDP2
        wrapped.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            wrapped.set_requires_gradient_sync(True)
    else:
        yield


def all_reduce_sum(t: Tensor, info: Dist) -> Tensor:
    if info.active:
        t = t.clone()
        dist.all_reduce(t)
    return t


def barrier(info: Dist) -> None:
    if info.active:
        dist.barrier()


def launch(argv: list[str], nproc: int) -> int:
    """Re-run `anatomy <argv>` under torchrun with nproc processes on this machine."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "anatomy", *argv]
    return subprocess.call(cmd)
