"""Rank 0's orders to the other ranks: which engine call to make next, with its arguments.

    channel = Channel(world.control)              # rank 0
    channel.send("decode", run_id, [17, 4])       # every other rank receives it before rank 0 computes
    op, args = channel.receive()                  # the others (follower.py), in the order sent

An order is a small picklable tuple broadcast over a gloo group, whatever device the model runs on;
the model's own tensors never go through it. While idle, rank 0 sends a "ping" every HEARTBEAT_S
seconds; a failed send or receive (a rank gone) is a ParallelError and runs the `on_lost` callbacks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from anatomy.errors import ParallelError

HEARTBEAT_S = 5.0


class Channel:
    """The sending end (rank 0) and, with `receive`, the receiving end of the orders."""

    def __init__(self, group, *, heartbeat_s: float = HEARTBEAT_S) -> None:
        self.group, self.heartbeat_s = group, heartbeat_s
        self.ended: list[int] = []  # runs rank 0 let go of: their ids ride along with the next order
        self.on_lost: list[Callable[[ParallelError], Any]] = []
        self.lost: ParallelError | None = None
        self._lock = threading.Lock()
        self.count = 0  # orders sent (rank 0) or received (the others)
        self._last = time.monotonic()
        self._closed = threading.Event()

    def start_heartbeat(self) -> None:
        """Rank 0: from now on, a "ping" whenever no order went out for heartbeat_s seconds."""
        self._last = time.monotonic()
        threading.Thread(target=self._beat, name="anatomy-parallel-heartbeat", daemon=True).start()

    def send(self, op: str, *args: Any) -> int:
        """Broadcast the order (op, args) to every rank of the group; its number (the orders, pings
        included, counted alike on every rank: the tag of its point-to-point messages)."""
        with self._lock:
            return self._send(op, args)

    def _send(self, op: str, args: tuple) -> int:
        if self.lost is not None:
            raise self.lost
        ended, self.ended[:] = tuple(self.ended), []
        try:
            dist.broadcast_object_list([(op, args, ended)], src=0, group=self.group)
        except RuntimeError as exc:
            self.lose(ParallelError(f"sending the order {op!r} to the other ranks failed: a rank is gone or stopped "
                                     f"answering ({_first_line(exc)})"))
        self._last = time.monotonic()
        self.count += 1
        return self.count

    def receive(self) -> tuple[str, tuple, tuple[int, ...], int]:
        """The next (op, args, ended run ids, its number) from rank 0."""
        box: list[Any] = [None]
        try:
            dist.broadcast_object_list(box, src=0, group=self.group)
        except RuntimeError as exc:
            raise ParallelError(f"rank 0 is gone or stopped sending orders ({_first_line(exc)})") from None
        self.count += 1
        return (*box[0], self.count)

    def close(self) -> None:
        """Tell the other ranks to stop (they leave their loop) and stop the heartbeat."""
        self._closed.set()
        if self.lost is None:
            self.send("stop")

    def _beat(self) -> None:
        while not self._closed.wait(self.heartbeat_s / 2):
            with self._lock:
                idle = time.monotonic() - self._last >= self.heartbeat_s
                if self.lost is None and not self._closed.is_set() and idle:
                    try:
                        self._send("ping", ())
                    except ParallelError:
                        return

    def lose(self, error: ParallelError) -> None:
        """Mark the run lost (every later send raises `error`), tell the on_lost callbacks, raise it."""
        self.lost = error
        for callback in self.on_lost:
            callback(error)
        raise error


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
