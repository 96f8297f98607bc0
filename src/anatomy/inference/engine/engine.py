"""DecoderEngine: the one way to run a decoder-only model.

It owns the engine's view of the model (the caller's model is never changed), its measured kernel
plan, its captured decode steps and the LM head. Every path runs `step` (a batch of chunks over a
paged cache): serving directly, and `start`/`tokens` (a generation: run.py) through a cache lent to
the run. A decode step's blocks are captured once per shape (capture.py) and replayed; a run's
caches are kept per (batch, length rounded up to BUCKET).
The API with shapes: docs/inference.md, "The engine API".
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from typing import Iterable, Iterator

import torch
from torch import Tensor, nn

from anatomy import dtypes, kv_format
from anatomy.deprecation import deprecated
from anatomy.errors import InputError
from anatomy.huge_pages import hold as hold_on_huge_pages
from anatomy.inference.engine.backend import backend_for
from anatomy.inference.engine.capture import Captured, capture_paged, compile_paged, signature
from anatomy.inference.engine.flat_batch import by_length, flat_inputs
from anatomy.inference.engine.held import held_tensors
from anatomy.inference.engine.paged import Chunk, PagedKVCache, paged_inputs
from anatomy.inference.engine.run import PaddedBatch, Run, ring_blocks
from anatomy.inference.engine.view import engine_view
from anatomy.inference.sampling import SamplingParams
from anatomy.kernels import native
from anatomy.kernels import plan as kernel_plan
from anatomy.kernels.attention import decode_reader, paged_reader, prompt_attention
from anatomy.layers.attention import Attention
from anatomy.kernels.decode_block import fuse_blocks
from anatomy.kernels.sampled_rows import near_sampled
from anatomy.kernels.planning import branch_dtype, decode_weight_bytes, kernel_summary, linear_layers, plan_view
from anatomy.kv_format import parse_kv_dtype
from anatomy.lora.slots import AdapterSlots

BUCKET = 256  # a compiled or captured step is specialised to the blocks it reads: round them up so few sizes occur
PAGED_RECORD_AFTER = 32  # paged decode steps of one shape before it is captured: a short answer does not pay
                         # for the recording, which costs many steps' worth of the gain
RUN_BLOCK = 16  # tokens per block of a run's cache


class DecoderEngine:
    """Runs a DecoderLM on its measured kernel plan.

    compile=True compiles the decode step with torch.compile; otherwise, on a CPU, `capture` (default
    True) replays the blocks of each decode step from a graph traced once per shape. `attention`
    ("sdpa" or "eager") sets the backend of the view's attention layers (default: the model's).
    `kv_dtype` is what the KV caches hold: None (the branches' dtype), "f32", "f16", "bf16", or 8-bit
    codes with a scale per token and head, "int8", "fp8_e4m3", "fp8_e5m2" (anatomy/kv_format.py).
    `native_blocks` (default) runs each LLaMA-style block of a decode step with int4/5/6/8 weights as
    one native operator where it measures faster than the block (kernels/decode_block.py); False keeps
    the torch blocks. `layout_budget` is the bytes (or "2GiB", "0.25" of RAM) the kernel plan may spend
    on second layouts of the weights, e.g. a dense copy for faster prefill (default: $ANATOMY_LAYOUT_BUDGET,
    else none: one compact layout per weight). `take_weights=True` gives each compact weight's memory
    back as soon as its layouts are built, so the process holds the weights once (a layout is a copy
    in the kernels' order); the caller's model is then empty (its formats raise InputError): for a
    model nothing else will use, as `anatomy generate` and `anatomy serve` load theirs. `backend`
    ("cpu" or "torch", backend.py; default: the device's) is which operators the steps run: the
    measured plan and native operators, or torch's own (what a GPU runs). `huge_pages` (the cpu backend)
    moves the weights' layouts onto 2 MiB pages once they are built (`huge_page_bytes`: the bytes placed so).
    """

    def __init__(self, model: nn.Module, *, compile: bool = False, capture: bool = True, plan_cache: bool = True,
                 attention: str | None = None, kv_dtype: str | None = None, native_blocks: bool = True,
                 layout_budget: int | str | None = None, take_weights: bool = False,
                 backend: str | None = None, huge_pages: bool = True) -> None:
        if not getattr(getattr(model, "config", None), "is_decoder", False):
            raise InputError(f"DecoderEngine needs a decoder-only anatomy model, got {type(model).__name__}")
        self.backend = backend_for(next(model.parameters()).device, backend)
        self.argmax = self.backend.greedy_choice()  # float32 logits [B, V] -> greedy tokens [B]
        native_ops = self.backend.native
        self.model = engine_view(model, attention=attention, native_norms=native_ops and not compile)
        if self.device.type == "cpu":
            _warn_if_threads_sleep()
        # each decode block as one native operator (kernels/decode_block.py)
        fusing = native_blocks and native_ops and not compile
        formats = {name: fmt for name, (fmt, _) in linear_layers(self.model).items()} if fusing else {}
        budget = layout_budget if layout_budget is None or isinstance(layout_budget, int) else \
            kernel_plan.layout_budget(layout_budget)
        self.plan = plan_view(self.model, compile=compile, cache=plan_cache, layout_budget=budget,
                              take_weights=take_weights, dense=not native_ops)
        self._plan_cache = plan_cache  # where the kept decisions (kernels/decisions.py) are read and kept
        self.native_blocks = fuse_blocks(self.model, self.plan, formats, cache=plan_cache) if fusing else 0
        self.branch_dtype = branch_dtype(self.plan, self.dtype)  # RoPE and attention compute in it
        kv = parse_kv_dtype(kv_dtype) or dtypes.name_of(self.branch_dtype)
        self.kv_dtype = kv  # what the caches hold (a name: f32, bf16, int8, ...)
        self._codes = kv if kv in kv_format.CODES else None
        self._cache_dtype = self.branch_dtype if self._codes else dtypes.torch_dtype(kv)
        self._reader = native.read_cache if self._codes and native_ops and native.loaded() else None
        if self._codes is None and native_ops and not compile:  # SDPA or the native reader, measured
            self._read_float_caches(decode_reader(self.config, self._cache_dtype, cache=plan_cache))
        if native_ops and not compile:  # a prompt's attention over its own keys: SDPA or the native kernel, measured
            self._attend_prompts(prompt_attention(self.config, self.branch_dtype, cache=plan_cache))
        self.compiled = compile
        # a mixture of experts routes by value: no trace holds its step (capture.py), so none is padded for one
        self.captured = self.backend.captures(capture, compile) and not any(b.moe for b in self.model.stack.blocks)
        self._caches: dict[tuple, list[PagedKVCache]] = {}  # (blocks, block size, window blocks) -> caches lent
        self._bodies: dict[tuple, Captured | None] = {}  # (cache, shape, PassInputs fields) -> the captured blocks
        self._seen_shapes: dict[tuple, int] = {}  # paged decode shapes -> steps run eagerly so far
        self.lora: AdapterSlots | None = None  # the LoRA adapters served (serve_adapters)
        # the layouts each decode step streams, on 2 MiB pages where the system gives them (huge_pages.py)
        self.huge_page_bytes = hold_on_huge_pages(_layouts(self.model)) if huge_pages and native_ops else 0

    def _self_attention(self) -> Iterator[Attention]:
        """The view's self-attention layers (a decoder-only stack's: causal)."""
        return (m for m in self.model.modules() if isinstance(m, Attention) and not m.cross)

    def _read_float_caches(self, reader) -> None:
        for module in self._self_attention():
            module.reader = reader

    def _attend_prompts(self, kernel) -> None:
        for module in self._self_attention():
            module.causal_kernel = kernel

    # -- what it is --------------------------------------------------------------------------------

    @property
    def config(self):
        return self.model.config

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The residual stream's dtype: the model's (that of its token embeddings)."""
        return self.model.stack.embed.dtype

    def kernel_summary(self) -> list[str]:
        """Per phase, the kernels the plan chose and for how many layers."""
        return kernel_summary(self.plan)

    @property
    def weight_bytes(self) -> int:
        """Bytes of the weights the engine holds (held_bytes of its view): a process that keeps the
        model as well (anatomy.generate, `anatomy generate`) holds held_bytes(model, engine.model)."""
        return held_bytes(self.model)

    @property
    def captured_graphs(self) -> int:
        """How many decode-step shapes (static and paged) are replayed from a captured graph so far."""
        return sum(body is not None for body in self._bodies.values())

    @property
    def decode_weight_bytes(self) -> int:
        """Bytes of weights a batch-1 decode step reads (each linear layer's decode layout)."""
        return decode_weight_bytes(self.plan, self.model)

    # -- the numbers -------------------------------------------------------------------------------

    def head(self, hidden: Tensor) -> Tensor:
        """Final hidden states [..., D] -> logits [..., V]: the model's LM head with its soft cap."""
        return self.model.logits(hidden)

    @torch.inference_mode()
    def hidden_states(self, ids: Tensor, *, attention_mask: Tensor | None = None) -> Tensor:
        """ids [B, S] -> final hidden states [B, S, D] of one full pass (no cache), every input checked."""
        return self.model.stack(ids, attention_mask=attention_mask)

    def logits(self, ids: Tensor, *, attention_mask: Tensor | None = None) -> Tensor:
        """ids [B, S] -> logits [B, S, V] of one full pass: position i predicts token i + 1."""
        with torch.inference_mode():
            return self.head(self.hidden_states(ids, attention_mask=attention_mask))

    # -- generation: a run over a cache lent to it -------------------------------------------------

    def start(self, prompts: list[list[int]], params: SamplingParams | None = None) -> Run:
        """A Run of `prompts` (lists of ids) with room for params.max_new_tokens more tokens."""
        params = params or SamplingParams()
        pad_id = self.config.pad_token_id if self.config.pad_token_id is not None else 0
        batch = PaddedBatch.of(prompts, pad_id=pad_id, device=self.device)
        B, P = batch.ids.shape
        if P + params.max_new_tokens > self.config.max_seq_len:
            raise InputError(f"a {P}-token prompt + max_new_tokens={params.max_new_tokens} overflows the model's "
                             f"context of {self.config.max_seq_len} tokens (max_seq_len)")
        step = BUCKET if self.captured or self.compiled else RUN_BLOCK  # graphs: few shapes; eager: few slots
        length = -(-(P + params.max_new_tokens) // step) * step
        ring = ring_blocks(self.config, blocks=length // RUN_BLOCK, block_size=RUN_BLOCK, prompt=P,
                           exact=self._codes is None and self._cache_dtype == self.branch_dtype)
        return Run(self, batch, self._cache_for(B, length, ring), params)

    def tokens(self, prompts: list[list[int]], params: SamplingParams) -> Iterator[Tensor]:
        """The next token of every row ([B] LongTensor), up to params.max_new_tokens times; the caller
        decides when to stop (EOS, stop strings) by no longer asking."""
        run = self.start(prompts, params)
        token = run.choose(run.prefill())
        yield token
        for _ in range(params.max_new_tokens - 1):
            token = run.choose(run.decode(token))
            yield token

    def decode_logits(self, ids: Tensor, positions: Tensor, ctx, cache, *, record: bool) -> Tensor:
        """Deprecated: one eager decode step over a cache of the caller's; a Run's steps are `step`."""
        deprecated("DecoderEngine.decode_logits is deprecated; a generation's steps run through engine.step "
                   "(engine.start(...).decode)")
        with torch.inference_mode():
            return self.head(self._eager_hidden(ids, positions, ctx, cache))

    def decode_hidden(self, ids: Tensor, positions: Tensor, ctx, cache, *, record: bool) -> Tensor:
        """Deprecated: the final hidden states [B, D] of one eager decode step; `step` is the step."""
        deprecated("DecoderEngine.decode_hidden is deprecated; a generation's steps run through engine.step")
        with torch.inference_mode():
            return self._eager_hidden(ids, positions, ctx, cache)

    def _eager_hidden(self, ids: Tensor, positions: Tensor, ctx, cache) -> Tensor:
        return self.model.stack.forward_pass(ids, ctx, position_ids=positions, cache=cache)[:, -1]  # [B, D]

    def _cache_for(self, batch: int, length: int, ring: int | None) -> PagedKVCache:
        """A paged cache of `batch` tables of `length` tokens (and rings of `ring` blocks for the
        sliding-window layers), lent to one run."""
        return self.lend_cache(num_blocks=batch * length // RUN_BLOCK, block_size=RUN_BLOCK,
                               window_blocks=batch * ring if ring else None)

    def lend_cache(self, *, num_blocks: int, block_size: int, window_blocks: int | None = None) -> PagedKVCache:
        """A paged cache for one user at a time (a run, a serving loop), who sets `cache.owner` to a weak
        reference to itself. An engine that captures or compiles keeps it per shape, so that a shape's
        recorded steps are replayed by the cache's next user instead of recorded again; any other engine
        makes a fresh one. A cache whose user is alive is not lent again: a second one is made."""
        key = (num_blocks, block_size, window_blocks)
        pool = self._caches.setdefault(key, []) if self.captured or self.compiled else []
        for cache in pool:
            if cache.owner is None or cache.owner() is None:
                return cache
        pool.append(self.paged_cache(num_blocks=num_blocks, block_size=block_size, window_blocks=window_blocks))
        pool[-1].owner = None
        return pool[-1]

    # -- serving over a paged cache ----------------------------------------------------------------

    def paged_cache(self, *, num_blocks: int, block_size: int, window_blocks: int | None = None) -> PagedKVCache:
        """A paged KV cache of `num_blocks` blocks of `block_size` tokens holding the engine's kv_dtype
        (`window_blocks`: the sliding-window layers' own group of blocks, paged.py); attention reads a
        float one's blocks in place where that measures faster than gathering them."""
        return PagedKVCache(self.config, num_blocks=num_blocks, block_size=block_size, dtype=self._cache_dtype,
                            device=self.device, codes=self._codes, reader=self._paged_reader,
                            window_blocks=window_blocks, compute_dtype=self.branch_dtype)

    @functools.cached_property
    def _paged_reader(self):
        """The reader of a paged cache's blocks, decided once per engine (a run's cache is made per run)."""
        if self._codes is None and self.backend.native and not self.compiled:
            return paged_reader(self.config, self._cache_dtype, cache=self._plan_cache)
        return self._reader

    @torch.inference_mode()
    def step(self, cache: PagedKVCache, chunks: list[Chunk], *, blocks: int | None = None) -> Tensor:
        """One forward over a batch of chunks (each a sequence's next tokens at its positions, through
        its block table) -> the logits [R, V] of every chunk's last `logits` tokens, chunk after chunk.
        A batch of single tokens (decode) runs on a captured (or compiled) graph of its shape, rounded
        up; `blocks`: the blocks each row reads at least (a run reads its whole table: one shape).
        Chunks of one length run as rows [B, S]; of several lengths as one flat batch [1, T] (flat_batch.py)."""
        adapters = [c.adapter for c in chunks] if self.lora is not None and any(c.adapter for c in chunks) else None
        if len({len(c.tokens) for c in chunks}) > 1:  # chunks of several lengths: one forward over a flat batch
            return self._flat_step(cache, chunks, lora=adapters is not None)
        graph = (self.captured or self.compiled) and adapters is None and all(len(c.tokens) == 1 for c in chunks)
        inputs = paged_inputs(self.model.stack, cache, chunks, rows=_rows_bucket(len(chunks)) if graph else None,
                              blocks_multiple=max(1, BUCKET // cache.block_size) if graph else None, blocks=blocks)
        if graph:
            return self._paged_decode(cache, inputs)[:len(chunks)]  # [B, V]
        else:
            scales = [c.adapter_scale for c in chunks]
            rows, new = inputs.ids.shape
            wanted = (inputs.wanted[0] * new + inputs.wanted[1]).tolist()
            with self.lora.rows(adapters, scales) if adapters else contextlib.nullcontext(), \
                    self._near_sampled(wanted, rows * new):
                hidden = self.model.stack.forward_pass(inputs.ids, inputs.ctx, position_ids=inputs.positions,
                                                       cache=cache.layers(inputs.where))  # [B, S, D]
        return self.head(hidden[inputs.wanted])  # [R, V]

    def _flat_step(self, cache: PagedKVCache, chunks: list[Chunk], *, lora: bool) -> Tensor:
        """One eager forward over chunks of several lengths laid end to end (flat_batch.py)."""
        inputs = flat_inputs(self.model.stack, cache, chunks, by_length(chunks))
        with self.lora.rows(inputs.adapters, inputs.scales) if lora else contextlib.nullcontext(), \
                self._near_sampled(inputs.wanted.tolist(), inputs.ids.shape[1]):
            hidden = self.model.stack.forward_pass(inputs.ids, inputs.ctx, position_ids=inputs.positions,
                                                   cache=inputs.layers)  # [1, T, D]
        return self.head(hidden[0, inputs.wanted])  # [R, V]

    def _near_sampled(self, wanted: list[int], rows: int) -> contextlib.AbstractContextManager:
        """The pass's rows far from a sampled one may take the plan's fastest kernel (kernels/sampled_rows.py),
        unless the cache holds 8-bit codes: it rounds every key and value already, and int8 activations on top
        flipped a near-tie of the first answer token that either alone keeps."""
        return near_sampled(wanted, rows) if self._codes is None else contextlib.nullcontext()

    def serve_adapters(self, *, max_loras: int, max_rank: int) -> AdapterSlots:
        """Serve up to `max_loras` LoRA adapters of rank <= max_rank at once (lora/slots.py): a chunk's
        `adapter` slot picks its row's; the base product stays the plan's. A step with adapters runs
        eagerly (its decode steps are not captured)."""
        if self.lora is not None:
            raise InputError("this engine already serves adapters")
        if self.native_blocks:
            raise InputError("serving LoRA adapters needs the blocks as torch modules: make the engine with "
                             "native_blocks=False")
        self.lora = AdapterSlots(self.model, max_loras=max_loras, max_rank=max_rank, dtype=self.dtype,
                                 device=self.device)
        return self.lora

    def capture_decode(self, cache: PagedKVCache, batches: Iterable[int]) -> int:
        """Record now the paged decode step of each batch size (rounded up as `step` rounds it) over the
        shortest cache `step` reads, as a server captures its steps before it takes requests, so that
        the first requests replay them instead of running PAGED_RECORD_AFTER steps eagerly and waiting
        for the recording; the recording's rows write to and read from the scratch block only. How
        many decode-step shapes are captured so far (0 where the engine does not capture)."""
        if not self.captured:
            return 0
        for rows in sorted({_rows_bucket(b) for b in batches}):
            chunk = Chunk([0], 0, [cache.scratch], window_blocks=[-1])
            inputs = paged_inputs(self.model.stack, cache, [chunk], rows=rows,
                                  blocks_multiple=max(1, BUCKET // cache.block_size))
            key = _paged_key(cache, inputs)
            if key not in self._bodies:
                self._bodies[key] = capture_paged(self.model.stack, cache, inputs, head=self.model)
        return self.captured_graphs

    def _paged_decode(self, cache: PagedKVCache, inputs) -> Tensor:
        """A decode step of this shape -> logits [B, V]: compiled at once (compile=True), or captured
        after PAGED_RECORD_AFTER eager steps, or eager."""
        key = _paged_key(cache, inputs)
        body = self._bodies.get(key)
        if body is None and key not in self._bodies:
            seen = self._seen_shapes[key] = self._seen_shapes.get(key, 0) + 1
            if self.compiled:
                body = self._bodies[key] = compile_paged(self.model.stack, cache, inputs, head=self.model,
                                                         mode=self.backend.compile_mode(self.device))
            elif seen > PAGED_RECORD_AFTER:
                body = self._bodies[key] = capture_paged(self.model.stack, cache, inputs, head=self.model)
        if body is not None:
            out = body.paged(inputs)
            return out if body.logits else self.head(out)
        layers = cache.layers(inputs.where)
        return self.head(self.model.stack.forward_pass(inputs.ids, inputs.ctx, position_ids=inputs.positions,
                                                       cache=layers)[:, -1])


def _layouts(model: nn.Module) -> list[Tensor]:
    """The tensors the model's modules hold but its parameters and buffers (the caller's model's, formats
    included, which another engine on it may be reading): the layouts the engine built."""
    theirs = {id(t) for t in (*model.parameters(), *model.buffers())}
    return [t for t in held_tensors(model) if id(t) not in theirs]


def _warn_if_threads_sleep() -> None:
    """A CPU decode step runs many short parallel regions (each block's products and attention); with
    OMP_WAIT_POLICY=PASSIVE OpenMP's threads sleep between them and decode slows down severalfold."""
    if os.environ.get("OMP_WAIT_POLICY", "").strip().upper() == "PASSIVE":
        warnings.warn("OMP_WAIT_POLICY=PASSIVE: OpenMP's threads sleep between the ~150 parallel regions of a "
                      "decode step (measured ~3x slower decode); unset it or set it to ACTIVE", RuntimeWarning,
                      stacklevel=3)


def held_bytes(*modules: nn.Module) -> int:
    """Bytes of the weights `modules` hold together: parameters, buffers, every planned layer's
    layouts and every fused block's own (q4 tiles, or a layout the plan did not hold), each storage
    counted once (a layout that is the format's own tensor is no copy; one that is not a tensor,
    FBGEMM's packed fp16 weight, by the bytes its form says it holds)."""
    from anatomy.kernels.decode_block import NativeBlock
    from anatomy.kernels.planned_linear import PlannedLinear

    every = [m for module in modules for m in module.modules()]
    planned = list({id(m): m for m in every if isinstance(m, PlannedLinear)}.values())
    tensors = [t for m in every for t in (*m.parameters(recurse=False), *m.buffers(recurse=False))]
    tensors += [t for m in planned for layout in m.layouts.values() for t in layout if isinstance(t, torch.Tensor)]
    tensors += [t for m in every if isinstance(m, NativeBlock) for t in m.weights]
    return sum(dict(_storage(t) for t in tensors).values()) + sum(m.opaque_bytes for m in planned)


def _storage(t: Tensor) -> tuple[int, int]:
    """(an identity of t's storage, its bytes); an opaque tensor (oneDNN's reordered weight) is its own, and
    one on memory torch's allocator did not give (a chunk of huge pages, a file's map) its own bytes."""
    try:
        storage = t.untyped_storage()
    except NotImplementedError:
        return id(t), t.numel() * t.element_size()
    if not storage.resizable():
        return t.data_ptr(), t.numel() * t.element_size()
    return storage.data_ptr(), storage.nbytes()


def _paged_key(cache: PagedKVCache, inputs) -> tuple:
    """What a captured paged decode step holds for: the cache, the batch, the blocks read, the PassInputs fields."""
    return id(cache), tuple(inputs.ids.shape), inputs.where.blocks, signature(inputs.ctx)


def _rows_bucket(rows: int) -> int:
    """Batch sizes a paged decode step is captured for: powers of two (padding rows write to scratch)."""
    return 1 << (rows - 1).bit_length()
