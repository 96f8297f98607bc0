"""Prefill + decode for decoder-only models over a static KV cache.

    prompts (lists of ids, any lengths)
      -> left-padded ids [B, P]; cache [B, H_kv, T, d_h] per layer with T = P + max_new_tokens
      -> prefill: one forward over [B, P] at slots 0..P-1, logits of the last position only
      -> decode: one forward over [B, 1] at slot P+j per step, attending over all T slots

Left padding keeps every row's newest token in the same slot, so one input_pos serves the whole
batch; `attention_mask [B, T]` hides the padding slots and `position_ids [B, S]` (slot minus the
row's padding) gives each row the positions it would have alone. Everything a step needs has the
same shape at every step, so on a CPU the blocks of a decode step are captured as a graph once per
(B, T) (inference/capture.py) and replayed without Python in between, and `compile=True` compiles
the step instead.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch import Tensor, nn

from anatomy.inference.capture import Captured, capture, signature
from anatomy.inference.kv_cache import KVCache
from anatomy.kernels.planning import branch_dtype, decode_weight_bytes, kernel_summary, plan_view
from anatomy.inference.sampling import SamplingParams, make_generator, next_tokens
from anatomy.inference.steps import DecodeSteps, PaddedBatch
from anatomy.inference.view import engine_view

BUCKET = 256  # a compiled or captured step is specialised to T: round T up so few sizes occur
CAPTURE_AFTER = 32  # eager decode steps of a generation before its shape is captured: a short answer
                    # does not pay for the recording (~0.7 s for SmolLM2, ~140 steps' worth of the gain)


class DecoderEngine:
    """Generates token ids from a DecoderLM: `for tokens in engine.tokens(prompts, params)` yields
    the next token of every row ([B] LongTensor), up to params.max_new_tokens times; the caller
    decides when to stop (EOS, stop strings) by no longer asking.

    `engine.model` is the engine's own view of the model it was given (inference/view.py): the
    same weights, its own modules, so the caller's model is never changed.

    compile=True compiles the decode step with torch.compile; otherwise, on a CPU, `capture` (default
    True) replays the blocks of each decode step from a graph traced once per batch size and cache
    length. Either way the engine then keeps one cache per (batch, length rounded up to BUCKET).
    """

    def __init__(self, model: nn.Module, *, compile: bool = False, capture: bool = True,
                 plan_cache: bool = True) -> None:
        self.model = engine_view(model)
        self.plan = plan_view(self.model, compile=compile, cache=plan_cache)
        self.branch_dtype = branch_dtype(self.plan, self.dtype)  # RoPE, the KV cache and attention compute in it
        self.compiled = compile
        self.captured = capture and not compile and self.device.type == "cpu"
        self._compiled_step = _compiled(self._forward_step) if compile else None
        self._caches: dict[tuple[int, int], KVCache] = {}
        self._bodies: dict[tuple, Captured | None] = {}  # (cache, Context fields) -> the captured blocks
        self.last_cache: KVCache | None = None  # the latest call's cache, for inspection

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def kernel_summary(self) -> list[str]:
        """Per phase, the kernels the plan chose and for how many layers."""
        return kernel_summary(self.plan)

    @property
    def decode_weight_bytes(self) -> int:
        """Bytes of weights a batch-1 decode step reads (each linear layer's decode layout)."""
        return decode_weight_bytes(self.plan, self.model)

    @property
    def dtype(self) -> torch.dtype:
        """The residual stream's dtype: the model's (that of its token embeddings)."""
        return self.model.stack.embed.dtype

    def tokens(self, prompts: list[list[int]], params: SamplingParams) -> Iterator[Tensor]:
        config = self.model.config
        pad_id = config.pad_token_id if config.pad_token_id is not None else 0
        batch = PaddedBatch.of(prompts, pad_id=pad_id, device=self.device)
        B, P = batch.ids.shape
        cache = self._cache_for(B, P + params.max_new_tokens)
        self.last_cache = cache
        steps = DecodeSteps(self.model.stack, batch, max_len=cache.max_len, dtype=self.branch_dtype)
        generator = make_generator(params.seed, self.device)
        seen = self._seen(batch) if params.repetition_penalty != 1.0 else None
        counts = self._counts(B) if params.presence_penalty or params.frequency_penalty else None

        logits = self._prefill(batch, cache)
        token = self._choose(logits, params, seen, generator, counts)
        yield token
        slot = torch.tensor([P], device=self.device)
        for step in range(params.max_new_tokens - 1):
            logits = self._decode(token, slot, steps, cache, record=step >= CAPTURE_AFTER)
            token = self._choose(logits, params, seen, generator, counts)
            yield token
            slot = slot + 1

    @torch.inference_mode()
    def _prefill(self, batch: PaddedBatch, cache: KVCache) -> Tensor:
        """The prompts [B, P] into cache slots 0..P-1 through the model's checked forward -> logits [B, V]."""
        slots = torch.arange(batch.ids.shape[1], device=self.device)
        logits = self.model(batch.ids, attention_mask=batch.slot_mask(cache.max_len), position_ids=batch.positions(slots),
                            cache=cache, input_pos=slots, last_only=True)
        return logits[:, -1]  # [B, 1, V] -> [B, V]

    @torch.inference_mode()
    def _decode(self, token: Tensor, slot: Tensor, steps: DecodeSteps, cache: KVCache, record: bool = True) -> Tensor:
        """One decode step: compiled, captured (recording this shape first when `record`), or eager."""
        if self._compiled_step is not None:
            return self._compiled_step(token, slot, steps, cache)
        return self._forward_step(token, slot, steps, cache, record)

    def _forward_step(self, token: Tensor, slot: Tensor, steps: DecodeSteps, cache: KVCache,
                      record: bool = False) -> Tensor:
        """One decode step, nothing checked (the tokens are the engine's own): token [B] written at
        cache slot `slot` [1] -> logits [B, V]."""
        ctx, positions = steps.context(slot)
        ids = token[:, None]  # [B, 1]
        body = self._body(cache, ids, positions, ctx, record) if self.captured else None
        if body is not None:
            hidden = body(ids, positions, ctx)  # [B, D]
        else:
            hidden = self.model.stack.run(ids, ctx, position_ids=positions, cache=cache)[:, -1]  # [B, D]
        return self.head(hidden)  # [B, V]

    def _body(self, cache: KVCache, ids: Tensor, positions: Tensor, ctx, record: bool) -> Captured | None:
        """The captured blocks for this cache and Context fields, recorded now if `record` and not yet
        (None: not recorded yet, or not capturable)."""
        key = (id(cache), signature(ctx))  # the cache fixes the batch and length (kept alive in self._caches)
        if key not in self._bodies and record:
            self._bodies[key] = capture(self.model.stack, cache, ids, positions, ctx)
        return self._bodies.get(key)

    def head(self, hidden: Tensor) -> Tensor:
        """Final hidden states [..., D] -> logits [..., V]: the LM head and the model's soft cap, if any
        (as the model's own forward, which the prefill runs)."""
        logits = self.model.lm_head(hidden)
        cap = self.model.config.logit_softcap
        return torch.tanh(logits / cap) * cap if cap is not None else logits

    @torch.inference_mode()
    def _choose(self, logits: Tensor, params: SamplingParams, seen: Tensor | None,
                generator: torch.Generator | None, counts: Tensor | None = None) -> Tensor:
        token = next_tokens(logits, params, seen=seen, counts=counts, generator=generator)  # [B]
        if seen is not None:
            seen.scatter_(1, token[:, None], True)
        if counts is not None:
            counts.scatter_add_(1, token[:, None], torch.ones_like(token[:, None]))
        return token

    def _counts(self, batch: int) -> Tensor:
        """[B, V] zeros: how often each row generated each token, for the presence/frequency penalties."""
        return torch.zeros(batch, self.model.config.vocab_size, dtype=torch.long, device=self.device)

    def _seen(self, batch: PaddedBatch) -> Tensor:
        """bool [B, V]: the tokens of each row's prompt (padding excluded), for the repetition penalty."""
        B, P = batch.ids.shape
        counts = torch.zeros(B, self.model.config.vocab_size, dtype=torch.long, device=self.device)
        real = torch.arange(P, device=self.device)[None] >= batch.padding[:, None]  # [B, P]
        return counts.scatter_add_(1, batch.ids, real.long()) > 0  # [B, V]

    def _cache_for(self, batch: int, max_len: int) -> KVCache:
        """A cache of exactly the needed length (eager); compiled or captured, one kept per (batch,
        bucketed length), so that the step always sees the same cache objects (a compiled step is not
        compiled again, a captured one was recorded writing to them)."""
        dtype = self.branch_dtype
        if not (self.compiled or self.captured):
            return KVCache(self.model.config, batch=batch, max_len=max_len, dtype=dtype, device=self.device)
        max_len = min(-(-max_len // BUCKET) * BUCKET, self.model.config.max_seq_len)
        key = (batch, max_len)
        if key not in self._caches:
            self._caches[key] = KVCache(self.model.config, batch=batch, max_len=max_len, dtype=dtype,
                                        device=self.device)
        return self._caches[key]


def _compiled(step):
    """The decode step compiled by inductor, its small ops fused around the planned matrix kernels
    (which stay the plan's: no GEMM autotuning, the slow part of a cold start)."""
    return torch.compile(step, dynamic=False)
