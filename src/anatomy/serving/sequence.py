"""One generated sequence as the scheduler and the serving loop see it, and what it reports.

    tokens     prompt + generated ids; the KV cache holds the first `computed` of them
    a step     runs tokens[computed : computed + n] (a prefill chunk, or n = 1 when decoding);
               once computed == len(tokens), the step's logits give the next token, appended
               (after the sequence's logit bias and grammar mask; anatomy.serving.processors)
    preempted  blocks freed, computed = 0: later the whole of `tokens` (prompt and what was
               generated) is computed again (recompute), and decoding goes on where it stopped
"""

from __future__ import annotations

import enum
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from anatomy.inference.sampling import Penalties, SamplingParams
from anatomy.text.stops import TextRow


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(frozen=True)
class TokenLogprob:
    """The chosen token's log-probability and the `top` most likely tokens' (ids and values)."""

    logprob: float
    top_ids: list[int]
    top_logprobs: list[float]


@dataclass(frozen=True)
class Event:
    """What a sequence reports after each of its steps that sampled a token: the token, the text it
    completes (stop strings held back), its log-probabilities if asked for (None for a token that
    is not part of the text, such as the EOS), and, on its last event, why it ended ("stop",
    "length", or "error" with a message) and the stop string that ended it, if one did."""

    token: int | None
    text: str
    logprob: TokenLogprob | None = None
    finish_reason: str | None = None
    error: str | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None  # on the first event, when asked: per prompt token
    stop_string: str | None = None
    reasoning: bool = False  # the token was generated inside a thinking block (serving/thinking.py)


@dataclass(eq=False)
class Sequence:
    """A sequence in the serving loop. Scheduler fields first, then the output side."""

    tokens: list[int]
    prompt_len: int
    params: SamplingParams
    text: TextRow
    sink: Callable[[Event], Any]
    logprobs: int | None = None  # None: none asked; k: the chosen token's and the k most likely
    stop_ids: frozenset[int] = frozenset()  # token ids that end it (EOS unless ignored, and params.stop_ids)
    arrival: float = field(default_factory=time.perf_counter)
    priority: int = 0  # the priority policy runs lower values first (vLLM's request priority)
    status: Status = Status.WAITING
    computed: int = 0
    blocks: list[int] = field(default_factory=list)
    window_blocks: list[int] = field(default_factory=list)  # the sliding-window layers' (window_blocks.py)
    window_start: int = 0  # window_blocks before it are given back (-1)
    hashes: list[bytes] = field(default_factory=list)  # prefix-cache keys of its full blocks so far
    registered: int = 0  # full blocks entered into the prefix cache
    preemptions: int = 0
    generator: torch.Generator | None = None
    penalties: Penalties = field(default_factory=Penalties)  # what the penalties keep, one row [1, V]
    first_token_at: float | None = None
    last_token_at: float | None = None
    # what the output must obey and the prompt side (anatomy.serving.processors, prompt_logprobs)
    bias: tuple[torch.Tensor, torch.Tensor] | None = None  # logit_bias: token ids [K], values [K]
    constraint: Any = None  # a grammar.Constraint: the tokens allowed next
    min_tokens: int = 0  # stop ids are not allowed before this many tokens
    score_only: bool = False  # max_tokens 0: the prompt is run (for its logprobs), nothing generated
    prompt_logprobs: int | None = None  # None: not asked; k: each prompt token's logprob and the top k
    prompt_entries: list[TokenLogprob | None] = field(default_factory=list)  # per prompt position
    speculation: Any = None  # its SequenceSpeculation (inference/speculative/rounds.py), None: it does not speculate
    draft: list[int] = field(default_factory=list)  # the tokens it proposes to verify in the next step
    thinking: Any = None  # its ThinkingState (serving/thinking.py), None: its thinking block is not read
    adapter: Any = None  # the LoRA adapter it runs with (an AdapterRef, anatomy/lora/slots.py), None: the base
    adapter_scale: float = 1.0  # its update times this (llama-server's per-request scale)

    @property
    def remaining(self) -> int:
        """Tokens still to run before the next token can be sampled."""
        return len(self.tokens) - self.computed

    @property
    def adapter_slot(self) -> int:
        """The slot of its adapter in the engine (0: none)."""
        return self.adapter.slot if self.adapter is not None else 0

    @property
    def cache_salt(self) -> bytes:
        """What its prefix-cache keys start from: blocks computed with an adapter are that adapter's only."""
        if self.adapter is None:
            return b""
        return self.adapter.salt + (struct.pack("<d", self.adapter_scale) if self.adapter_scale != 1.0 else b"")

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED
