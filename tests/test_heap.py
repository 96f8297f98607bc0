"""Memory given back to the system (anatomy/heap.py)."""

from __future__ import annotations

from anatomy import heap


def test_the_heap_is_trimmed_once_enough_is_freed(monkeypatch):
    """An engine gives back its model's formats one weight at a time; the heap is trimmed (about a millisecond
    each) once 32 MiB have been freed since the last trim, and once at the end, not after every weight."""
    calls = []
    monkeypatch.setattr(heap, "trim", lambda: calls.append(1) or True)
    trimmer = heap.Trimmer(every=32 << 20)
    for _ in range(7):
        trimmer.freed(5 << 20)
    assert len(calls) == 1  # 35 MiB after the seventh
    trimmer.freed(0)
    trimmer.flush()
    assert len(calls) == 1  # nothing freed since
    trimmer.freed(1 << 20)
    trimmer.flush()
    assert len(calls) == 2  # what was left, at the end
