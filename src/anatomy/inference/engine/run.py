"""One generation, a client of the engine's step: what generation, streaming and speculation use.

    run = engine.start(prompts, params)  # each prompt's own block table in a paged cache (room for max_new_tokens)
    logits = run.prefill()               # [B, V]: every prompt in one step -> its last position's logits
    token = run.choose(logits)           # [B]: greedy or sampled, with this run's penalties and generator
    logits = run.decode(token)           # [B, V] (run.verify(tokens [B, S]): [B, S, V] in one step)
    run.rewind(slot); run.observe(tokens)  # move the write slot back; count tokens another rule emitted

A slot counts as if the prompts were left-padded to the longest (`batch`): row i's token at slot s is at
position s - padding[i], so one slot number serves the batch. Each step is `engine.step` over the
rows' chunks; a decode step reads the run's whole table, one shape per run, captured after
CAPTURE_AFTER steps as the server's decode steps are. Sliding-window layers keep a ring of blocks
per row (`ring_blocks`): the window and SLACK more, the longest rewind; older blocks read as masked.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from anatomy.errors import InputError
from anatomy.inference.engine.paged import Chunk, PagedKVCache
from anatomy.inference.sampling import Penalties, SamplingParams, make_generator, next_tokens
from anatomy.models.embedding import check_input_ids

CAPTURE_AFTER = 32  # eager decode steps of one shape before it is captured (engine.PAGED_RECORD_AFTER)
SLACK = 64  # positions a sliding-window ring keeps beyond its window: the longest rewind, the longest verify


def ring_blocks(config, *, blocks: int, block_size: int, prompt: int, exact: bool) -> int | None:
    """Blocks of each row's ring for the sliding-window layers, or None where a ring would not be smaller
    than the row's table (or no layer has a window). A step reads the window and SLACK before its first
    token; a prompt read back from the blocks (a cache that does not hold keys as computed) must fit too."""
    if not any(config.layer_window(i) for i in range(config.cached_layers)):
        return None
    span = config.sliding_window + SLACK + (SLACK if exact else max(SLACK, prompt))
    ring = -(-span // block_size) + 1
    return ring if ring < blocks else None

@dataclass(frozen=True)
class PaddedBatch:
    """Prompts left-padded to one length: ids [B, P], padding [B] (pad slots at the start of each row)."""

    ids: Tensor
    padding: Tensor

    @classmethod
    def of(cls, prompts: list[list[int]], *, pad_id: int = 0, device: torch.device | str = "cpu") -> PaddedBatch:
        if not prompts or any(len(p) == 0 for p in prompts):
            raise InputError("every prompt needs at least one token")
        P = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), P), pad_id, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, P - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
        padding = torch.tensor([P - len(p) for p in prompts], dtype=torch.long)
        return cls(ids.to(device), padding.to(device))

    @property
    def padded(self) -> bool:
        return bool(self.padding.any())

    def slot_mask(self, max_len: int) -> Tensor | None:
        """bool [B, T]: False on each row's padding slots; None when nothing is padded."""
        if not self.padded:
            return None
        return torch.arange(max_len, device=self.ids.device)[None] >= self.padding[:, None]

    def positions(self, slots: Tensor) -> Tensor:
        """position_ids [B, S] of the tokens at cache slots `slots` [S]."""
        return slots[None] - self.padding[:, None]


class Run:
    """The state of one generation: its batch, block tables, write slot and sampling state. Made by
    DecoderEngine.start over a cache lent to it while it lives; `engine.tokens` is the plain loop over it."""

    def __init__(self, engine, batch: PaddedBatch, cache: PagedKVCache, params: SamplingParams) -> None:
        check_input_ids(batch.ids, engine.config, name="prompt")
        self.engine, self.batch, self.cache, self.params = engine, batch, cache, params
        self.padding = batch.padding.tolist()
        self.prompts = [row[pad:] for row, pad in zip(batch.ids.tolist(), self.padding)]
        B, per_row = len(self.prompts), cache.num_blocks // len(self.prompts)
        self.tables = [list(range(r * per_row, (r + 1) * per_row)) for r in range(B)]
        self.max_len = min(per_row * cache.block_size, engine.config.max_seq_len)  # slots a row can hold
        ring = cache.window_blocks // B if cache.window_blocks is not None else None
        self.rings = [list(range(r * ring, (r + 1) * ring)) for r in range(B)] if ring else None
        self._windows: dict[int, tuple[int, list[int]]] = {}  # row -> (its first live block, its window table)
        self.high = 0  # one past the furthest slot written (a rewind goes back at most SLACK from it)
        self.slot = 0  # the next slot written
        self.generator = make_generator(params.seed, engine.device)
        self.penalties = Penalties.of(self.prompts, params, vocab=engine.config.vocab_size, device=engine.device)
        cache.owner = weakref.ref(self)  # lent to this run while it lives (engine.lend_cache)

    @property
    def rows(self) -> int:
        return self.batch.ids.shape[0]

    # -- the model -------------------------------------------------------------------------------

    def prefill(self) -> Tensor:
        """Every prompt from position 0, in one step -> each one's last position's logits [B, V]."""
        logits = self._step([Chunk(prompt, 0, table) for prompt, table in zip(self.prompts, self.tables)])
        self.slot = self.high = self.batch.ids.shape[1]
        return logits

    def decode(self, token: Tensor) -> Tensor:
        """token [B] at slot `self.slot` -> logits [B, V] of the next one."""
        return self._next(token[:, None].tolist(), logits=1)

    def verify(self, tokens: Tensor) -> Tensor:
        """tokens [B, S] at slots slot..slot+S-1 in one step -> logits [B, S, V]: each row of the pass
        sees what its own decode step would (keys up to its slot), so verifying k proposals reads the
        weights once instead of k times."""
        S = tokens.shape[1]
        return self._next(tokens.tolist(), logits=S).view(self.rows, S, -1)

    def rewind(self, slot: int) -> None:
        """The next write goes to `slot` (between the prompt's end and the current slot): the keys and
        values beyond it are stale, never attended to, and written over by the next step."""
        if not self.batch.ids.shape[1] <= slot <= self.slot:
            raise InputError(f"rewind to slot {slot}: outside [{self.batch.ids.shape[1]}, {self.slot}] "
                             "(the prompt's end .. the current write position)")
        if self.rings is not None and self.high - slot > SLACK:
            raise InputError(f"rewind of {self.high - slot} slots: a sliding-window layer's ring keeps "
                             f"{SLACK} beyond its window")
        self.slot = slot

    def _next(self, rows: list[list[int]], *, logits: int) -> Tensor:
        """Each row's tokens at slots slot..slot+S-1 -> the logits of its last `logits` tokens, row after row."""
        S = len(rows[0])
        if self.slot + S > self.max_len:
            raise InputError(f"{S} more tokens at slot {self.slot} overflow this run's cache of "
                             f"{self.max_len} slots (prompt + max_new_tokens)")
        if self.rings is not None and S > SLACK:
            raise InputError(f"{S} tokens in one step: a sliding-window layer's ring keeps {SLACK} beyond its window")
        out = self._step([Chunk(tokens, self.slot - pad, table, logits=logits)
                          for tokens, pad, table in zip(rows, self.padding, self.tables)])
        self.slot += S
        self.high = max(self.high, self.slot)
        return out

    def _step(self, chunks: list[Chunk]) -> Tensor:
        if self.rings is not None:
            chunks = [replace(c, window_blocks=self._window(row, c)) for row, c in enumerate(chunks)]
        return self.engine.step(self.cache, chunks, blocks=len(self.tables[0]))

    def _window(self, row: int, chunk: Chunk) -> list[int]:
        """Row's table in the sliding-window group for this step: each block from the first one a query of
        this step or a later one may read (the window and SLACK before the step's first token read from the
        blocks) to its ring's block, the older ones -1 (read as masked). A fresh prompt reads its own keys
        as computed, so only what later steps read need be kept."""
        fresh = chunk.start == 0 and self.cache.exact
        oldest = (chunk.start + len(chunk.tokens) if fresh else chunk.start) - self.engine.config.sliding_window - SLACK
        first = max(0, oldest) // self.cache.block_size
        if self._windows.get(row, (None,))[0] != first:  # made again once a block every block_size tokens
            ring = self.rings[row]
            self._windows[row] = first, [ring[j % len(ring)] if j >= first else -1 for j in range(len(self.tables[row]))]
        return self._windows[row][1]

    # -- choosing tokens -------------------------------------------------------------------------

    @torch.inference_mode()
    def choose(self, logits: Tensor) -> Tensor:
        """logits [B, V] -> the next token [B] under this run's sampling parameters; recorded as generated."""
        penalties = self.penalties
        token = next_tokens(logits, self.params, seen=penalties.seen, counts=penalties.counts, generator=self.generator,
                            argmax=self.engine.argmax)
        penalties.observe(token[:, None])
        return token

    def observe(self, tokens: Tensor) -> None:
        """tokens [B, n] were emitted (by another rule than `choose`): the penalties take them in."""
        self.penalties.observe(tokens)

    @property
    def seen(self) -> Tensor | None:
        """bool [B, V]: the repetition penalty's prompt and output tokens (None without that penalty)."""
        return self.penalties.seen
