"""The block manager: reference counts, the hashed prefix cache and its LRU eviction."""

from __future__ import annotations

from anatomy.serving.blocks import BlockManager, block_hash, chain_hashes


def test_hash_chains_the_prefix():
    a = chain_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4)
    b = chain_hashes([9, 9, 9, 9, 5, 6, 7, 8], 4)
    assert len(a) == 2 and a[0] != b[0]
    assert a[1] != b[1], "the same four tokens after a different prefix must not share a key"
    assert a == chain_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 4), "a partial last block has no key"
    assert a[1] == block_hash(a[0], [5, 6, 7, 8])
    assert chain_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4, start=a[:1]) == a
    assert chain_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4, limit=1) == a[:1]


def test_allocate_release_and_refcounts():
    m = BlockManager(4, 2)
    got = m.allocate(3)
    assert sorted(got) == [0, 1, 2] and m.free == 1 and m.used == 3
    assert m.allocate(2) is None and m.free == 1, "a failed allocation takes nothing"
    m.release(got)
    assert m.free == 4 and all(c == 0 for c in m.ref_count)


def test_prefix_lookup_shares_blocks_and_counts_hits():
    m = BlockManager(8, 2)
    hashes = chain_hashes([1, 2, 3, 4, 5, 6], 2)
    blocks = m.allocate(3)
    for b, h in zip(blocks, hashes):
        m.register(b, h)
    other = chain_hashes([1, 2, 3, 4, 9, 9], 2)
    found = m.lookup(other, tokens=6)
    assert found == blocks[:2], "the longest cached prefix, and nothing after the first miss"
    assert [m.ref_count[b] for b in blocks] == [2, 2, 1]
    assert (m.queried_tokens, m.hit_tokens) == (6, 4) and abs(m.hit_rate - 4 / 6) < 1e-12
    assert m.peek(hashes) == blocks and m.ref_count[blocks[2]] == 1, "peek changes nothing"


def test_freed_cached_blocks_stay_findable_until_evicted_least_recent_first():
    m = BlockManager(3, 1)
    a, b, c = (chain_hashes([t], 1)[0] for t in (10, 20, 30))
    blocks = m.allocate(3)
    for block, h in zip(blocks, (a, b, c)):
        m.register(block, h)
    m.release([blocks[0]])
    m.release([blocks[1], blocks[2]])  # a block table [1, 2] is released tail first: 2, then 1
    assert m.free == 3 and len(m.empty) == 0
    assert m.lookup([a], tokens=1) == [blocks[0]], "a freed block is still a hit"
    m.release([blocks[0]])
    # eviction order: least recently freed first -> blocks[2], then blocks[1], then blocks[0]
    first = m.allocate(1)
    assert first == [blocks[2]] and c not in m.cached and a in m.cached and b in m.cached
    second = m.allocate(1)
    assert second == [blocks[1]] and b not in m.cached


def test_empty_blocks_are_used_before_cached_ones():
    m = BlockManager(3, 1)
    block = m.allocate(1)[0]
    m.register(block, b"key")
    m.release([block])
    assert block not in m.allocate(2), "the two empty blocks go first"
    assert b"key" in m.cached


def test_register_keeps_the_first_copy():
    m = BlockManager(2, 1)
    x, y = m.allocate(2)
    m.register(x, b"k")
    m.register(y, b"k")
    assert m.cached[b"k"] == x and m.hash_of[y] is None
    m.release([y])
    assert y in m.empty, "an uncached duplicate is simply free"
