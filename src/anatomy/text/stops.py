"""Text deltas from a stream of text pieces, cut before the first stop string.

A stop string can arrive split over several tokens ("\\nUs" + "er:"), so text that could still
turn out to be the start of a stop string is held back until it is known not to be; a stop
string is therefore never partly emitted, and the emitted deltas always join to the final text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class StopStringFilter:
    """push(piece) -> the delta that is safe to show now; `stopped` once a stop string appears (`matched`:
    which one)."""

    def __init__(self, stop: tuple[str, ...] = ()) -> None:
        self.stop = tuple(stop)
        self.longest = max((len(s) for s in self.stop), default=0)
        self.text = ""  # everything pushed, up to the stop string once found
        self.emitted = 0  # characters of self.text already returned
        self.stopped = False
        self.matched: str | None = None

    def push(self, piece: str) -> str:
        if self.stopped:
            return ""
        start = max(0, len(self.text) - self.longest + 1)  # a new match must end in the new piece
        self.text += piece
        found = self._first_stop(start)
        if found is not None:
            cut, self.matched = found
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

    def _first_stop(self, start: int) -> tuple[int, str] | None:
        """(where, which) of the first stop string in the text from `start`, or None."""
        return min(((i, s) for s in self.stop if (i := self.text.find(s, start)) >= 0), default=None)

    def _held_back(self) -> int:
        """Length of the longest end of the text that is a proper prefix of some stop string."""
        for n in range(min(self.longest - 1, len(self.text) - self.emitted), 0, -1):
            tail = self.text[-n:]
            if any(s.startswith(tail) for s in self.stop):
                return n
        return 0


@dataclass
class TextRow:
    """One generated sequence's text as its tokens arrive: the incremental detokenizer (None: ids
    only), the stop-string filter, the new ids, and why it ended (None while it runs).

    add(token) -> the text delta safe to show; a stop id ends the row (and is not kept), a stop
    string ends it with the text cut before it; finish(reason) flushes what was held back.
    """

    decoder: Any
    stops: StopStringFilter
    ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None

    def add(self, token: int, stop_ids: frozenset[int]) -> str:
        if token in stop_ids:
            return self.finish("stop")
        self.ids.append(token)
        delta = self.stops.push(self.decoder.push(token)) if self.decoder is not None else ""
        if self.stops.stopped:
            self.finish_reason = "stop"
        return delta

    def finish(self, reason: str) -> str:
        self.finish_reason = reason
        if self.decoder is None:
            return ""
        return self.stops.push(self.decoder.flush()) + self.stops.flush()


def eos_ids(config, tokenizer: Any) -> frozenset[int]:
    """The ids that end a sequence: the tokenizer's end ids (EOS and the chat template's turn end), else
    the model config's EOS."""
    if tokenizer is not None and tokenizer.eos_ids:
        return frozenset(tokenizer.eos_ids)
    eos = config.eos_token_id
    return frozenset() if eos is None else frozenset({eos})
