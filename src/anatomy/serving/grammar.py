"""Constrained decoding: a grammar per sequence that says which tokens may come next (llguidance).

    constraint = grammars.compile(GrammarSpec("json", schema, param="response_format"))  # or regex, choice,
                                               # lark, gbnf; compiled grammars are cached, each sequence a copy
    constraint.fill(mask[i])                   # packed bitmask [ceil(V / 32)] int32 of the allowed next tokens
    constraint.accept(token)                   # after sampling; `finished` once nothing but a stop may follow
    constraint.rollback(n), constraint.valid_prefix(tokens)   # for speculative proposals

JSON is held to json.dumps' compact separators. Details: docs/serving.md, "Structured outputs".
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from anatomy.errors import InputError

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
CACHE_SIZE = 128  # compiled grammars kept (least recently used dropped)


class GrammarError(InputError):
    """A constraint the engine cannot compile: the message and the request field it came from."""

    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(message)
        self.message, self.param = message, param


@dataclass(frozen=True)
class GrammarSpec:
    """What the output must match: kind "json" (a JSON Schema; {"type": "object"} for any object),
    "regex", "choice" (one of a list of strings), "lark" or "gbnf" (a grammar); `param` names the
    request field it came from, for errors."""

    kind: Literal["json", "regex", "choice", "lark", "gbnf"]
    value: Any
    param: str

    def grammar(self) -> str:
        """The engine's serialized grammar (the cache key)."""
        import llguidance

        matcher = llguidance.LLMatcher
        if self.kind == "json":
            try:
                return matcher.grammar_from_json_schema(self.value, defaults=JSON_OPTIONS)
            except Exception as exc:  # the engine's own errors, whatever their class: the schema's fault
                raise GrammarError(f"{self.param}: not a JSON schema: {exc}", param=self.param) from None
        if self.kind == "regex":
            return matcher.grammar_from_regex(self.value)
        if self.kind == "choice":
            return matcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in self.value))
        if self.kind == "gbnf":
            from llguidance.gbnf_to_lark import gbnf_to_lark

            try:
                return matcher.grammar_from_lark(gbnf_to_lark(self.value))
            except Exception as exc:  # the converter's own parse errors
                raise GrammarError(f"{self.param}: not a GBNF grammar: {exc}", param=self.param) from None
        return matcher.grammar_from_lark(self.value)


class Constraint:
    """One sequence's position in its grammar (an llguidance matcher of its own)."""

    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher

    def fill(self, row: Tensor) -> None:
        """Write the bitmask of the tokens allowed next into `row` ([W] int32, contiguous, CPU)."""
        self.matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())
        if self.matcher.is_error():
            raise InputError(f"the grammar failed: {self.matcher.get_error()}")

    def accept(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            raise InputError(f"token {token} does not fit the grammar: {self.matcher.get_error()}")

    def rollback(self, n: int) -> None:
        """Forget the last n accepted tokens (a speculative proposal rejected after it was accepted)."""
        self.matcher.rollback(n)

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of `tokens` (a speculative proposal) the grammar allows in a row, nothing accepted."""
        return self.matcher.validate_tokens(tokens)

    @property
    def finished(self) -> bool:
        """The output is complete: nothing but a stop token may follow."""
        return self.matcher.is_stopped()


class GrammarEngine:
    """Compiles GrammarSpecs against one tokenizer; compiled grammars are kept (CACHE_SIZE, LRU) and
    each sequence gets a fresh copy, so a repeated schema is never compiled again. Thread-safe."""

    def __init__(self, tokenizer: Any, *, vocab_size: int, stop_ids: frozenset[int]) -> None:
        import llguidance

        self.llguidance = llguidance
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self.tokenizer = llguidance.LLTokenizer(tokenizer.backend.to_str(), n_vocab=vocab_size,
                                                eos_token=sorted(stop_ids) or None)
        self._compiled: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, spec: GrammarSpec) -> Constraint:
        """A fresh Constraint at the start of `spec`'s grammar; GrammarError if it does not compile."""
        grammar = spec.grammar()
        with self._lock:
            pristine = self._compiled.get(grammar)
            if pristine is not None:
                self._compiled.move_to_end(grammar)
                return Constraint(pristine.deep_copy())
        pristine = self.llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if pristine.is_error():
            raise GrammarError(f"{spec.param}: the grammar engine cannot compile it: {pristine.get_error()}",
                               param=spec.param)
        with self._lock:
            self._compiled[grammar] = pristine
            while len(self._compiled) > CACHE_SIZE:
                self._compiled.popitem(last=False)
        return Constraint(pristine.deep_copy())

    @property
    def cached(self) -> int:
        return len(self._compiled)


_BITS = torch.arange(32, dtype=torch.int32)


def apply_bitmask(logits: Tensor, mask: Tensor) -> Tensor:
    """logits [R, V] with -inf where the packed bitmask mask [R, W] int32 has a 0 bit (token t is bit
    t % 32 of word t // 32); tokens past 32 W are not allowed. In place; returns logits."""
    V = logits.shape[-1]
    allowed = ((mask.to(logits.device)[:, :, None] >> _BITS.to(logits.device)) & 1).flatten(1)  # [R, 32 W]
    if allowed.shape[1] < V:
        allowed = torch.nn.functional.pad(allowed, (0, V - allowed.shape[1]))
    return logits.masked_fill_(allowed[:, :V] == 0, float("-inf"))
