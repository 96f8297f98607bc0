"""The KV blocks of the paged cache: who holds which block, and which blocks hold a known prefix.

    block ids 0 .. n-1       each holds `block_size` consecutive tokens of one sequence (all layers)
    ref_count[b]             how many running sequences have b in their block table
    cached: hash -> b        full blocks known by the hash of their tokens and of everything before them
    empty                    free blocks holding nothing worth keeping: handed out first
    evictable (LRU)          free blocks still in `cached`: handed out (and to `on_evict`) once `empty` runs out

Why the hash chains its parent's and is BLAKE2b: docs/serving.md, "The paged KV cache".
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence


def block_hash(parent: bytes | None, tokens: Sequence[int]) -> bytes:
    """The prefix-cache key of a full block: its tokens and its parent block's key, so equal keys mean
    equal tokens *and* equal prefixes. A 128-bit BLAKE2b digest, not Python's `hash`, which can be
    collided on purpose (a collision would let one request read another's keys and values)."""
    digest = hashlib.blake2b(parent or b"", digest_size=16)
    digest.update(array("q", tokens).tobytes())
    return digest.digest()


def chain_hashes(tokens: Sequence[int], block_size: int, *, start: list[bytes] | None = None,
                 limit: int | None = None, salt: bytes = b"") -> list[bytes]:
    """The keys of the full blocks of `tokens` (extending the keys `start` already holds), at most
    `limit` of them; a `salt` (a LoRA adapter's digest) is the first block's parent."""
    hashes = list(start or [])
    n = len(tokens) // block_size if limit is None else min(limit, len(tokens) // block_size)
    for i in range(len(hashes), n):
        hashes.append(block_hash(hashes[-1] if hashes else salt or None, tokens[i * block_size:(i + 1) * block_size]))
    return hashes


class BlockManager:
    """Allocation, reference counts and the prefix cache of `num_blocks` blocks."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.ref_count = [0] * num_blocks
        self.hash_of: list[bytes | None] = [None] * num_blocks
        self.cached: dict[bytes, int] = {}
        self.empty: deque[int] = deque(range(num_blocks))
        self.evictable: OrderedDict[int, None] = OrderedDict()
        self.queried_tokens = 0  # prefix-cache lookups, in tokens
        self.hit_tokens = 0
        self.on_evict: Callable[[int, bytes], None] | None = None  # (block, hash) of a cached block about to be reused

    @property
    def free(self) -> int:
        """Blocks that can be handed out now (empty ones and evictable cached ones)."""
        return len(self.empty) + len(self.evictable)

    @property
    def used(self) -> int:
        return self.num_blocks - self.free

    def allocate(self, n: int) -> list[int] | None:
        """n blocks, each with one reference; None (nothing taken) when fewer than n are free."""
        if n > self.free:
            return None
        return [self._take() for _ in range(n)]

    def _take(self) -> int:
        if self.empty:
            block = self.empty.popleft()
        else:
            block, _ = self.evictable.popitem(last=False)  # the least recently freed
            if self.on_evict is not None:
                self.on_evict(block, self.hash_of[block])
            del self.cached[self.hash_of[block]]
            self.hash_of[block] = None
        self.ref_count[block] = 1
        return block

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference to each block; unreferenced ones become free. Released last block first,
        so that a sequence's tail is evicted before its head (the prefix others are likeliest to share)."""
        for block in reversed(blocks):
            self.ref_count[block] -= 1
            if self.ref_count[block] > 0:
                continue
            if self.hash_of[block] is not None:
                self.evictable[block] = None
            else:
                self.empty.append(block)

    def peek(self, hashes: Sequence[bytes]) -> list[int]:
        """The cached blocks of the longest prefix of `hashes`, nothing changed."""
        found = []
        for h in hashes:
            if h not in self.cached:
                break
            found.append(self.cached[h])
        return found

    def lookup(self, hashes: Sequence[bytes], *, tokens: int) -> list[int]:
        """The cached blocks of the longest prefix of `hashes`, each given one more reference.
        `tokens` (the length of the prompt looked up) and the tokens found count for the hit rate."""
        found = []
        for h in hashes:
            block = self.cached.get(h)
            if block is None:
                break
            if self.ref_count[block] == 0:
                del self.evictable[block]
            self.ref_count[block] += 1
            found.append(block)
        self.queried_tokens += tokens
        self.hit_tokens += len(found) * self.block_size
        return found

    def register(self, block: int, h: bytes) -> None:
        """Record that `block` (full, its keys and values written) holds the tokens keyed by `h`.
        If another block already holds them, that one stays the cached copy."""
        if h not in self.cached and self.hash_of[block] is None:
            self.cached[h] = block
            self.hash_of[block] = h

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0
