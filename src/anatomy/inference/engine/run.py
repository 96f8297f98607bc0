"""One generation over a static KV cache: the step API generation, streaming and speculation use.

    run = engine.start(prompts, params)  # ids left-padded to [B, P]; a cache of T >= P + max_new_tokens slots
    logits = run.prefill()               # [B, V]: the prompts at slots 0..P-1 -> the last position's logits
    token = run.choose(logits)           # [B]: greedy or sampled, with this run's penalties and generator
    logits = run.decode(token)           # [B, V] (run.verify(tokens [B, S]): [B, S, V] in one forward)
    run.rewind(slot); run.observe(tokens)  # move the write slot back; count tokens another rule emitted

Left padding keeps every row's newest token in one slot, so one write position serves the batch
(the Context hides the padding). Decode steps replay a captured graph after CAPTURE_AFTER steps.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch import Tensor

from anatomy.errors import InputError
from anatomy.inference.engine.kv_cache import KVCache
from anatomy.inference.sampling import SamplingParams, make_generator, next_tokens
from anatomy.models.context import ContextTables
from anatomy.models.embedding import check_input_ids

CAPTURE_AFTER = 32  # eager decode steps of a run before its shape is captured: a short answer does not
                    # pay for the recording, which costs many steps' worth of the gain


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
    """The state of one generation: its batch, cache, write position, sampling state. Made by
    DecoderEngine.start; `engine.tokens` is the plain loop over it."""

    def __init__(self, engine, batch: PaddedBatch, cache: KVCache, params: SamplingParams) -> None:
        check_input_ids(batch.ids, engine.config, name="prompt")
        self.engine, self.batch, self.cache, self.params = engine, batch, cache, params
        self.tables = ContextTables(engine.model.stack.context, length=cache.max_len, dtype=engine.branch_dtype,
                                    device=engine.device)
        self.valid = batch.slot_mask(cache.max_len)  # [B, T] or None
        self.slot = 0  # the next slot written
        self.decodes = 0  # decode steps so far (a shape is captured after CAPTURE_AFTER of them)
        self.generator = make_generator(params.seed, engine.device)
        self.seen = self._seen() if params.repetition_penalty != 1.0 else None  # bool [B, V]
        self.counts = self._zeros() if params.presence_penalty or params.frequency_penalty else None  # [B, V]
        cache.owner = weakref.ref(self)  # lent to this run while it lives (engine._cache_for)

    @property
    def rows(self) -> int:
        return self.batch.ids.shape[0]

    # -- the model -------------------------------------------------------------------------------

    @torch.inference_mode()
    def prefill(self) -> Tensor:
        """The prompts [B, P] into slots 0..P-1 -> the last position's logits [B, V]."""
        P = self.batch.ids.shape[1]
        hidden = self._forward(self.batch.ids, 0)  # [B, P, D]
        self.slot = P
        return self.engine.head(hidden[:, -1])  # [B, V]

    @torch.inference_mode()
    def decode(self, token: Tensor) -> Tensor:
        """token [B] at slot `self.slot` -> logits [B, V] of the next one."""
        self._check_room(1)
        slot = torch.tensor([self.slot], device=self.engine.device)
        ctx, positions = self._context(slot)
        ids = token[:, None]  # [B, 1]
        logits = self.engine.decode_logits(ids, positions, ctx, self.cache,
                                           record=self.decodes >= CAPTURE_AFTER)  # [B, V]
        self.slot += 1
        self.decodes += 1
        return logits

    @torch.inference_mode()
    def verify(self, tokens: Tensor) -> Tensor:
        """tokens [B, S] at slots slot..slot+S-1 in one forward -> logits [B, S, V]: each row of the
        pass sees what its own decode step would (keys up to its slot), so verifying k proposals
        reads the weights once instead of k times."""
        S = tokens.shape[1]
        self._check_room(S)
        hidden = self._forward(tokens, self.slot)
        self.slot += S
        self.decodes += S
        return self.engine.head(hidden)  # [B, S, V]

    def rewind(self, slot: int) -> None:
        """The next write goes to `slot` (between the prompt's end and the current slot): the keys and
        values beyond it are stale, never attended to, and written over by the next pass."""
        if not self.batch.ids.shape[1] <= slot <= self.slot:
            raise InputError(f"rewind to slot {slot}: outside [{self.batch.ids.shape[1]}, {self.slot}] "
                             "(the prompt's end .. the current write position)")
        if self.slot - slot > self.cache.rewind_limit:
            raise InputError(f"rewind of {self.slot - slot} slots: a sliding-window layer's ring keeps "
                             f"{self.cache.rewind_limit} beyond its window")
        self.slot = slot

    def _forward(self, ids: Tensor, start: int) -> Tensor:
        """ids [B, S] at cache slots start..start+S-1, eagerly -> final hidden states [B, S, D]. The pass
        attends over the slots up to its last one only (none later is written yet): a prompt of 512
        tokens in a cache of 768 slots reads 512 keys, not 768."""
        S = ids.shape[1]
        ctx, positions = self._context(torch.arange(start, start + S, device=self.engine.device), keys=start + S,
                                       new_keys_only=start == 0 and S > 1 and self._exact)
        return self.engine.model.stack.run(ids, ctx, position_ids=positions, cache=self.cache)

    @property
    def _exact(self) -> bool:
        """Whether the cache holds keys and values as computed (floats in the branches' dtype) and no row
        is padded: a prompt's pass can then attend over its new keys alone (Context.new_keys_only)."""
        return self.valid is None and self.cache.kind is None and self.cache.dtype == self.engine.branch_dtype

    def _context(self, slots: Tensor, keys: int | None = None, *, new_keys_only: bool = False):
        """The Context of queries at `slots` over the cache's first `keys` slots (default all: a decode
        step's shapes stay the same from step to step, so that it can be captured)."""
        positions = self.batch.positions(slots)  # [B, S]
        valid = self.valid if self.valid is None or keys is None else self.valid[:, :keys]
        ctx = self.tables.build(positions, q_slots=slots, keys=keys, key_valid=valid, input_pos=slots,
                                new_keys_only=new_keys_only)
        return ctx, positions

    def _check_room(self, n: int) -> None:
        if self.slot + n > self.cache.max_len:
            raise InputError(f"{n} more tokens at slot {self.slot} overflow this run's cache of "
                             f"{self.cache.max_len} slots (prompt + max_new_tokens)")

    # -- choosing tokens -------------------------------------------------------------------------

    @torch.inference_mode()
    def choose(self, logits: Tensor) -> Tensor:
        """logits [B, V] -> the next token [B] under this run's sampling parameters; recorded as generated."""
        token = next_tokens(logits, self.params, seen=self.seen, counts=self.counts, generator=self.generator)
        self.observe(token[:, None])
        return token

    def observe(self, tokens: Tensor) -> None:
        """tokens [B, n] were emitted: the repetition penalty has seen them, the presence and frequency
        penalties count them."""
        if self.seen is not None:
            self.seen.scatter_(1, tokens, True)
        if self.counts is not None:
            self.counts.scatter_add_(1, tokens, torch.ones_like(tokens))

    def _zeros(self) -> Tensor:
        return torch.zeros(self.rows, self.engine.config.vocab_size, dtype=torch.long, device=self.engine.device)

    def _seen(self) -> Tensor:
        """bool [B, V]: the tokens of each row's prompt (padding excluded), for the repetition penalty."""
        ids = self.batch.ids
        real = torch.arange(ids.shape[1], device=ids.device)[None] >= self.batch.padding[:, None]  # [B, P]
        return self._zeros().scatter_add_(1, ids, real.long()) > 0  # [B, V]
