"""A draft model's proposals in the serving loop: its own paged KV cache, indexed by the target's blocks.

The draft's cache has as many blocks of the same size as the target's, so a sequence's block table (the
scheduler's) addresses both: the draft writes its K/V where the target writes its own, nothing to
allocate or free. `fill(sequences)` fills the k DRAFTED slots of a step's verifying sequences: the draft
catches up on what it has not seen, then takes k - 1 single-token steps, proposing its argmax (a sampling
sequence: a token drawn as it samples, kept with its distribution for the rejection rule) each time.
Only proposals come from the draft: the target verifies every token.
Details: docs/serving.md, "Speculative decoding".
"""

from __future__ import annotations

import time
import weakref

import torch
from torch import Tensor

from anatomy.errors import InputError
from anatomy.inference.engine import Chunk, DecoderEngine, PagedKVCache
from anatomy.inference.sampling import greedy, sampling_probs
from anatomy.serving.sequence import Sequence


class Drafter:
    """The serving loop's draft model: `engine` over a paged cache of `num_blocks` x `block_size` tokens."""

    def __init__(self, engine: DecoderEngine, *, num_blocks: int, block_size: int, context: int,
                 vocab_size: int) -> None:
        config = engine.config
        if config.vocab_size != vocab_size:
            raise InputError(f"the draft model's vocabulary ({config.vocab_size} tokens) differs from the target's "
                             f"({vocab_size}): speculative decoding needs one tokenizer for both")
        if config.max_seq_len < context:
            raise InputError(f"the draft model's context of {config.max_seq_len} tokens (max_seq_len) is shorter "
                             f"than the served context of {context} tokens")
        self.engine = engine
        self.cache = engine.lend_cache(num_blocks=num_blocks, block_size=block_size)
        self.cache.owner = weakref.ref(self)
        self.block_bytes = PagedKVCache.block_bytes(config, block_size, engine.kv_dtype)
        self.forwards = 0

    @torch.inference_mode()
    def fill(self, seqs: list[Sequence]) -> None:
        """Write each sequence's draft (len(seq.draft) DRAFTED slots) with the draft model's tokens."""
        for seq in seqs:
            state = seq.speculation
            if state.preemptions != seq.preemptions:  # new blocks: nothing of it is in the draft's cache
                state.computed, state.preemptions = 0, seq.preemptions
        rows = [(seq, seq.tokens[seq.speculation.computed:], seq.speculation.computed) for seq in seqs]
        start_time, steps = time.perf_counter(), max(len(seq.draft) for seq in seqs)
        for i in range(steps):
            chunks = [Chunk(tokens, start, seq.blocks) for seq, tokens, start in rows]
            logits = self.engine.step(self.cache, chunks)  # [R, V]
            self.forwards += 1
            tokens = [t if seq.params.greedy else _draw(seq, row)
                      for (seq, _, _), row, t in zip(rows, logits, greedy(logits).tolist())]
            for (seq, fed, start), token in zip(rows, tokens):
                seq.draft[i] = token
            rows = [(seq, [token], start + len(fed)) for (seq, fed, start), token in zip(rows, tokens)
                    if i + 1 < len(seq.draft)]
        per_token = (time.perf_counter() - start_time) / steps
        for seq in seqs:  # the sequence and every guess but the last are in the draft's cache now
            seq.speculation.base = len(seq.tokens)
            seq.speculation.computed = len(seq.tokens) + len(seq.draft) - 1
            seq.speculation.policy.draft_time(per_token)


def _draw(seq: Sequence, logits: Tensor) -> int:
    """A sampling sequence's draft token from the draft's logits [V]: drawn under its temperature and
    filters (not its penalties), the distribution kept for the rejection rule."""
    q = sampling_probs(logits.float(), seq.params)
    seq.speculation.probs.append(q)
    return int(torch.multinomial(q, 1, generator=seq.generator))
