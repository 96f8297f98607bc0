"""`anatomy.generate` and `anatomy.stream`: text (or chat messages, or token ids) in, text out.

    prompt -> token ids (chat template for message lists) -> fit to the context
           -> DecoderEngine (prefill + decode) or seq2seq search -> token ids
           -> incremental detokenizer -> stop strings held back -> text deltas / result

A prompt is a string (encoded as is), a list of chat messages ({"role", "content"} dicts, rendered
by the model's chat template) or a list of token ids; a list of such prompts is a batch and gives
a list of results, one per prompt, identical to generating each alone (greedy).

The model is a model object (left as it was: it runs on the engine kept for it, anatomy.engine_for,
so a second call pays no set-up), an engine, or a name / .gguf path / HF directory, loaded once into
`anatomy.loaded_models` with its tokenizer (inference/loading.py).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from anatomy.errors import InputError
from anatomy.inference.engine import DecoderEngine, Seq2SeqEngine
from anatomy.inference.loading import resolve_model
from anatomy.inference.metrics import StepClock
from anatomy.inference.result import GenerationResult
from anatomy.inference.sampling import SamplingParams
from anatomy.inference.speculative import Speculation, SpeculativeDecoder
from anatomy.inference.speculative.setup import speculation_of
from anatomy.text.stops import StopStringFilter, TextRow, eos_ids


def generate(model: nn.Module | DecoderEngine | Seq2SeqEngine | str | Path, prompt: Any, *, tokenizer: Any = None,
             compile: bool = False, kv_dtype: str | None = None, truncate: bool = False, num_beams: int = 1,
             length_penalty: float = 1.0, speculative: Any = None, draft_model: Any = None,
             num_speculative_tokens: int | None = None, **sampling: Any) -> GenerationResult | list[GenerationResult]:
    """Generate a continuation of `prompt` (or of each prompt of a batch).

    `model` is a model, a DecoderEngine, or a name / .gguf path / HF directory. Sampling
    options are the fields of SamplingParams (max_new_tokens, temperature, top_k, top_p, min_p,
    repetition_penalty, seed, stop, stop_ids, ignore_eos). `truncate` keeps the end of a prompt
    that does not fit the context. `num_beams`/`length_penalty` apply to encoder-decoder models.
    `kv_dtype` is what the KV cache holds: None (the branches' dtype), f32, f16, bf16, or 8-bit
    int8 / fp8_e4m3 / fp8_e5m2 with a scale per token and head (anatomy/kv_format.py).
    `speculative` ("ngram" or "draft", with `draft_model` a model, engine or name) verifies up to
    `num_speculative_tokens` proposed tokens per target forward (inference/speculative/): the same
    greedy output, the same sampling distribution; the results' `speculative` field has the counts.
    """
    run = Generation.start(model, prompt, tokenizer=tokenizer, engine=dict(compile=compile, kv_dtype=kv_dtype),
                           truncate=truncate, sampling=sampling,
                           speculative=dict(speculative=speculative, draft_model=draft_model,
                                            num_speculative_tokens=num_speculative_tokens))
    if run.model.config.is_seq2seq:
        return run.seq2seq(num_beams=num_beams, length_penalty=length_penalty)
    for _ in run.deltas():
        pass
    results = run.results()
    return results if run.batched else results[0]


def stream(model: nn.Module | DecoderEngine | str | Path, prompt: Any, *, tokenizer: Any = None, compile: bool = False,
           kv_dtype: str | None = None, truncate: bool = False, speculative: Any = None, draft_model: Any = None,
           num_speculative_tokens: int | None = None, **sampling: Any) -> Iterator[str]:
    """Yield the text of one prompt's continuation piece by piece, as it is generated. The pieces
    join to `generate(...).text`: no broken characters, no part of a stop string."""
    run = Generation.start(model, prompt, tokenizer=tokenizer, engine=dict(compile=compile, kv_dtype=kv_dtype),
                           truncate=truncate, sampling=sampling,
                           speculative=dict(speculative=speculative, draft_model=draft_model,
                                            num_speculative_tokens=num_speculative_tokens))
    if run.batched or run.model.config.is_seq2seq:
        raise InputError("stream takes one prompt for a decoder model; use generate for batches and seq2seq")
    for _, delta in run.deltas():
        yield delta


# -- one generation -----------------------------------------------------------------------------

@dataclass
class Generation:
    """One call's prompts, options and progress: `deltas()` streams, `results()` sums up."""

    model: nn.Module
    tokenizer: Any
    engine: DecoderEngine | Seq2SeqEngine
    prompts: list[list[int]]
    params: SamplingParams
    batched: bool
    rows: list[TextRow] = field(default_factory=list)
    clock: StepClock = field(default_factory=StepClock)
    speculation: Speculation | None = None
    speculator: SpeculativeDecoder | None = None  # the latest deltas() call's, with its stats

    @classmethod
    def start(cls, model: Any, prompt: Any, *, tokenizer: Any, truncate: bool, sampling: dict[str, Any],
              engine: dict[str, Any] | None = None, speculative: dict[str, Any] | None = None) -> Generation:
        """`engine`: the engine options (compile, kv_dtype) a model or a name runs with."""
        params = _params(sampling)
        model, tokenizer, engine = resolve_model(model, tokenizer, **(engine or {}))
        speculation = speculation_of(**(speculative or {}), tokenizer=tokenizer)
        batched, prompts = split_batch(prompt)
        ids = [encode_prompt(p, tokenizer) for p in prompts]
        ids, params = fit_context(ids, params, context=model.config.max_seq_len, truncate=truncate)
        if speculation is not None:
            speculation.check(model.config, prompt_len=max(map(len, ids)), max_new_tokens=params.max_new_tokens)
        return cls(model, tokenizer, engine, ids, params, batched, speculation=speculation)

    def stop_ids(self) -> frozenset[int]:
        eos = set() if self.params.ignore_eos else set(eos_ids(self.model.config, self.tokenizer))
        return frozenset(eos | set(self.params.stop_ids))

    def deltas(self) -> Iterator[tuple[int, str]]:
        """(row, text delta) pairs as the tokens arrive; rows stop on EOS, stop ids, stop strings."""
        stop_ids = self.stop_ids()
        self.rows = [TextRow(self._decoder(), StopStringFilter(self.params.stop)) for _ in self.prompts]
        self.clock = StepClock(batch=len(self.prompts))
        self.clock.start()
        ticks = self.clock.ticks
        for tokens in self._steps():
            ticks.append(time.perf_counter())  # when this step's tokens were ready
            for i, (row, token) in enumerate(zip(self.rows, tokens.tolist())):
                if row.finish_reason is None and (delta := row.add(token, stop_ids)):
                    yield i, delta
            if all(row.finish_reason is not None for row in self.rows):
                return
        for i, row in enumerate(self.rows):
            if row.finish_reason is None and (delta := row.finish("length")):
                yield i, delta

    def _steps(self) -> Iterator[torch.Tensor]:
        """The engine's tokens [B] step by step, or a speculative decoder's, one token at a time."""
        if self.speculation is None:
            return self.engine.tokens(self.prompts, self.params)
        self.speculator = self.speculation.decoder(self.engine)
        return self.speculator.tokens(self.prompts, self.params)

    def results(self) -> list[GenerationResult]:
        clock = self.clock
        stats = self.speculator.stats if self.speculator is not None else None
        return [GenerationResult(text=row.stops.text, token_ids=row.ids, prompt_tokens=len(prompt),
                                 finish_reason=row.finish_reason or "length", ttft_s=clock.ttft_s,
                                 tpot_s=clock.tpot_s, tokens_per_s=clock.tokens_per_s, speculative=stats)
                for row, prompt in zip(self.rows, self.prompts)]

    def seq2seq(self, *, num_beams: int, length_penalty: float) -> GenerationResult | list[GenerationResult]:
        from anatomy.inference.beam import seq2seq_generate

        results = seq2seq_generate(self.engine, self.prompts, self.params, eos_ids=self.stop_ids(),
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


_MOVED = {"NamedModel": "LoadedModel", "load_named": "load_named"}  # resolve_model is imported here still


def __getattr__(name: str) -> Any:
    """Model loading moved to anatomy.inference.loading (kept here for a release)."""
    if name in _MOVED:
        from anatomy.deprecation import deprecated
        from anatomy.inference import loading

        deprecated(f"anatomy.inference.generate.{name} moved to anatomy.inference.loading.{_MOVED[name]}")
        return getattr(loading, _MOVED[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["generate", "stream", "GenerationResult", "SamplingParams"]
