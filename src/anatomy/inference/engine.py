"""Prefill + decode for decoder-only models over a static KV cache.

    prompts (lists of ids, any lengths)
      -> left-padded ids [B, P]; cache [B, H_kv, T, d_h] per layer with T = P + max_new_tokens
      -> prefill: one forward over [B, P] at slots 0..P-1, logits of the last position only
      -> decode: one forward over [B, 1] at slot P+j per step, attending over all T slots

Left padding keeps every row's newest token in the same slot, so one input_pos serves the whole
batch; `attention_mask [B, T]` hides the padding slots and `position_ids [B, S]` (slot minus the
row's padding) gives each row the positions it would have alone. Everything a step needs has the
same shape at every step, so `compile=True` compiles the step once per (B, T).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch
from torch import Tensor, nn

from anatomy.inference.chunked_linear import use_chunked_linears
from anatomy.inference.kv_cache import KVCache
from anatomy.inference.sampling import SamplingParams, make_generator, next_tokens
from anatomy.inference.view import engine_view

COMPILE_BUCKET = 256  # a compiled step is specialised to T: round T up so few sizes occur


@dataclass(frozen=True)
class PaddedBatch:
    """Prompts left-padded to one length: ids [B, P], padding [B] (pad slots at the start of each row)."""

    ids: Tensor
    padding: Tensor

    @classmethod
    def of(cls, prompts: list[list[int]], *, pad_id: int = 0, device: torch.device | str = "cpu") -> PaddedBatch:
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
        """attention_mask [B, T]: False on each row's padding slots; None when nothing is padded."""
        if not self.padded:
            return None
        return torch.arange(max_len, device=self.ids.device)[None] >= self.padding[:, None]

    def positions(self, slots: Tensor) -> Tensor | None:
        """position_ids [B, S] of the tokens at `slots` [S]; None when nothing is padded."""
        if not self.padded:
            return None
        return slots[None] - self.padding[:, None]


class DecoderEngine:
    """Generates token ids from a DecoderLM: `for tokens in engine.tokens(prompts, params)` yields
    the next token of every row ([B] LongTensor), up to params.max_new_tokens times; the caller
    decides when to stop (EOS, stop strings) by no longer asking.

    `engine.model` is the engine's own view of the model it was given (inference/view.py): the
    same weights, its own modules, so the caller's model is never changed.
    """

    def __init__(self, model: nn.Module, *, compile: bool = False) -> None:
        self.model = engine_view(model)
        use_chunked_linears(self.model)
        self.compiled = compile
        self._step = _compiled(self._forward) if compile else self._forward
        self._caches: dict[tuple[int, int], KVCache] = {}
        self.last_cache: KVCache | None = None  # the latest call's cache, for inspection

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def tokens(self, prompts: list[list[int]], params: SamplingParams) -> Iterator[Tensor]:
        config = self.model.config
        pad_id = config.pad_token_id if config.pad_token_id is not None else 0
        batch = PaddedBatch.of(prompts, pad_id=pad_id, device=self.device)
        B, P = batch.ids.shape
        cache = self._cache_for(B, P + params.max_new_tokens)
        self.last_cache = cache
        mask = batch.slot_mask(cache.max_len)
        generator = make_generator(params.seed, self.device)
        seen = self._seen(batch) if params.repetition_penalty != 1.0 else None

        prompt_slots = torch.arange(P, device=self.device)
        logits = self._prefill(batch.ids, mask, batch.positions(prompt_slots), cache, prompt_slots)
        token = self._choose(logits, params, seen, generator)
        yield token
        slot = torch.tensor([P], device=self.device)
        for _ in range(params.max_new_tokens - 1):
            logits = self._decode(token[:, None], mask, batch.positions(slot), cache, slot)
            token = self._choose(logits, params, seen, generator)
            yield token
            slot = slot + 1

    @torch.inference_mode()
    def _prefill(self, ids: Tensor, mask: Tensor | None, positions: Tensor | None, cache: KVCache,
                 slots: Tensor) -> Tensor:
        return self._forward(ids, mask, positions, cache, slots)

    @torch.inference_mode()
    def _decode(self, ids: Tensor, mask: Tensor | None, positions: Tensor | None, cache: KVCache,
                slot: Tensor) -> Tensor:
        return self._step(ids, mask, positions, cache, slot)

    def _forward(self, ids: Tensor, mask: Tensor | None, positions: Tensor | None, cache: KVCache,
                 slots: Tensor) -> Tensor:
        """ids [B, S] at cache slots [S] -> logits of the last position [B, V]."""
        logits = self.model(ids, attention_mask=mask, position_ids=positions, cache=cache, input_pos=slots,
                            last_only=True)
        return logits[:, -1]  # [B, 1, V] -> [B, V]

    @torch.inference_mode()
    def _choose(self, logits: Tensor, params: SamplingParams, seen: Tensor | None,
                generator: torch.Generator | None) -> Tensor:
        token = next_tokens(logits, params, seen=seen, generator=generator)  # [B]
        if seen is not None:
            seen.scatter_(1, token[:, None], True)
        return token

    def _seen(self, batch: PaddedBatch) -> Tensor:
        """bool [B, V]: the tokens of each row's prompt (padding excluded), for the repetition penalty."""
        B, P = batch.ids.shape
        counts = torch.zeros(B, self.model.config.vocab_size, dtype=torch.long, device=self.device)
        real = torch.arange(P, device=self.device)[None] >= batch.padding[:, None]  # [B, P]
        return counts.scatter_add_(1, batch.ids, real.long()) > 0  # [B, V]

    def _cache_for(self, batch: int, max_len: int) -> KVCache:
        """A cache of exactly the needed length (eager); compiled, one kept per (batch, bucketed length),
        so that the compiled step always sees the same cache objects and is not compiled again."""
        dtype = next(self.model.parameters()).dtype
        if not self.compiled:
            return KVCache(self.model.config, batch=batch, max_len=max_len, dtype=dtype, device=self.device)
        max_len = min(-(-max_len // COMPILE_BUCKET) * COMPILE_BUCKET, self.model.config.max_seq_len)
        key = (batch, max_len)
        if key not in self._caches:
            self._caches[key] = KVCache(self.model.config, batch=batch, max_len=max_len, dtype=dtype,
                                        device=self.device)
        return self._caches[key]


def _compiled(step):
    """The decode step compiled by inductor: weights frozen as constants, GEMM kernels chosen by autotuning."""
    return torch.compile(step, dynamic=False, options={"freezing": True, "max_autotune": True})
