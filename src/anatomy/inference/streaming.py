"""Text deltas from a stream of text pieces, cut before the first stop string.

A stop string can arrive split over several tokens ("\\nUs" + "er:"), so text that could still
turn out to be the start of a stop string is held back until it is known not to be; a stop
string is therefore never partly emitted, and the emitted deltas always join to the final text.
"""

from __future__ import annotations


class StopStringFilter:
    """push(piece) -> the delta that is safe to show now; `stopped` once a stop string appears."""

    def __init__(self, stop: tuple[str, ...] = ()) -> None:
        self.stop = tuple(stop)
        self.longest = max((len(s) for s in self.stop), default=0)
        self.text = ""  # everything pushed, up to the stop string once found
        self.emitted = 0  # characters of self.text already returned
        self.stopped = False

    def push(self, piece: str) -> str:
        if self.stopped:
            return ""
        start = max(0, len(self.text) - self.longest + 1)  # a new match must end in the new piece
        self.text += piece
        cut = self._first_stop(start)
        if cut is not None:
            self.text, self.stopped = self.text[:cut], True
            return self._emit(cut)
        return self._emit(len(self.text) - self._held_back())

    def flush(self) -> str:
        """At the end of generation: whatever was held back is not a stop string after all."""
        return self._emit(len(self.text))

    def _emit(self, end: int) -> str:
        delta = self.text[self.emitted:end]
        self.emitted = max(self.emitted, end)
        return delta

    def _first_stop(self, start: int) -> int | None:
        found = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        return min(found) if found else None

    def _held_back(self) -> int:
        """Length of the longest end of the text that is a proper prefix of some stop string."""
        for n in range(min(self.longest - 1, len(self.text) - self.emitted), 0, -1):
            tail = self.text[-n:]
            if any(s.startswith(tail) for s in self.stop):
                return n
        return 0
