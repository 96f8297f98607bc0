"""Pipeline-parallel serving: several serving loops over one ParallelEngine, each its own batch of
sequences in flight, so that the stages work at the same time (docs/parallel.md, "How it runs").

    loop = Lanes.of(engine, tokenizer, lanes=2, kv_bytes=..., block_size=16, ...)   # ServingLoop's options
    loop.start(); seq = loop.submit(prompt, params, sink); loop.cancel(seq); loop.stop()

With M loops (M = the pipeline's stages), rank 0 lets a loop's step into its stage as soon as the
previous step is past it (driver.py: `mirrored`): while stage 1 computes loop A's decode step,
stage 0 computes loop B's; M batches advance in about the time one batch would.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from anatomy.serving.loop import ServingLoop
from anatomy.serving.sequence import Event, Sequence


class Lanes:
    """M ServingLoops behind the interface of one. Each loop keeps its own scheduler, paged KV cache
    (1/M of the KV memory) and thread; a new request goes to the loop with the fewest sequences. To the
    HTTP app the lanes are one loop: submit, cancel, the context, one set of metrics, and the
    scheduler's and block manager's gauges summed."""

    def __init__(self, loops: list[ServingLoop]) -> None:
        self.loops = loops
        self.metrics = loops[0].metrics
        for loop in loops[1:]:
            loop.metrics = self.metrics  # one set of counters and histograms (ServingMetrics is thread-safe)
        self.context = min(loop.context for loop in loops)
        self.scheduler = _Summed([loop.scheduler for loop in loops], lists=("running", "waiting"),
                                 counts=("preemptions",))
        self.blocks = _Summed([loop.blocks for loop in loops], counts=("used", "free", "num_blocks",
                                                                        "queried_tokens", "hit_tokens"))
        self._load = {id(loop): 0 for loop in loops}
        self._lock = threading.Lock()

    @property
    def held_bytes(self) -> int:
        return sum(loop.held_bytes for loop in self.loops)

    @classmethod
    def of(cls, engine, tokenizer: Any = None, *, lanes: int, kv_bytes: int, **options: Any) -> Lanes:
        return cls([ServingLoop(engine, tokenizer, kv_bytes=kv_bytes // lanes, **options) for _ in range(lanes)])

    def __getattr__(self, name: str) -> Any:  # engine, tokenizer, eos_ids, ...: the first loop's (all alike)
        return getattr(self.loops[0], name)

    def submit(self, prompt: list[int], params, sink: Callable[[Event], Any], **options: Any) -> Sequence:
        with self._lock:
            loop = min(self.loops, key=lambda lp: self._load[id(lp)])
            self._load[id(loop)] += 1

        def counted(event: Event) -> None:
            if event.finish_reason is not None:
                with self._lock:
                    self._load[id(loop)] -= 1
            sink(event)

        seq = loop.submit(prompt, params, counted, **options)
        seq.lane = loop
        return seq

    def cancel(self, seq: Sequence) -> None:
        seq.lane.cancel(seq)

    def start(self) -> None:
        for loop in self.loops:
            loop.start()

    def stop(self) -> None:
        for loop in self.loops:
            loop.stop()


class _Summed:
    """The loops' schedulers (or block managers) read as one: lists joined, counts added, the rest the first's."""

    def __init__(self, parts: list, *, lists: tuple[str, ...] = (), counts: tuple[str, ...] = ()) -> None:
        self._parts, self._lists, self._counts = parts, lists, counts

    def __getattr__(self, name: str) -> Any:
        if name in self._lists:
            return [x for part in self._parts for x in getattr(part, name)]
        if name in self._counts:
            return sum(getattr(part, name) for part in self._parts)
        if name == "hit_rate":
            queried = sum(part.queried_tokens for part in self._parts)
            return sum(part.hit_tokens for part in self._parts) / queried if queried else 0.0
        return getattr(self._parts[0], name)
