"""The serving loop: one thread owns the model, the paged KV cache and the scheduler.

    submit(prompt ids, params, sink) / cancel(seq)    from any thread: queued, picked up by the loop
    step():  new and cancelled sequences -> drafts proposed -> scheduler.schedule() -> one engine.step
             over every chunk -> logit_bias, min_tokens, grammar masks -> sample (or keep a draft's
             agreed part) -> detokenize, stop strings -> sink(Event) per token -> finished sequences leave

The model runs only through the engine's public API (`engine.paged_cache`, `engine.step`); `step()`
can also be called directly (tests drive it without a thread). Details: docs/serving.md, "How it works".
"""

from __future__ import annotations

import queue
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from anatomy.errors import InputError, ParallelError
from anatomy.inference.engine import Chunk, DecoderEngine, PagedKVCache
from anatomy.inference.sampling import Penalties, SamplingParams, greedy, make_generator, next_tokens, token_logprobs
from anatomy.text.stops import StopStringFilter, TextRow, eos_ids
from anatomy.serving.blocks import BlockManager
from anatomy.serving.metrics import ServingMetrics
from anatomy.serving.offload import KVOffload, identity
from anatomy.serving.processors import logit_bias, processed, processed_draft
from anatomy.serving.prompt_logprobs import PromptLogprobStore, record, wants_prompt_logits
from anatomy.serving.scheduler import Scheduler
from anatomy.serving.sequence import Event, Sequence, TokenLogprob
from anatomy.serving.drafting import Drafter
from anatomy.serving.thinking import Thinking, ThinkingState
from anatomy.serving.window_blocks import WindowBlocks
from anatomy.inference.speculative.rounds import DRAFTED, ServedSpeculation, accept

class ServingLoop:
    """Continuous batching over a paged KV cache of `kv_bytes` bytes (blocks of `block_size` tokens);
    `speculation` is the server's default speculative decoding (None: only requests that ask for it);
    `scheduling_policy` "fcfs" or "priority" (scheduler.py); `offload_bytes` of host memory and `offload_dir`
    keep full blocks evicted from the pool, and the directory those cached when the loop stops (offload.py);
    `read_blocks`: each decode row reads at least this many blocks, so that a generation of known length
    runs one shape of step (offline speculation)."""

    def __init__(self, engine: DecoderEngine, tokenizer: Any = None, *, kv_bytes: int, block_size: int = 16,
                 max_seqs: int = 32, max_step_tokens: int = 512, prefix_caching: bool = True,
                 name: str = "model", speculation: ServedSpeculation | None = None,
                 scheduling_policy: str = "fcfs", offload_bytes: int = 0, offload_dir: str | None = None,
                 read_blocks: int | None = None) -> None:
        self.engine, self.tokenizer, self.speculation = engine, tokenizer, speculation
        self.read_blocks = read_blocks  # blocks each row reads at least (one shape of decode step: fewer graphs)
        config = engine.config
        num_blocks, window_blocks = split_blocks(config, kv_bytes, block_size, engine.kv_dtype, max_seqs=max_seqs,
                                                 max_step_tokens=max_step_tokens)
        self.context = min(config.max_seq_len, num_blocks * block_size)  # the most tokens one sequence can hold
        self.cache = engine.lend_cache(num_blocks=num_blocks, block_size=block_size, window_blocks=window_blocks)
        self.cache.owner = weakref.ref(self)  # a later loop of this shape replays the steps recorded over it
        self.drafter = Drafter(speculation.draft, num_blocks=num_blocks, block_size=block_size, context=self.context,
                               vocab_size=config.vocab_size) if speculation and speculation.draft else None
        self.blocks = BlockManager(num_blocks, block_size)
        self.window = WindowBlocks(BlockManager(window_blocks, block_size), config.sliding_window) \
            if window_blocks is not None else None
        self.prompt_store = PromptLogprobStore(block_size)
        self.offload = self._offload(offload_bytes, offload_dir, block_size)
        self.scheduler = Scheduler(self.blocks, max_seqs=max_seqs, max_step_tokens=max_step_tokens,
                                   prefix_caching=prefix_caching, prompt_logprobs=self.prompt_store, window=self.window,
                                   policy=scheduling_policy, offload=self.offload)
        self.metrics = ServingMetrics(name)
        self.eos_ids = eos_ids(engine.config, tokenizer)
        self._inbox: queue.SimpleQueue[tuple[str, Sequence]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.steps = self.verifications = 0  # steps run; of them, steps that verified proposals

    def _offload(self, host_bytes: int, directory: str | None, block_size: int) -> KVOffload | None:
        """The offload store of evicted blocks (None: none asked), fed by the block manager's evictions."""
        if not host_bytes and directory is None:
            return None
        if self.window is not None or self.drafter is not None:
            raise InputError("keeping KV blocks beyond the pool (--kv-offload-bytes, --kv-offload-dir) is not "
                             "supported with a sliding-window cache or a draft model")
        offload = KVOffload(self.cache, identity(self.engine, block_size), host_bytes=host_bytes, directory=directory)
        self.blocks.on_evict = offload.save
        return offload

    def release(self) -> None:
        """Give the loop's caches (and its draft's) back to the engine: the loop runs no more steps."""
        for cache in (self.cache, self.drafter.cache if self.drafter is not None else None):
            if cache is not None:
                cache.owner = None

    def capture_decode(self) -> int:
        """Record the decode steps of every batch up to max_seqs now (before serving: engine.capture_decode);
        how many decode-step shapes the engine holds captured."""
        return self.engine.capture_decode(self.cache, range(1, self.scheduler.max_seqs + 1))

    # -- from any thread --------------------------------------------------------------------------

    def submit(self, prompt: list[int], params: SamplingParams, sink: Callable[[Event], Any], *,
               logprobs: int | None = None, prompt_logprobs: int | None = None, constraint: Any = None,
               bias: dict[int, float] | None = None, min_tokens: int = 0, generate: bool = True,
               speculative_tokens: int | None = None, speculative_min: int = 0,
               thinking: Thinking | None = None, priority: int = 0, adapter: Any = None,
               adapter_scale: float = 1.0) -> Sequence:
        """Queue a sequence; `sink` gets one Event per sampled token (from the loop's thread).
        `prompt_logprobs` (k) asks for each prompt token's logprob and top k (on the first event);
        `constraint` (a grammar.Constraint) and `bias` ({token id: logit bias}) shape every next token;
        `generate=False` runs the prompt only (one event, finish_reason "length").
        `speculative_tokens`: at most this many proposals per round (0: none; None: the server's
        default; a server without speculation verifies n-gram proposals for a request that asks),
        verified only when at least `speculative_min` are proposed. `thinking`: its thinking block is read
        (each event says whether its token was inside) and held to its budget (a sequence with a budget
        does not speculate). `priority`: lower runs first, under the "priority" policy only. `adapter`: the
        LoRA adapter it runs with (an AdapterRef of engine.lora; None: the base model), its update times
        `adapter_scale`."""
        if not prompt:
            raise InputError("the prompt is empty")
        if priority and self.scheduler.policy != "priority":
            raise InputError(f"priority {priority} needs the priority scheduling policy (this loop's is "
                             f"{self.scheduler.policy})")
        if len(prompt) + params.max_new_tokens * generate > self.context:
            raise InputError(f"the prompt has {len(prompt)} tokens and max_new_tokens={params.max_new_tokens}: "
                             f"{len(prompt) + params.max_new_tokens} tokens, more than the context of {self.context}")
        vocab = self.engine.config.vocab_size
        decoder = self.tokenizer.decode_stream(skip_special_tokens=True) if self.tokenizer is not None else None
        seq = Sequence(tokens=list(prompt), prompt_len=len(prompt), params=params, sink=sink, logprobs=logprobs,
                       text=TextRow(decoder, StopStringFilter(params.stop)),
                       stop_ids=frozenset(params.stop_ids) | (frozenset() if params.ignore_eos else self.eos_ids),
                       generator=make_generator(params.seed, self.engine.device),
                       bias=logit_bias(bias or {}, self.engine.device), constraint=constraint, min_tokens=min_tokens,
                       score_only=not generate, prompt_logprobs=prompt_logprobs,
                       prompt_entries=[None] * len(prompt) if prompt_logprobs is not None else [], priority=priority,
                       adapter=adapter, adapter_scale=adapter_scale)
        if adapter is not None:
            self.engine.lora.hold(adapter, seq)  # its slot stays its adapter's until it finishes
        seq.penalties = Penalties.of([list(prompt)], params, vocab=vocab, device=self.engine.device)
        if thinking is not None and self.tokenizer is not None:
            seq.thinking = ThinkingState(thinking, self.tokenizer.decode_stream(),
                                         lambda text: self.tokenizer.encode(text, add_special_tokens=False))
        speculation = self.speculation or (ServedSpeculation(num_speculative_tokens=speculative_tokens)
                                           if speculative_tokens else None)
        if speculation is not None and (thinking is None or thinking.budget is None):
            seq.speculation = speculation.for_sequence(prompt, params, speculative_tokens, speculative_min)
        self._inbox.put(("add", seq))
        self._wake.set()
        return seq

    def cancel(self, seq: Sequence) -> None:
        """Stop a sequence: its blocks are freed at the start of the next step."""
        self._inbox.put(("cancel", seq))
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="anatomy-serving-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        if self.offload is not None:  # what the pool caches outlives the process
            self.offload.flush(self.blocks.cached)

    def _run(self) -> None:
        while not self._stopping:
            try:
                busy = self.step()
            except ParallelError as exc:  # a rank of a parallel run is gone: nothing more can be computed
                self._fail_all(str(exc))
                return
            except Exception:  # a bug: every sequence in flight ends with an error, the loop keeps serving
                traceback.print_exc(file=sys.stderr)
                self._fail_all("internal error in the serving loop (see the server's log)")
                continue
            if not busy:
                self._wake.wait()
                self._wake.clear()

    # -- the loop's thread ------------------------------------------------------------------------

    def step(self) -> bool:
        """One iteration: False if there was nothing to do."""
        self._take_inbox()
        self._propose()
        scheduled = self.scheduler.schedule()
        if not scheduled:
            return False
        self.steps += 1
        drafted = [seq for seq, _ in scheduled if seq.draft and seq.draft[0] == DRAFTED]
        if drafted:
            self.drafter.fill(drafted)
            for seq in drafted:
                _within_grammar(seq)
            # a decoding sequence runs its last token and what is left of its draft
            scheduled = [(seq, 1 + len(seq.draft) if seq.remaining == 1 else n) for seq, n in scheduled]
        self._forward(scheduled)
        return True

    def _propose(self) -> None:
        """Each decoding sequence that speculates guesses its next tokens (within its max_new_tokens and
        the context)."""
        for seq in self.scheduler.running:
            seq.draft = []
            if seq.speculation is not None and seq.remaining == 1:
                room = min(seq.params.max_new_tokens - seq.generated, self.context - len(seq.tokens)) - 1
                seq.draft = seq.speculation.propose(room)
                if not seq.draft or seq.draft[0] != DRAFTED:
                    _within_grammar(seq)

    def _take_inbox(self) -> None:
        while True:
            try:
                what, seq = self._inbox.get_nowait()
            except queue.Empty:
                return
            if what == "add":
                self.scheduler.add(seq)
            elif not seq.finished:
                self.scheduler.finish(seq)
                self.metrics.finish("abort", None)

    @torch.inference_mode()
    def _forward(self, scheduled: list[tuple[Sequence, int]]) -> None:
        """One forward over every scheduled chunk, decode, verification and prefill rows together
        (engine.step) -> each sequence's rows of logits: a verifying row keeps what the target agrees
        with of its draft, a row that reaches its sequence's end samples a token."""
        chunks = [self._chunk(seq, n) for seq, n in scheduled]
        start = time.perf_counter()
        logits = self.engine.step(self.cache, chunks, blocks=self.read_blocks).split([c.logits for c in chunks])
        seconds = time.perf_counter() - start
        for (seq, _), chunk in zip(scheduled, chunks):  # a speculating sequence's policy learns the step's cost
            if seq.speculation is not None and seq.remaining == 1:
                seq.speculation.timed(len(chunk.tokens), seconds)
        rows = list(zip(scheduled, logits))
        self._advance([(seq, n, r) for (seq, n), r in rows if not seq.draft])
        self._verify([(seq, n, r) for (seq, n), r in rows if seq.draft])

    def _chunk(self, seq: Sequence, n: int) -> Chunk:
        """The chunk of seq's next n tokens (a verifying row: its last token and its draft). A chunk of a
        sequence that wants its prompt's logprobs asks for the logits of all its tokens."""
        if seq.draft:
            tokens, logits = seq.tokens[seq.computed:] + seq.draft, n
        else:
            tokens = seq.tokens[seq.computed:seq.computed + n]
            logits = n if wants_prompt_logits(seq, n) else int(seq.computed + n == len(seq.tokens))
        return Chunk(tokens, seq.computed, seq.blocks, logits=logits, window_blocks=self._window_table(seq),
                     adapter=seq.adapter_slot, adapter_scale=seq.adapter_scale)

    def _advance(self, group: list[tuple[Sequence, int, Tensor]]) -> None:
        """Sequences past n more tokens, with their chunks' logits [logits, V]; rows that reach their
        sequence's end sample a token."""
        if not group:
            return
        prompt_tokens, ends = 0, []
        for seq, n, logits in group:
            if len(logits) > 1 or (len(logits) and seq.prompt_logprobs is not None):
                record(seq, seq.computed + n - len(logits), logits)
            if seq.computed + n == len(seq.tokens):
                ends.append((seq, logits[-1]))
            prompt_tokens += max(0, min(seq.computed + n, seq.prompt_len) - seq.computed)
            self.scheduler.advance(seq, n)
            if seq.prompt_logprobs is not None:
                self.prompt_store.put(seq)
        self.metrics.step(prompt_tokens, len(ends))
        for seq, _ in [e for e in ends if e[0].score_only]:
            self._emit_prompt_only(seq)
        ends = [e for e in ends if not e[0].score_only]
        if ends:
            self._sample([seq for seq, _ in ends], torch.stack([row for _, row in ends]))

    def _verify(self, group: list[tuple[Sequence, int, Tensor]]) -> None:
        """Each verifying row's logits [1 + k, V] over its last token and draft -> the agreed tokens
        emitted one by one, the cache advanced past them (what lies beyond, the rejected guesses, is
        written over later)."""
        if not group:
            return
        self.verifications += 1
        self.metrics.step(0, len(group))
        for seq, n, rows in group:
            draft, seq.draft = seq.draft, []
            tokens, kept = accept(processed_draft(rows, seq, draft), draft, seq.params, seq.generator, seq.penalties,
                                  seq.speculation.probs)
            seq.speculation.kept(len(draft), kept)
            self.metrics.speculated(len(draft), kept)
            logprobs = self._logprobs(rows[:len(tokens)], tokens, seq.logprobs)
            for token, logprob in zip(tokens, logprobs):
                self._emit(seq, token, logprob)
                if seq.finished:
                    break
            else:
                self.scheduler.advance(seq, kept + 1)

    def _window_table(self, seq: Sequence) -> list[int] | None:
        return seq.window_blocks if self.window else None

    @property
    def held_bytes(self) -> int:
        """Bytes of the KV blocks the running sequences hold (every group)."""
        config, dtype, bs = self.engine.config, self.engine.kv_dtype, self.blocks.block_size
        if not self.window:
            return self.blocks.used * PagedKVCache.block_bytes(config, bs, dtype)
        return (self.blocks.used * PagedKVCache.block_bytes(config, bs, dtype, windowed=False)
                + self.window.manager.used * PagedKVCache.block_bytes(config, bs, dtype, windowed=True))

    @staticmethod
    def _logprobs(logits: Tensor, tokens: list[int], top: int | None) -> list[TokenLogprob | None]:
        """Each token's log-probability and the `top` likeliest of its row of logits [n, V] (None: none asked)."""
        if top is None:
            return [None] * len(tokens)
        chosen, values, ids = token_logprobs(logits, torch.tensor(tokens, device=logits.device), top)
        return [TokenLogprob(float(c), i.tolist(), v.tolist()) for c, i, v in zip(chosen, ids, values)]

    def _sample(self, seqs: list[Sequence], logits: Tensor) -> None:
        tokens = choose_tokens(processed(logits, seqs), seqs, self.engine.argmax)
        for i, (seq, token) in enumerate(zip(seqs, tokens)):
            self._emit(seq, token, self._logprobs(logits[i:i + 1], [token], seq.logprobs)[0])

    def _emit(self, seq: Sequence, token: int, logprob: TokenLogprob | None) -> None:
        """A sampled token joins the sequence; a thinking block whose budget is spent is closed instead
        (the block opened in the prompt with a budget of 0) or after it."""
        if not self._close_thinking(seq):
            self._append(seq, token, logprob)
            if not seq.finished:
                self._close_thinking(seq)

    def _close_thinking(self, seq: Sequence) -> bool:
        """Append the close of seq's thinking block if its budget is spent (whether it was); a grammar
        that does not allow the close ends the sequence ("length": the budget is what ended it)."""
        close = list(seq.thinking.due()) if seq.thinking is not None else []
        if not close:
            return False
        if seq.constraint is not None and seq.constraint.valid_prefix(close) < len(close):
            self._end(seq, "length")
            return True
        for token in close:
            self._append(seq, token, None, forced=True)
            if seq.finished:
                break
        return True

    def _append(self, seq: Sequence, token: int, logprob: TokenLogprob | None, *, forced: bool = False) -> None:
        """Add one token (a `forced` one was not sampled: no latency is recorded) and deliver its event."""
        now = time.perf_counter()
        first = seq.first_token_at is None
        if not forced:
            self.metrics.token(first=first, latency=now - (seq.arrival if first else seq.last_token_at))
        seq.first_token_at = seq.first_token_at or now
        seq.last_token_at = now
        seq.tokens.append(token)
        if seq.speculation is not None:
            seq.speculation.observe([token])
        if not seq.penalties.none:
            seq.penalties.observe(torch.tensor([[token]], device=self.engine.device))
        text = seq.text.add(token, seq.stop_ids)
        reason = seq.text.finish_reason
        if reason is None and seq.constraint is not None:
            seq.constraint.accept(token)
            if seq.constraint.finished:  # the grammar is complete: nothing but a stop could follow
                text += seq.text.finish("stop")
                reason = "stop"
        if reason is None and (seq.generated >= seq.params.max_new_tokens or len(seq.tokens) >= self.context):
            text += seq.text.finish("length")
            reason = "length"
        kept = token not in seq.stop_ids
        inside = seq.thinking.observe(token) if seq.thinking is not None else False
        _deliver(seq, Event(token, text, logprob if kept else None, reason,
                            prompt_logprobs=seq.prompt_entries if first and seq.prompt_logprobs is not None else None,
                            stop_string=seq.text.stops.matched if reason else None, reasoning=inside))
        if reason is not None:
            self.scheduler.finish(seq)
            self.metrics.finish(reason, now - seq.arrival)

    def _end(self, seq: Sequence, reason: str) -> None:
        """End a sequence between tokens: what its text held back, and `reason`."""
        _deliver(seq, Event(None, seq.text.finish(reason), finish_reason=reason))
        self.scheduler.finish(seq)
        self.metrics.finish(reason, time.perf_counter() - seq.arrival)

    def _emit_prompt_only(self, seq: Sequence) -> None:
        """A sequence that generates nothing (max_tokens 0) ends once its prompt has run."""
        _deliver(seq, Event(None, "", finish_reason="length",
                            prompt_logprobs=seq.prompt_entries if seq.prompt_logprobs is not None else None))
        self.scheduler.finish(seq)
        self.metrics.finish("length", time.perf_counter() - seq.arrival)

    def _fail_all(self, message: str) -> None:
        for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
            self.scheduler.finish(seq)
            self.metrics.finish("error", None)
            _deliver(seq, Event(None, "", finish_reason="error", error=message))


def split_blocks(config, kv_bytes: int, block_size: int, kv_dtype: str, *, max_seqs: int,
                 max_step_tokens: int) -> tuple[int, int | None]:
    """(blocks of the full layers' group, blocks of the sliding-window layers' group or None: one group)
    that `kv_bytes` holds. The window group gets what max_seqs sequences can hold at once (each its window and
    a step's tokens), where that is less than an even split; the full layers get the rest."""
    whole = PagedKVCache.block_bytes(config, block_size, kv_dtype)
    even = kv_bytes // whole
    if even < 2:
        raise InputError(f"a KV memory of {kv_bytes:,} bytes holds {even} blocks of {block_size} tokens "
                         f"({whole:,} bytes each); at least 2 are needed")
    if config.sliding_window is None or not config.is_decoder:
        return even, None
    per_seq = -(-(config.sliding_window + max_step_tokens) // block_size) + 1
    window_blocks = max_seqs * per_seq
    if window_blocks >= even:
        return even, None
    full = PagedKVCache.block_bytes(config, block_size, kv_dtype, windowed=False)
    rest = kv_bytes - window_blocks * PagedKVCache.block_bytes(config, block_size, kv_dtype, windowed=True)
    reach = max_seqs * -(-config.max_seq_len // block_size)  # every layer windowed: blocks only name positions
    return (rest // full if full else reach), window_blocks


def _within_grammar(seq: Sequence) -> None:
    """Only what a sequence's grammar allows of its draft is verified."""
    if seq.constraint is not None and seq.draft:
        seq.draft = seq.draft[:seq.constraint.valid_prefix(seq.draft)]


def _deliver(seq: Sequence, event: Event) -> None:
    try:
        seq.sink(event)
    except Exception:  # a listener's failure is its own: the loop and the other sequences go on
        traceback.print_exc(file=sys.stderr)


def choose_tokens(logits: Tensor, seqs: list[Sequence], argmax: Callable[[Tensor], Tensor] = greedy) -> list[int]:
    """The next token of each row of logits [R, V]: greedy rows without penalties in one `argmax` (the
    engine's: Backend.greedy_choice), the others each with their own parameters, penalty state and random generator."""
    plain = [i for i, s in enumerate(seqs) if s.params.greedy and s.penalties.none]
    tokens = [0] * len(seqs)
    if plain:
        rows = logits if len(plain) == len(seqs) else logits[torch.tensor(plain)]
        for i, token in zip(plain, argmax(rows.float()).tolist()):
            tokens[i] = token
    done = set(plain)
    for i, seq in enumerate(seqs):
        if i in done:
            continue
        tokens[i] = int(next_tokens(logits[i:i + 1], seq.params, seen=seq.penalties.seen,
                                    counts=seq.penalties.counts, generator=seq.generator)[0])
    return tokens
