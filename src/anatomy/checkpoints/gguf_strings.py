"""A long array of strings held as one: a GGUF vocabulary's ~10^5 tokens and merges, kept beside its
tokenizer for `save`, as one str and the offsets where each string ends (a list holds a str object of
~50-60 bytes for each: ~40 MiB for Llama 3's 128,256 tokens and 280,147 merges, ~10 MiB this way)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import overload

import numpy as np


class StringTable(Sequence[str]):
    """The strings of `strings`, in order, read back as a sequence (an index, a slice, iteration)."""

    def __init__(self, strings: Sequence[str]) -> None:
        self._joined = "".join(strings)
        self._ends = np.fromiter(itertools.accumulate(map(len, strings)), dtype=np.int64, count=len(strings))

    def __len__(self) -> int:
        return len(self._ends)

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = index + len(self) if index < 0 else index
        if not 0 <= i < len(self):
            raise IndexError(f"string {index} of {len(self)}")
        return self._joined[int(self._ends[i - 1]) if i else 0:int(self._ends[i])]

    def __iter__(self) -> Iterator[str]:
        start = 0
        for end in self._ends.tolist():
            yield self._joined[start:end]
            start = end

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and not isinstance(other, str) and len(self) == len(other) \
            and all(a == b for a, b in zip(self, other))

    __hash__ = None  # mutable-looking, as the list it stands for

    def __repr__(self) -> str:
        return f"StringTable({len(self)} strings)"
