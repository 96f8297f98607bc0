"""The sliding-window layers' blocks in serving: a group of their own, given back once out of the window.

    seq.window_blocks   one entry per entry of seq.blocks: the block of the sliding-window layers' group
                        holding the same tokens, or -1 once given back
    trim(seq)           after a step, the blocks wholly before the next query's window are released
                        (a query at position p reads the keys p - window + 1 .. p)
    prefix cache        a cached prefix is usable as far as the window at its end is cached here too

So a sequence holds about `window / block_size` blocks of this group however long it gets.
"""

from __future__ import annotations

from collections.abc import Sequence as Hashes

from anatomy.serving.blocks import BlockManager
from anatomy.serving.sequence import Sequence


class WindowBlocks:
    """The sliding-window layers' BlockManager and the rule of which of a sequence's blocks it still needs."""

    def __init__(self, manager: BlockManager, window: int) -> None:
        self.manager, self.window, self.block_size = manager, window, manager.block_size

    def first_live(self, position: int) -> int:
        """The first block a query at `position` reads."""
        return max(0, position - self.window + 1) // self.block_size

    def grow(self, seq: Sequence, n: int) -> None:
        """n more blocks at the end of seq's table (the caller checked that they are free)."""
        seq.window_blocks += self.manager.allocate(n) if n > 0 else []

    def trim(self, seq: Sequence) -> None:
        """Release seq's blocks that no query from position seq.computed on reads."""
        end = min(self.first_live(seq.computed), len(seq.window_blocks))
        dead = [b for b in seq.window_blocks[seq.window_start:end] if b >= 0]
        self.manager.release(dead)
        seq.window_blocks[seq.window_start:end] = [-1] * max(0, end - seq.window_start)
        seq.window_start = max(seq.window_start, end)

    def release(self, seq: Sequence) -> None:
        self.manager.release([b for b in seq.window_blocks if b >= 0])
        seq.window_blocks, seq.window_start = [], 0

    def register(self, seq: Sequence, index: int, h: bytes) -> None:
        """Enter seq's block `index` (full) into this group's prefix cache, unless given back."""
        if seq.window_blocks[index] >= 0:
            self.manager.register(seq.window_blocks[index], h)

    def usable(self, hashes: Hashes[bytes], n: int) -> int:
        """The longest cached prefix of at most n blocks whose window's blocks are cached here too."""
        while n > 0:
            first = self.first_live(n * self.block_size)
            if len(self.manager.peek(hashes[first:n])) == n - first:
                return n
            n -= 1
        return 0

    def needed_from_free(self, hashes: Hashes[bytes], n: int, fresh: int) -> int:
        """Free blocks admitting a prefix of n cached blocks and `fresh` new ones takes from this group."""
        cached = self.manager.peek(hashes[self.first_live(n * self.block_size):n])
        return fresh + sum(1 for b in cached if self.manager.ref_count[b] == 0)

    def lookup(self, seq: Sequence, hashes: Hashes[bytes], n: int) -> None:
        """seq's table for a cached prefix of n blocks (usable(hashes, n) == n): -1 before its window."""
        first = self.first_live(n * self.block_size)
        seq.window_blocks = [-1] * first + self.manager.lookup(hashes[first:n], tokens=0)
        seq.window_start = first
