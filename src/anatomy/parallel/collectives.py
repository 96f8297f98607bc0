"""The collectives the parallel layers issue (torch.distributed's own), each one recorded when a
caller asks and each inside an `anatomy.engine:communication` profiler range.

    comm = Comm(group, ranks=[0, 1], rank=0)                # a process group and this rank's place in it
    comm.all_reduce(y, where="stack.blocks.0.attn.out")    # y summed over the group, in place
    full = comm.gather_last(y, where="lm_head")             # [..., V_r] -> [..., N * V_r] on the first rank
    send(x, dst, where=...) / recv(shape, dtype, src, where=...)    # pipeline stages
    with recording() as log: ...                            # log.ops: every collective issued, as Issued
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd.profiler import record_function

from anatomy import dtypes
from anatomy.errors import ParallelError


@dataclass(frozen=True)
class Issued:
    """One collective as this rank issued it: `bytes` is the message (the tensor this rank gives)."""

    kind: str  # all_reduce, gather, send, recv
    where: str  # the module (or stage) that issued it
    shape: tuple[int, ...]
    dtype: str
    bytes: int
    ranks: int  # ranks taking part


@dataclass
class Log:
    ops: list[Issued] = field(default_factory=list)

    def count(self, kind: str | None = None) -> int:
        return sum(1 for op in self.ops if kind is None or op.kind == kind)

    def total_bytes(self, kind: str | None = None) -> int:
        return sum(op.bytes for op in self.ops if kind is None or op.kind == kind)


RANGE = "anatomy.engine:communication"  # the profiler range of every collective (analysis/profile/positions.py)
_logs: list[Log] = []
_tag: contextvars.ContextVar[int] = contextvars.ContextVar("anatomy_parallel_tag", default=0)
_waiting: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar("anatomy_parallel_wait",
                                                                                     default=None)


@contextlib.contextmanager
def tagged(tag: int) -> Iterator[None]:
    """Point-to-point messages inside carry `tag` (the order's number on every rank: several steps in
    flight at once never take each other's hidden states or logits)."""
    token = _tag.set(tag & 0x7FFFFFFF)
    try:
        yield
    finally:
        _tag.reset(token)


@contextlib.contextmanager
def waiting(hook: Callable[[], None]) -> Iterator[None]:
    """`hook()` runs when a receive inside starts waiting (rank 0 lets the next step start its stage)."""
    token = _waiting.set(hook)
    try:
        yield
    finally:
        _waiting.reset(token)
_lock = threading.Lock()


@contextlib.contextmanager
def recording() -> Iterator[Log]:
    """Record every collective this process issues while inside."""
    log = Log()
    with _lock:
        _logs.append(log)
    try:
        yield log
    finally:
        with _lock:
            _logs.remove(log)


def communicating():
    """The profiler range collectives (and the glue that belongs to them) run in."""
    return record_function(RANGE)


def _record(kind: str, where: str, t: Tensor, ranks: int) -> None:
    if not _logs:
        return
    op = Issued(kind, where, tuple(t.shape), dtypes.name_of(t.dtype), t.nbytes, ranks)
    with _lock:
        for log in _logs:
            log.ops.append(op)


class Comm:
    """A process group of ranks `ranks` (global numbers) and this rank's place in it."""

    def __init__(self, group, *, ranks: list[int], rank: int) -> None:
        self.group, self.ranks, self.rank = group, list(ranks), rank

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def index(self) -> int:
        """This rank's position in the group."""
        return self.ranks.index(self.rank)

    def __deepcopy__(self, memo) -> Comm:
        """Itself, so that an engine's view of a shard calls the same group."""
        return self

    def all_reduce(self, t: Tensor, *, where: str) -> Tensor:
        """t summed over the group, in place (t must be contiguous); returned."""
        if self.size > 1:
            _record("all_reduce", where, t, self.size)
            _checked("all-reduce", where, lambda: dist.all_reduce(t, group=self.group))
        return t

    def gather_last(self, t: Tensor, *, where: str) -> Tensor:
        """Every rank's t [..., n] side by side on the group's first rank -> [..., N * n]; the other
        ranks get their own t back."""
        if self.size == 1:
            return t
        t = t.contiguous()
        _record("gather", where, t, self.size)
        first = self.index == 0
        parts = [torch.empty_like(t) for _ in range(self.size)] if first else None
        _checked("gather", where, lambda: dist.gather(t, parts, dst=self.ranks[0], group=self.group))
        return torch.cat(parts, dim=-1) if first else t


def send(t: Tensor, dst: int, *, where: str) -> None:
    """t to global rank `dst` (blocking until it is on its way), with the current order's tag."""
    t = t.contiguous()
    _record("send", where, t, 2)
    _checked(f"send to rank {dst}", where, lambda: dist.send(t, dst, tag=_tag.get()))


def recv(shape: tuple[int, ...], dtype: torch.dtype, src: int, *, where: str,
         device: torch.device | str = "cpu") -> Tensor:
    """A tensor of `shape` and `dtype` from global rank `src`, with the current order's tag."""
    t = torch.empty(shape, dtype=dtype, device=device)
    _record("recv", where, t, 2)
    _checked(f"receive from rank {src}", where, lambda: _receive(t, src))
    return t


def _receive(t: Tensor, src: int) -> None:
    work = dist.irecv(t, src, tag=_tag.get())
    hook = _waiting.get()
    if hook is not None:
        hook()
    work.wait()


def _checked(what: str, where: str, call) -> None:
    """Run a collective; its failure (a rank gone, a timeout) is a ParallelError naming it."""
    try:
        with communicating():
            call()
    except RuntimeError as exc:
        text = str(exc).strip().splitlines()
        raise ParallelError(f"the {what} at {where} failed: a rank is gone or stopped answering "
                            f"({text[0] if text else type(exc).__name__})") from None
