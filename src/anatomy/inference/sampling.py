"""Choosing the next token from the logits: greedy, or sampling after the usual filters.

    logits [B, V] -> repetition penalty -> presence/frequency penalties -> / temperature
                  -> top-k -> top-p -> min-p -> softmax -> draw

Each filter sets the logits of the tokens it removes to -inf, so they compose in any order and
the survivors keep their relative probabilities. temperature == 0 means greedy (argmax).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from anatomy.errors import InputError


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How to choose tokens and when to stop. Validated on construction (InputError names the rule)."""

    max_new_tokens: int = 256
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    min_p: float = 0.0  # 0: off
    repetition_penalty: float = 1.0  # 1: off; > 1 discourages tokens already in the prompt or output
    presence_penalty: float = 0.0  # 0: off; OpenAI's: subtracted once from every token already generated
    frequency_penalty: float = 0.0  # 0: off; OpenAI's: subtracted once per time a token was generated
    seed: int | None = None
    stop: tuple[str, ...] = ()  # stop strings: the text ends before the first one (never included)
    stop_ids: tuple[int, ...] = ()  # extra stop token ids, on top of the tokenizer's EOS ids
    ignore_eos: bool = False  # keep going to max_new_tokens (benchmarks)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", _as_tuple(self.stop, "stop"))
        object.__setattr__(self, "stop_ids", tuple(int(i) for i in _as_tuple(self.stop_ids, "stop_ids")))
        _validate(self)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _as_tuple(value, name: str) -> tuple:
    if isinstance(value, (str, int)):
        value = (value,)
    if not isinstance(value, (list, tuple)) and name == "stop":
        raise InputError(f"stop strings must be a list of non-empty strings, got {value!r}")
    if not isinstance(value, (list, tuple)):
        raise InputError(f"stop_ids={value!r} must be a list of token ids")
    if name == "stop" and any(not isinstance(s, str) or not s for s in value):
        raise InputError(f"stop strings must be non-empty strings, got {list(value)!r}")
    if name == "stop_ids" and any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in value):
        raise InputError(f"stop_ids={list(value)!r} must be token ids (integers >= 0)")
    return tuple(value)


def _validate(p: SamplingParams) -> None:
    for name in ("max_new_tokens", "top_k"):
        if isinstance(getattr(p, name), bool) or not isinstance(getattr(p, name), int):
            raise InputError(f"{name}={getattr(p, name)!r} must be an integer")
    for name in ("temperature", "top_p", "min_p", "repetition_penalty"):
        value = getattr(p, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise InputError(f"{name}={value!r} must be a number")
    if p.max_new_tokens < 1:
        raise InputError(f"max_new_tokens={p.max_new_tokens!r} must be an integer >= 1")
    if not math.isfinite(p.temperature) or p.temperature < 0:
        raise InputError(f"temperature={p.temperature!r} must be >= 0 (0 means greedy)")
    if p.top_k < 0:
        raise InputError(f"top_k={p.top_k!r} must be an integer >= 0 (0 turns it off)")
    if not 0.0 < p.top_p <= 1.0:
        raise InputError(f"top_p={p.top_p!r} must be in (0, 1] (1 turns it off)")
    if not 0.0 <= p.min_p <= 1.0:
        raise InputError(f"min_p={p.min_p!r} must be in [0, 1] (0 turns it off)")
    if not math.isfinite(p.repetition_penalty) or p.repetition_penalty <= 0:
        raise InputError(f"repetition_penalty={p.repetition_penalty!r} must be > 0 (1 turns it off)")
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(p, name)
        if not -2.0 <= value <= 2.0:
            raise InputError(f"{name}={value!r} must be in [-2, 2] (0 turns it off)")
    if p.seed is not None and (isinstance(p.seed, bool) or not isinstance(p.seed, int)
                               or not -2 ** 63 <= p.seed < 2 ** 64):
        raise InputError(f"seed={p.seed!r} must be an integer in [-2**63, 2**64) (torch's generator seeds)")


def apply_repetition_penalty(logits: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """logits [B, V]; seen bool [B, V] marks tokens already in the prompt or the output.

    A seen token's logit is divided by the penalty when positive, multiplied when negative
    (CTRL, Keskar et al. 2019), so a penalty > 1 always makes it less likely.
    """
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def apply_presence_frequency(logits: Tensor, counts: Tensor, presence: float, frequency: float) -> Tensor:
    """logits [B, V]; counts [B, V]: how often each token was generated so far (the prompt does not
    count, as in OpenAI's definition): logit - frequency * count - presence * (count > 0)."""
    counts = counts.to(logits.dtype)
    return logits - frequency * counts - presence * (counts > 0).to(logits.dtype)


def token_logprobs(logits: Tensor, tokens: Tensor, top: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """Log-probabilities of the model's distribution (the logits before any penalty or filter):
    (of the chosen tokens [B], the `top` most likely [B, top], their ids [B, top])."""
    logp = logits.float().log_softmax(dim=-1)  # [B, V]
    chosen = logp.gather(1, tokens[:, None])[:, 0]  # [B]
    values, ids = logp.topk(top, dim=-1) if top > 0 else (logp[:, :0], tokens[:, None][:, :0])
    return chosen, values, ids


def filter_top_k(logits: Tensor, k: int) -> Tensor:
    """Keep the k largest logits of each row (ties at the k-th value are all kept)."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = logits.topk(k, dim=-1).values[..., -1:]  # [B, 1]
    return logits.masked_fill(logits < kth, float("-inf"))


def filter_top_p(logits: Tensor, p: float) -> Tensor:
    """Nucleus: keep the most likely tokens until their probability mass first reaches p."""
    if p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # mass of the strictly more likely tokens
    drop_sorted = mass_before >= p  # the first token always stays (its mass_before is 0)
    drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
    return logits.masked_fill(drop, float("-inf"))


def filter_min_p(logits: Tensor, p: float) -> Tensor:
    """Keep tokens whose probability is at least p times the most likely token's."""
    if p <= 0.0:
        return logits
    probs = logits.softmax(dim=-1)
    threshold = p * probs.max(dim=-1, keepdim=True).values  # [B, 1]
    return logits.masked_fill(probs < threshold, float("-inf"))


def greedy(logits: Tensor) -> Tensor:
    """The index of each row's largest logit [...] (the first of equal ones, as argmax): torch.max's
    indices (an engine may choose faster: Backend.greedy_choice)."""
    return logits.max(dim=-1).indices


@dataclass
class Penalties:
    """What the penalties keep per row: `seen` bool [B, V], the prompt's and output's tokens (repetition),
    `counts` [B, V], the output's (presence and frequency); None where the params set no such penalty.
    A generation's run and a served sequence (one row) keep theirs in one."""

    seen: Tensor | None = None
    counts: Tensor | None = None

    @classmethod
    def of(cls, prompts: list[list[int]], params: SamplingParams, *, vocab: int,
           device: torch.device | str = "cpu") -> Penalties:
        seen = counts = None
        if params.repetition_penalty != 1.0:
            seen = torch.zeros(len(prompts), vocab, dtype=torch.bool, device=device)
            for row, prompt in enumerate(prompts):
                seen[row, torch.tensor(prompt, dtype=torch.long, device=device)] = True
        if params.presence_penalty or params.frequency_penalty:
            counts = torch.zeros(len(prompts), vocab, dtype=torch.long, device=device)
        return cls(seen, counts)

    @property
    def none(self) -> bool:
        return self.seen is None and self.counts is None

    def observe(self, tokens: Tensor) -> None:
        """tokens [B, n] were emitted: the repetition penalty has seen them, the others count them."""
        if self.seen is not None:
            self.seen.scatter_(1, tokens, True)
        if self.counts is not None:
            self.counts.scatter_add_(1, tokens, torch.ones_like(tokens))


def next_tokens(logits: Tensor, params: SamplingParams, *, seen: Tensor | None = None, counts: Tensor | None = None,
                generator: torch.Generator | None = None, argmax: Callable[[Tensor], Tensor] = greedy) -> Tensor:
    """logits [B, V] (any float dtype) -> next token ids [B]. `seen` bool [B, V] (prompt and output
    tokens) feeds the repetition penalty, `counts` [B, V] (output tokens) the presence and frequency
    penalties; `argmax` makes the greedy choice (an engine's backend's)."""
    logits = penalized(logits, params, seen, counts)
    if params.greedy:
        return argmax(logits)
    return torch.multinomial(sampling_probs(logits, params), 1, generator=generator)[:, 0]


def penalized(logits: Tensor, params: SamplingParams, seen: Tensor | None = None,
              counts: Tensor | None = None) -> Tensor:
    """logits [..., V] in float32 after the penalties that are set: repetition (seen bool [..., V]),
    presence and frequency (counts [..., V] of the output tokens)."""
    logits = logits.float()
    if params.repetition_penalty != 1.0 and seen is not None:
        logits = apply_repetition_penalty(logits, seen, params.repetition_penalty)
    if (params.presence_penalty or params.frequency_penalty) and counts is not None:
        logits = apply_presence_frequency(logits, counts, params.presence_penalty, params.frequency_penalty)
    return logits


def sampling_probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """The distribution a sampled token is drawn from: penalized float32 logits [..., V] / temperature,
    top-k, top-p, min-p, softmax -> probabilities [..., V] (not for greedy: temperature 0)."""
    logits = logits / params.temperature
    logits = filter_min_p(filter_top_p(filter_top_k(logits, params.top_k), params.top_p), params.min_p)
    return logits.softmax(dim=-1)


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator | None:
    """A private random stream for a seed (the global RNG is left alone), or None (unseeded)."""
    if seed is None:
        return None
    return torch.Generator(device=device).manual_seed(int(seed))
