"""Prompt log-probabilities (completions with echo and logprobs) that stay right with the prefix cache.

The log-probability of prompt token p comes from the logits at position p - 1, so a prefix whose
keys and values come from the cache has no logits of its own. Here the entries of every full prompt
block a sequence computes are kept, keyed by the block's prefix-cache hash:

    block i's entry   the TokenLogprobs of prompt positions i*bs .. (i+1)*bs - 1 (position 0: None)

How a later request reuses them: docs/serving.md, "Scoring: echo and prompt logprobs".
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import Tensor

from anatomy.inference.sampling import token_logprobs
from anatomy.serving.sequence import Sequence, TokenLogprob

PROMPT_TOP = 5
CAPACITY = 2048  # blocks of entries kept (least recently used dropped)


def wants_prompt_logits(seq: Sequence, n: int) -> bool:
    """Whether the chunk of seq's next n tokens must give logits for every position."""
    if seq.prompt_logprobs is None:
        return False
    end = min(seq.computed + n + 1, seq.prompt_len)
    return any(e is None for e in seq.prompt_entries[seq.computed + 1:end])


def record(seq: Sequence, start: int, logits: Tensor) -> None:
    """The entries of prompt positions start + 1 ... from logits [n, V] at positions start ..."""
    positions = [p for p in range(start + 1, min(start + 1 + logits.shape[0], seq.prompt_len))
                 if seq.prompt_entries[p] is None]
    if not positions:
        return
    rows = torch.tensor([p - 1 - start for p in positions])
    targets = torch.tensor([seq.tokens[p] for p in positions])
    chosen, values, ids = token_logprobs(logits[rows], targets, PROMPT_TOP)
    for j, p in enumerate(positions):
        seq.prompt_entries[p] = TokenLogprob(float(chosen[j]), ids[j].tolist(), values[j].tolist())


class PromptLogprobStore:
    """Entries of full prompt blocks by their prefix-cache hash (CAPACITY blocks, LRU)."""

    def __init__(self, block_size: int, capacity: int = CAPACITY) -> None:
        self.block_size, self.capacity = block_size, capacity
        self.entries: OrderedDict[bytes, list[TokenLogprob | None]] = OrderedDict()

    def put(self, seq: Sequence) -> None:
        """Keep the entries of seq's registered blocks that lie in its prompt and are complete."""
        bs = self.block_size
        for i in range(min(seq.registered, seq.prompt_len // bs, len(seq.hashes))):
            block = seq.prompt_entries[i * bs:(i + 1) * bs]
            if seq.hashes[i] in self.entries or any(e is None for e in block[1 if i == 0 else 0:]):
                continue
            self.entries[seq.hashes[i]] = block
            if len(self.entries) > self.capacity:
                self.entries.popitem(last=False)

    def take(self, seq: Sequence, hashes: list[bytes]) -> int:
        """Fill seq's entries from the leading blocks of `hashes` (its cached prefix) that have them;
        the number of those blocks whose keys and values it may reuse (one fewer)."""
        bs, known = self.block_size, 0
        for h in hashes:
            block = self.entries.get(h)
            if block is None:
                break
            self.entries.move_to_end(h)
            seq.prompt_entries[known * bs:(known + 1) * bs] = block
            known += 1
        return max(known - 1, 0)
