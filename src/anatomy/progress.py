"""Progress of long work on stderr: rich's progress display when stderr is a terminal, nothing when
it is not, under --quiet, or with ANATOMY_PROGRESS=0 (ANATOMY_PROGRESS=1 shows it anyway).

    with progress.task("measuring kernels", total=len(groups)) as bar:
        bar.advance()                         # or bar.update(description=..., info="loss 2.31")
    with progress.task("loading a model"):    # no total: a spinner and the time so far
    with progress.quieted(args.quiet):        # the CLI: nothing shown inside when True

Nested tasks share one display, shown only after DELAY_S and erased when the outermost task ends.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.progress import (BarColumn, Progress, ProgressColumn, SpinnerColumn, TaskID, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)
from rich.table import Column
from rich.text import Text

ENV = "ANATOMY_PROGRESS"  # "1": always shown, "0": never; unset: when stderr is a terminal
DELAY_S = 0.5

_lock = threading.RLock()
_shared: dict[str, Any] = {"display": None, "depth": 0, "timer": None, "started": False,
                           "quiet": False}  # for the process: a server loads its model in another thread


class Task:
    """One line of the display; a Task of a display that is not shown does nothing."""

    def __init__(self, display: Progress | None, task_id: TaskID | None) -> None:
        self._display, self._id = display, task_id

    def advance(self, steps: float = 1) -> None:
        if self._display is not None:
            self._display.advance(self._id, steps)

    def update(self, *, description: str | None = None, completed: float | None = None, **fields: Any) -> None:
        """A new description, count done or info fields (`info=` is shown after the bar)."""
        if self._display is not None:
            self._display.update(self._id, description=description, completed=completed, **fields)


def shown() -> bool:
    """Whether a task opened now would show: not quiet, and stderr a terminal (or ANATOMY_PROGRESS=1)."""
    setting = os.environ.get(ENV, "")
    if _shared["quiet"] or setting == "0":
        return False
    return setting == "1" or console().is_terminal


def console() -> Console:
    """The console the display writes to: stderr, a terminal when ANATOMY_PROGRESS=1 says so."""
    return Console(stderr=True, force_terminal=True if os.environ.get(ENV) == "1" else None)


@contextlib.contextmanager
def quieted(quiet: bool = True) -> Iterator[None]:
    """Nothing is shown inside (in any thread) when `quiet`; the previous setting comes back after."""
    before = _shared["quiet"]
    _shared["quiet"] = before or quiet
    try:
        yield
    finally:
        _shared["quiet"] = before


@contextlib.contextmanager
def task(description: str, total: float | None = None, *, info: str = "") -> Iterator[Task]:
    """A line of the display for the work inside: a bar when `total` is known, else a spinner."""
    if not shown():
        yield Task(None, None)
        return
    with _lock:
        display = _open()
        task_id = display.add_task(description, total=total, info=info)
    try:
        yield Task(display, task_id)
    finally:
        with _lock:
            if _shared["started"]:
                display.refresh()  # its last state drawn once (work shorter than a refresh tick included)
            display.remove_task(task_id)
            _close()


def track(items, description: str, total: float | None = None):
    """Each of `items`, advancing a task per item (len(items) as the total when it has one)."""
    total = total if total is not None else (len(items) if hasattr(items, "__len__") else None)
    with task(description, total=total) as bar:
        for item in items:
            yield item
            bar.advance()


def _open() -> Progress:
    if _shared["display"] is None:
        display = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=20), _Count(),
                           TimeElapsedColumn(), _Remaining(), TextColumn("{task.fields[info]}"),
                           console=console(), transient=True)  # the info last: a narrow terminal cuts it first
        timer = threading.Timer(DELAY_S, _start, args=(display,))
        timer.daemon = True
        _shared.update(display=display, timer=timer, started=False)
        timer.start()
    _shared["depth"] += 1
    return _shared["display"]


def _start(display: Progress) -> None:
    with _lock:
        if _shared["display"] is display and not _shared["started"]:
            display.start()
            _shared["started"] = True


def _close() -> None:
    _shared["depth"] -= 1
    if _shared["depth"] > 0:
        return
    _shared["timer"].cancel()
    if _shared["started"]:
        _shared["display"].stop()
    _shared.update(display=None, timer=None, started=False)


class _Count(ProgressColumn):
    """'12/40' for a count, '37%' for a large total (characters, tokens), nothing without a total."""

    def get_table_column(self) -> Column:
        return Column(no_wrap=True)

    def render(self, task) -> Text:
        if task.total is None:
            return Text("")
        if task.total > 10_000:
            return Text(f"{task.percentage:>3.0f}%")
        return Text(f"{task.completed:g}/{task.total:g}")


class _Remaining(TimeRemainingColumn):
    """The time left, for a task with a total."""

    def render(self, task) -> Text:
        return super().render(task) if task.total is not None else Text("")
