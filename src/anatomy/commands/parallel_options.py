"""--tensor-parallel-size and --pipeline-parallel-size of `anatomy generate` and `anatomy serve`: one
model on several ranks (anatomy/parallel/, docs/parallel.md).

    layout = layout_of(args)                        # Layout(tp, pp); world 1 when neither is given
    if layout.world > 1 and not launched():
        return start_ranks(args, layout)            # this process becomes the launcher of world ranks
    with rank_engine(args, layout) as engine:       # this process is a rank: rank 0 gets its engine,
        ...                                         # the others follow rank 0 until it stops (None)
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

from anatomy.errors import InputError


def add_parallel_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("parallel: one model on several ranks (processes started here, or by torchrun)")
    g.add_argument("--tensor-parallel-size", type=int, default=1, metavar="N",
                   help="split every block's heads and FFN columns, and the vocabulary, over N ranks (two "
                        "all-reduces per block); gloo on CPUs, NCCL on GPUs")
    g.add_argument("--pipeline-parallel-size", type=int, default=1, metavar="M",
                   help="split the blocks into M stages on M ranks each (hidden states sent from stage to stage)")


def layout_of(args: argparse.Namespace):
    from anatomy.parallel.layout import Layout

    return Layout(tp=args.tensor_parallel_size, pp=args.pipeline_parallel_size)


def check_parallel(args: argparse.Namespace, layout) -> None:
    """What a parallel run refuses, before any rank starts: options it does not support, sizes that do not divide."""
    from anatomy.checkpoints.loader import load_config
    from anatomy.errors import CheckpointError
    from anatomy.parallel.layout import check_layout

    if getattr(args, "compile", False):
        raise InputError("--compile does not run with --tensor-parallel-size / --pipeline-parallel-size: the decode "
                         "step of a sharded model runs eagerly")
    if getattr(args, "speculative", None):
        raise InputError("--speculative does not run with --tensor-parallel-size / --pipeline-parallel-size yet")
    try:
        config = load_config(args.model)
    except CheckpointError as exc:
        raise InputError(f"--model: {exc}") from None
    check_layout(config, layout)


def start_ranks(args: argparse.Namespace, layout) -> int:
    """This process launches the ranks (each runs the same command line) and waits for them."""
    from anatomy.parallel.launch import launch

    return launch(args.argv, world=layout.world, command=args.command)


def launched() -> bool:
    """Is this process one of the ranks (started by the launcher or torchrun)?"""
    from anatomy.parallel.world import launched as is_rank

    return is_rank()


def is_follower() -> bool:
    """Is this process a rank other than 0 (which serves HTTP and drives the others)?"""
    return launched() and int(os.environ.get("RANK", "0")) != 0


@contextlib.contextmanager
def rank_engine(args: argparse.Namespace, layout, *, load: Callable[[], Any] | None = None) -> Iterator[Any]:
    """This process as one rank of `layout`: the process group joined, the model (`load()`, by default
    --model at --dtype and --weights) loaded and cut to this rank's shard; rank 0 gets its
    ParallelEngine (closed on the way out), every other rank follows rank 0's calls until it stops
    and then gets None."""
    from anatomy.checkpoints.loader import load as default_load
    from anatomy.parallel.launch import LAUNCHED_ENV, watch_parent
    from anatomy.parallel.ranks import sharded_engine
    from anatomy.parallel.world import join, leave

    if os.environ.get(LAUNCHED_ENV):
        watch_parent()
    world = join(layout)
    engine = None
    try:
        model = load() if load is not None else default_load(args.model, dtype=args.dtype, weights=args.weights)
        engine = sharded_engine(model, world, kv_dtype=getattr(args, "kv_dtype", None))
        del model  # the shard holds what this rank needs
        yield engine
    finally:
        if engine is not None:
            engine.close()
        leave(world)

