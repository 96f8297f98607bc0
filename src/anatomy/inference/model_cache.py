"""Models loaded by name for `anatomy.generate` and `anatomy.embed`, kept for the next call.

    anatomy.generate("<model>", "Hi")                 # loads the model and its tokenizer, keeps them
    anatomy.generate("<model>", "Ho")                 # the same objects again: nothing is loaded
    anatomy.loaded_models.clear()                     # frees them

A call given a model object (or an engine) instead of a name never touches this cache. At most
`capacity` entries are kept; the least recently used one is dropped first. Safe to share between
threads: one load per key, even when two threads ask at once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Hashable


class LoadedModels:
    """An LRU map from (what, name, options) keys to loaded models."""

    def __init__(self, capacity: int = 4) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, load: Callable[[], Any]) -> Any:
        """The entry of `key`, loaded by `load()` the first time it is asked for."""
        with self._lock:
            if key not in self._entries:
                self._entries[key] = load()
                while len(self._entries) > self.capacity:
                    self._entries.popitem(last=False)
            self._entries.move_to_end(key)
            return self._entries[key]

    def discard(self, key: Hashable) -> None:
        """Forget the entry of `key` (if any): the next get loads it again."""
        with self._lock:
            self._entries.pop(key, None)

    def keys(self) -> list[Hashable]:
        with self._lock:
            return list(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


loaded_models = LoadedModels()
