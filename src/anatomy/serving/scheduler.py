"""Iteration-level scheduling (Orca, vLLM): which sequences advance in the next step, by how many tokens.

Each step spends a budget of `max_step_tokens` tokens in this order: (1) decoding sequences, 1 token
each (then speculating ones' drafts, where budget and free blocks allow), a running sequence preempted
and recomputed later whenever no block is free; (2) running sequences still in prefill, as much of the
prompt as the budget leaves (chunked prefill); (3) waiting sequences, while the budget, the `max_seqs`
slots and the free blocks allow, each given the blocks of its longest cached prefix. The policy
("fcfs" or "priority", vLLM's --scheduling-policy) orders both queues and picks whom to preempt.
Details: docs/serving.md, "The scheduler (one step)" and "Priorities".
"""

from __future__ import annotations

import bisect
from collections import deque

from anatomy.errors import InputError
from anatomy.serving.blocks import BlockManager, chain_hashes
from anatomy.serving.offload import KVOffload
from anatomy.serving.prompt_logprobs import PromptLogprobStore
from anatomy.serving.sequence import Sequence, Status
from anatomy.serving.window_blocks import WindowBlocks

POLICIES = ("fcfs", "priority")


class Scheduler:
    def __init__(self, blocks: BlockManager, *, max_seqs: int, max_step_tokens: int,
                 prefix_caching: bool = True, prompt_logprobs: PromptLogprobStore | None = None,
                 window: WindowBlocks | None = None, policy: str = "fcfs", offload: KVOffload | None = None) -> None:
        if policy not in POLICIES:
            raise InputError(f"scheduling policy {policy!r} is not one of {', '.join(POLICIES)}")
        self.policy, self.offload = policy, offload
        self.blocks, self.block_size, self.window = blocks, blocks.block_size, window
        self.max_seqs, self.max_step_tokens = max_seqs, max_step_tokens
        self.prefix_caching = prefix_caching
        self.prompt_logprobs = prompt_logprobs
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions = 0

    def add(self, seq: Sequence) -> None:
        self._enter(self.waiting, seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step ---------------------------------------------------------------------------------

    def schedule(self) -> list[tuple[Sequence, int]]:
        """(sequence, number of its next tokens to run) for the next step, blocks reserved for them."""
        budget, scheduled = self.max_step_tokens, {}
        if self.policy == "priority":
            self._make_room()
        preemptions = self.preemptions
        for decoding in (True, False):
            for seq in list(self.running):
                if budget == 0 or seq not in self.running or (seq.remaining == 1) != decoding:
                    continue
                n = min(seq.remaining, budget)
                if self._reserve(seq, seq.computed + n, scheduled):
                    scheduled[seq] = n
                # a sequence preempted for seq may have given its tokens back
                budget = self.max_step_tokens - sum(scheduled.values())
            if decoding:
                budget = self._drafts(scheduled, budget)
        while (self.waiting and budget > 0 and len(self.running) < self.max_seqs
               and self.preemptions == preemptions):
            seq = self.waiting[0]
            n = self._admit(seq, budget)
            if n == 0:
                break
            self.waiting.popleft()
            self._enter(self.running, seq)
            scheduled[seq] = n
            budget -= n
        return list(scheduled.items())

    def advance(self, seq: Sequence, n: int) -> None:
        """After a step ran n of seq's tokens: they are in the cache; full blocks join the prefix cache."""
        seq.computed += n
        full = seq.computed // self.block_size
        if self.prefix_caching and full > seq.registered:
            seq.hashes = chain_hashes(seq.tokens, self.block_size, start=seq.hashes, limit=full,
                                      salt=seq.cache_salt)
            for i in range(seq.registered, full):
                self.blocks.register(seq.blocks[i], seq.hashes[i])
                if self.window:
                    self.window.register(seq, i, seq.hashes[i])
            seq.registered = full
        if self.window:
            self.window.trim(seq)

    def finish(self, seq: Sequence) -> None:
        """A finished or cancelled sequence leaves at once; its blocks are freed (cached ones stay
        findable until evicted)."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._free(seq)
        seq.status = Status.FINISHED

    # -- the pieces -------------------------------------------------------------------------------

    def _drafts(self, scheduled: dict[Sequence, int], budget: int) -> int:
        """Room for the drafts of the decoding sequences scheduled: 1 + len(draft) tokens each while the
        budget lasts and blocks are free (a draft that does not fit is dropped: it never preempts)."""
        for seq, n in list(scheduled.items()):
            if not seq.draft:
                continue
            extra = len(seq.draft)
            if extra > budget or not self._grow(seq, seq.computed + n + extra):
                seq.draft = []
                continue
            scheduled[seq] = n + extra
            budget -= extra
        return budget

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def _free_blocks(self) -> int:
        """Blocks that can be handed out in every group."""
        return min(self.blocks.free, self.window.manager.free) if self.window else self.blocks.free

    def _grow(self, seq: Sequence, tokens: int) -> bool:
        """Blocks (of every group) for seq's first `tokens` tokens; False, nothing taken, where they are not free."""
        need = self._blocks_for(tokens) - len(seq.blocks)
        if need <= 0:
            return True
        if need > self._free_blocks():
            return False
        seq.blocks += self.blocks.allocate(need)
        if self.window:
            self.window.grow(seq, need)
        return True

    def _reserve(self, seq: Sequence, tokens: int, scheduled: dict[Sequence, int]) -> bool:
        """Blocks for seq's first `tokens` tokens, preempting running sequences from the last one
        (fcfs: the most recently admitted; priority: the worst-ranked) while none are free; False (seq
        not to run this step) if seq itself was the one preempted, or (fcfs) if the next one to preempt
        is already part of this step (priority: it leaves the step, as in vLLM)."""
        while not self._grow(seq, tokens):
            victim = self.running[-1]
            if victim in scheduled and self.policy != "priority":
                return False
            scheduled.pop(victim, None)
            self.running.pop()
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        self._free(seq)
        seq.draft = []  # proposed for a decode step it no longer takes
        seq.status = Status.WAITING
        seq.preemptions += 1
        self.preemptions += 1
        self._enter(self.waiting, seq, front=True)

    def _enter(self, queue: deque[Sequence] | list[Sequence], seq: Sequence, *, front: bool = False) -> None:
        """seq joins the waiting or the running ones: priority: in rank order (the worst last); fcfs: at
        the back, or the front."""
        if self.policy == "priority":
            bisect.insort(queue, seq, key=rank)
        elif front:
            queue.appendleft(seq)
        else:
            queue.append(seq)

    def _make_room(self) -> None:
        """Priority: while the best waiting sequence ranks above the worst running one and finds no slot
        or no blocks for its first chunk, the worst running one is preempted (vLLM's priority preemption)."""
        while self.waiting and self.running and rank(self.waiting[0]) < rank(self.running[-1]):
            seq = self.waiting[0]
            cached, hashes = self._prefix(seq)
            if len(self.running) < self.max_seqs and self._fits(seq, cached, hashes, self._kept(seq, cached),
                                                                budget=self.max_step_tokens):
                return
            self._preempt(self.running.pop())

    def _free(self, seq: Sequence) -> None:
        self.blocks.release(seq.blocks)
        if self.window:
            self.window.release(seq)
        seq.blocks, seq.computed, seq.registered = [], 0, 0

    def _admit(self, seq: Sequence, budget: int) -> int:
        """Give a waiting sequence its cached prefix and blocks for its first chunk; the chunk's
        length, or 0 if the blocks (beyond one spare per running sequence) are not there."""
        cached, hashes = self._prefix(seq)
        kept = self._kept(seq, cached)
        if not self._fits(seq, cached, hashes, kept, budget=budget):
            return 0
        start = (len(cached) + kept) * self.block_size
        n = min(len(seq.tokens) - start, budget)
        fresh = self._blocks_for(start + n) - len(cached)
        if self.prefix_caching:
            seq.blocks = self.blocks.lookup(hashes, tokens=len(seq.tokens))
            seq.registered = len(seq.blocks)
            seq.computed = start
            if self.window:
                self.window.lookup(seq, hashes, len(cached))
        seq.blocks += self.blocks.allocate(fresh)
        if self.window:
            self.window.grow(seq, fresh)
        seq.status = Status.RUNNING
        return self._restore(seq, len(cached), kept, budget) if kept else n

    def _kept(self, seq: Sequence, cached: list[int]) -> int:
        """Blocks of seq's prompt right after its cached prefix that the offload store keeps."""
        if self.offload is None or not self.prefix_caching or seq.prompt_logprobs is not None or self.window:
            return 0
        return self.offload.count(seq.hashes[len(cached):(len(seq.tokens) - 1) // self.block_size])

    def _restore(self, seq: Sequence, first: int, kept: int, budget: int) -> int:
        """Copy the offload store's blocks into seq's fresh blocks first .. first + kept - 1 (in the prefix
        cache from now on); the length of its first chunk after those restored (one that cannot be read,
        and those after it, are computed: the blocks past that chunk are given back)."""
        got = self.offload.restore(seq.hashes[first:first + kept], seq.blocks[first:first + kept])
        for i in range(first, first + got):
            self.blocks.register(seq.blocks[i], seq.hashes[i])
        seq.registered = first + got
        seq.computed = seq.registered * self.block_size
        n = min(len(seq.tokens) - seq.computed, budget)
        keep = self._blocks_for(seq.computed + n)
        self.blocks.release(seq.blocks[keep:])
        del seq.blocks[keep:]
        return n

    def _prefix(self, seq: Sequence) -> tuple[list[int], list[bytes]]:
        """The cached blocks a waiting sequence may start from, and their keys (nothing taken yet)."""
        cached: list[int] = []
        hashes: list[bytes] = []
        if self.prefix_caching:
            # at least the last token is computed again: its logits give the first new token
            limit = (len(seq.tokens) - 1) // self.block_size
            seq.hashes = chain_hashes(seq.tokens, self.block_size, start=seq.hashes, limit=limit,
                                      salt=seq.cache_salt)
            hashes = seq.hashes[:limit]
            cached = self.blocks.peek(hashes)
            if seq.prompt_logprobs is not None:  # only blocks whose prompt logprobs are known too
                keep = self.prompt_logprobs.take(seq, hashes[:len(cached)]) if self.prompt_logprobs else 0
                cached, hashes = cached[:keep], hashes[:keep]
            if self.window:  # the sliding-window layers' blocks of the prefix's last window are needed too
                cached = cached[:self.window.usable(hashes, len(cached))]
                hashes = hashes[:len(cached)]
        return cached, hashes

    def _fits(self, seq: Sequence, cached: list[int], hashes: list[bytes], kept: int, *, budget: int) -> bool:
        """Whether the blocks of seq's first chunk (after its cached prefix and the `kept` blocks restored
        after it) leave one spare per running sequence, in every group."""
        start = (len(cached) + kept) * self.block_size
        fresh = self._blocks_for(start + min(len(seq.tokens) - start, budget)) - len(cached)
        taken_from_free = fresh + sum(1 for b in cached if self.blocks.ref_count[b] == 0)
        if self.blocks.free - taken_from_free < len(self.running):
            return False
        return not self.window or (self.window.manager.free - self.window.needed_from_free(hashes, len(cached), fresh)
                                   >= len(self.running))


def rank(seq: Sequence) -> tuple[int, float]:
    """The priority policy's order: lower priority values first, then earlier arrivals."""
    return seq.priority, seq.arrival
