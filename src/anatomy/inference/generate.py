"""`anatomy.generate` and `anatomy.stream`: text (or chat messages, or token ids) in, text out.

    prompt -> token ids (chat template for message lists) -> fit to the context
           -> DecoderEngine (prefill + decode) or seq2seq search -> token ids
           -> incremental detokenizer -> stop strings held back -> text deltas / result

A prompt is a string (encoded as is), a list of chat messages ({"role", "content"} dicts, rendered
by the model's chat template) or a list of token ids; a list of such prompts is a batch and gives
a list of results, one per prompt, identical to generating each alone (greedy).
"""

from __future__ import annotations

import functools
import warnings
import weakref
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from anatomy.errors import CheckpointError, InputError
from anatomy.inference.engine import DecoderEngine
from anatomy.inference.metrics import StepClock
from anatomy.inference.sampling import SamplingParams
from anatomy.inference.streaming import StopStringFilter


@dataclass
class GenerationResult:
    """One prompt's continuation. `token_ids` are the new tokens (an ending EOS/stop id excluded);
    finish_reason is "stop" (EOS, a stop id or a stop string) or "length" (max_new_tokens)."""

    text: str
    token_ids: list[int]
    prompt_tokens: int
    finish_reason: str
    ttft_s: float = 0.0
    tpot_s: float = 0.0
    tokens_per_s: float = 0.0


def generate(model: nn.Module | str | Path, prompt: Any, *, tokenizer: Any = None, compile: bool = False,
             truncate: bool = False, num_beams: int = 1, length_penalty: float = 1.0,
             **sampling: Any) -> GenerationResult | list[GenerationResult]:
    """Generate a continuation of `prompt` (or of each prompt of a batch).

    `model` is a model or a name / .gguf path / HF directory (loaded once and kept). Sampling
    options are the fields of SamplingParams (max_new_tokens, temperature, top_k, top_p, min_p,
    repetition_penalty, seed, stop, stop_ids, ignore_eos). `truncate` keeps the end of a prompt
    that does not fit the context. `num_beams`/`length_penalty` apply to encoder-decoder models.
    """
    run = Generation.start(model, prompt, tokenizer=tokenizer, compile=compile, truncate=truncate, sampling=sampling)
    if run.model.config.is_seq2seq:
        return run.seq2seq(num_beams=num_beams, length_penalty=length_penalty)
    for _ in run.deltas():
        pass
    results = run.results()
    return results if run.batched else results[0]


def stream(model: nn.Module | str | Path, prompt: Any, *, tokenizer: Any = None, compile: bool = False,
           truncate: bool = False, **sampling: Any) -> Iterator[str]:
    """Yield the text of one prompt's continuation piece by piece, as it is generated. The pieces
    join to `generate(...).text`: no broken characters, no part of a stop string."""
    run = Generation.start(model, prompt, tokenizer=tokenizer, compile=compile, truncate=truncate, sampling=sampling)
    if run.batched or run.model.config.is_seq2seq:
        raise InputError("stream takes one prompt for a decoder model; use generate for batches and seq2seq")
    for _, delta in run.deltas():
        yield delta


# -- one generation -----------------------------------------------------------------------------

@dataclass
class _Row:
    """One prompt's state: its new ids, its detokenizer, its stop-string filter."""

    decoder: Any
    stops: StopStringFilter
    ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None

    def add(self, token: int, stop_ids: frozenset[int]) -> str:
        if token in stop_ids:
            return self.finish("stop")
        self.ids.append(token)
        delta = self.stops.push(self.decoder.push(token)) if self.decoder is not None else ""
        if self.stops.stopped:
            self.finish_reason = "stop"
        return delta

    def finish(self, reason: str) -> str:
        self.finish_reason = reason
        if self.decoder is None:
            return ""
        return self.stops.push(self.decoder.flush()) + self.stops.flush()


@dataclass
class Generation:
    """One call's prompts, options and progress: `deltas()` streams, `results()` sums up."""

    model: nn.Module
    tokenizer: Any
    prompts: list[list[int]]
    params: SamplingParams
    batched: bool
    compile: bool
    rows: list[_Row] = field(default_factory=list)
    clock: StepClock = field(default_factory=StepClock)

    @classmethod
    def start(cls, model: Any, prompt: Any, *, tokenizer: Any, compile: bool, truncate: bool,
              sampling: dict[str, Any]) -> Generation:
        model, tokenizer = resolve_model(model, tokenizer)
        params = _params(sampling)
        batched, prompts = split_batch(prompt)
        ids = [encode_prompt(p, tokenizer) for p in prompts]
        ids, params = fit_context(ids, params, context=model.config.max_seq_len, truncate=truncate)
        return cls(model, tokenizer, ids, params, batched, compile)

    def stop_ids(self) -> frozenset[int]:
        eos = set() if self.params.ignore_eos else set(eos_ids(self.model, self.tokenizer))
        return frozenset(eos | set(self.params.stop_ids))

    def deltas(self) -> Iterator[tuple[int, str]]:
        """(row, text delta) pairs as the tokens arrive; rows stop on EOS, stop ids, stop strings."""
        stop_ids = self.stop_ids()
        self.rows = [_Row(self._decoder(), StopStringFilter(self.params.stop)) for _ in self.prompts]
        self.clock = StepClock(batch=len(self.prompts))
        self.clock.start()
        for tokens in engine_for(self.model, compile=self.compile).tokens(self.prompts, self.params):
            self.clock.tick()
            for i, (row, token) in enumerate(zip(self.rows, tokens.tolist())):
                if row.finish_reason is None and (delta := row.add(token, stop_ids)):
                    yield i, delta
            if all(row.finish_reason is not None for row in self.rows):
                return
        for i, row in enumerate(self.rows):
            if row.finish_reason is None and (delta := row.finish("length")):
                yield i, delta

    def results(self) -> list[GenerationResult]:
        clock = self.clock
        return [GenerationResult(text=row.stops.text, token_ids=row.ids, prompt_tokens=len(prompt),
                                 finish_reason=row.finish_reason or "length", ttft_s=clock.ttft_s,
                                 tpot_s=clock.tpot_s, tokens_per_s=clock.tokens_per_s)
                for row, prompt in zip(self.rows, self.prompts)]

    def seq2seq(self, *, num_beams: int, length_penalty: float) -> GenerationResult | list[GenerationResult]:
        from anatomy.inference.beam import seq2seq_generate

        results = seq2seq_generate(self.model, self.prompts, self.params, eos_ids=self.stop_ids(),
                                   num_beams=num_beams, length_penalty=length_penalty,
                                   decode=self._text)
        return results if self.batched else results[0]

    def _decoder(self):
        return self.tokenizer.decode_stream(skip_special_tokens=True) if self.tokenizer is not None else None

    def _text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True) if self.tokenizer is not None else ""


# -- the pieces ---------------------------------------------------------------------------------

def _params(sampling: dict[str, Any]) -> SamplingParams:
    try:
        return SamplingParams(**sampling)
    except TypeError as exc:
        raise InputError(f"unknown generation option: {exc}") from None


def split_batch(prompt: Any) -> tuple[bool, list[Any]]:
    """(batched, prompts): a string, a message list or an id list is one prompt; a list of them a batch."""
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], (int, dict))):
        return False, [prompt]
    if isinstance(prompt, torch.Tensor):
        return (True, prompt.tolist()) if prompt.dim() == 2 else (False, [prompt.tolist()])
    if isinstance(prompt, (list, tuple)) and prompt:
        return True, list(prompt)
    raise InputError(f"the prompt is empty or not text, chat messages or token ids: {prompt!r:.80}")


def encode_prompt(prompt: Any, tokenizer: Any) -> list[int]:
    """Token ids of one prompt; a message list goes through the chat template (its special tokens
    are in the rendered text, so none are added around it)."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise InputError("the prompt is empty")
        return _tokenizer(tokenizer).encode(prompt)
    if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, dict) for m in prompt):
        text = _tokenizer(tokenizer).apply_chat_template(list(prompt), add_generation_prompt=True)
        return _tokenizer(tokenizer).encode(text, add_special_tokens=False)
    if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                              for t in prompt):
        return list(prompt)
    raise InputError(f"a prompt must be non-empty text, chat messages or token ids, got {prompt!r:.80}")


def _tokenizer(tokenizer: Any) -> Any:
    if tokenizer is None:
        raise InputError("a text prompt needs a tokenizer: pass tokenizer=, a model name, or token ids")
    return tokenizer


def fit_context(prompts: list[list[int]], params: SamplingParams, *, context: int,
                truncate: bool = False) -> tuple[list[list[int]], SamplingParams]:
    """Prompt + new tokens must fit the model's context (max_seq_len): a too-long prompt is an
    error (or, with truncate, keeps its last tokens); max_new_tokens is clamped with a warning."""
    longest = max(len(p) for p in prompts)
    if longest >= context:
        if not truncate:
            raise InputError(f"the prompt has {longest} tokens, the model's context holds {context} "
                             f"(max_seq_len), with room for at least one new token; truncate=True (--truncate) keeps its end")
        prompts = [p[-(context - 1):] for p in prompts]
        longest = context - 1
    room = context - longest
    if params.max_new_tokens > room:
        warnings.warn(f"max_new_tokens={params.max_new_tokens} would overflow the context of {context} tokens "
                      f"after a {longest}-token prompt; clamped to {room}", stacklevel=4)
        params = replace(params, max_new_tokens=room)
    return prompts, params


def eos_ids(model: nn.Module, tokenizer: Any) -> frozenset[int]:
    """The tokenizer's end ids (EOS and the chat template's turn end), else the config's EOS."""
    if tokenizer is not None and tokenizer.eos_ids:
        return frozenset(tokenizer.eos_ids)
    eos = model.config.eos_token_id
    return frozenset() if eos is None else frozenset({eos})


def resolve_model(model: Any, tokenizer: Any) -> tuple[nn.Module, Any]:
    """A model object as is; a name or path loaded (once) with its tokenizer."""
    if isinstance(model, (str, Path)):
        loaded, own_tokenizer = load_named(str(model))
        return loaded, tokenizer if tokenizer is not None else own_tokenizer
    if not isinstance(model, nn.Module) or not hasattr(model, "config"):
        raise InputError(f"model must be an anatomy model or a model name/path, got {type(model).__name__}")
    if not (model.config.is_decoder or model.config.is_seq2seq):
        raise InputError(f"generation needs a decoder or encoder-decoder model, got architecture="
                         f"{model.config.architecture!r}")
    return model, tokenizer


@functools.lru_cache(maxsize=2)
def load_named(name: str, dtype: torch.dtype = torch.float32) -> tuple[nn.Module, Any]:
    """The model and tokenizer of a name / .gguf path / HF directory, loaded once per process."""
    import anatomy
    from anatomy.checkpoints.registry import resolve

    try:
        resolve(name)
    except CheckpointError as exc:  # an unknown name or a missing package: bad input, not a bad file
        raise InputError(str(exc)) from None
    model = anatomy.load(name, dtype=dtype).eval()
    return model, anatomy.load_tokenizer(name)


_ENGINES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def engine_for(model: nn.Module, *, compile: bool = False) -> DecoderEngine:
    """The model's engine (kept with the model, so a compiled step is compiled once)."""
    engines = _ENGINES.setdefault(model, {})
    if compile not in engines:
        engines[compile] = DecoderEngine(model, compile=compile)
    return engines[compile]


__all__ = ["generate", "stream", "GenerationResult", "SamplingParams"]
