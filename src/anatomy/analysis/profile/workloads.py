"""What `anatomy profile` runs: the steps of each phase, through the code that serves the model.

    decoder            the model's kept engine (eager step): prefill = engine.start + run.prefill + the
                       first token's choice; decode = each later run.decode + choice; beside it, timed
                       only, the production step: the same decode steps on the engine `anatomy.generate` uses
    encoder            the model's forward over [B, S] (one phase, "prefill")
    encoder-decoder    its engine's Seq2SeqRun: the source encoded and its cross-attention K/V projected
                       ("prefill"); decode = one decoder step of B rows + greedy choice

Every phase is an endless iterator factory: each `next()` is one step. A decode step of a run reads
its whole table, T = context slots (prompt + new tokens in whole blocks), so every measured step
attends over the same T positions: the shape the trace's decode step has.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from anatomy.analysis.profile.run import named_stage
from anatomy.inference.sampling import SamplingParams, next_tokens


@dataclass(frozen=True)
class Shape:
    batch: int
    prompt_len: int  # S: prompt (an encoder's sequence, a seq2seq model's source)
    context: int  # T: the cache slots a decode step attends over


@dataclass
class Workload:
    """The model the steps run (the engine's view: hooks go on it) and each phase's step factory."""

    model: nn.Module
    phases: dict[str, Callable[[], Iterator[None]]]
    tokens: dict[str, int]  # tokens each phase's step processes (prefill) or produces (decode)
    dtype: torch.dtype  # the activations' dtype (the engine's choice, with its kernel plan)
    plan: object = None  # the engine's KernelPlan (kernels/plan.py), for a decoder
    kv_dtype: str | None = None  # what its KV cache holds, for a decoder
    production: Production | None = None  # a decoder's decode step as anatomy.generate runs it


@dataclass(frozen=True)
class Production:
    """The decode steps of the engine `anatomy.generate` uses (its defaults: steps replayed from a
    captured graph, blocks fused into native operators where measured faster), for timing only."""

    engine: object  # the DecoderEngine
    steps: Callable[[], Iterator[None]]
    warmup: int  # decode steps before a run's step is its captured one (CAPTURE_AFTER and the recording)
    context: int  # the cache slots its steps attend over (the engine's cache: T rounded up to its bucket)


def prompt_ids(vocab_size: int, shape: Shape) -> list[list[int]]:
    """Deterministic token ids, different per row, away from the low ids where special tokens live."""
    low = min(100, vocab_size // 2)
    span = vocab_size - low
    return [[low + (131 * row + 17 * j) % span for j in range(shape.prompt_len)] for row in range(shape.batch)]


def workload(model: nn.Module, shape: Shape, *, attention: str | None = None, kv_dtype: str | None = None,
             engine=None, production: bool = False) -> Workload:
    """The phases of `model` at `shape` through its engine; `attention` ("sdpa" or "eager") is the
    backend of the engine's attention layers (the caller's model keeps its own), `kv_dtype` what a
    decoder's KV cache holds. A decoder's `engine`, when given, is used as it is (a parallel run's
    ParallelEngine over `model`, rank 0's shard). `production`: a decoder's production step too."""
    config = model.config
    if config.is_decoder:
        return _decoder(model, shape, attention, kv_dtype, engine, production)
    if config.is_seq2seq:
        return _seq2seq(model, shape, attention)
    return _encoder(model, shape, attention)


def _decoder(model: nn.Module, shape: Shape, attention: str | None, kv_dtype: str | None, engine=None,
             production: bool = False) -> Workload:
    """The engine kept for the model with an eager decode step of the torch blocks (capture=False,
    native_blocks=False): a captured step replays a graph without module calls, and a block fused
    into one native operator runs its products, norms and attention inside it, so their operators
    could not be attributed to their modules and positions. A sweep's points and a what-if's runs
    share it (its kernel plan is measured once)."""
    from anatomy.inference.engine import engine_for

    made = engine is None
    if engine is None:
        engine = engine_for(model, capture=False, native_blocks=False, attention=attention, kv_dtype=kv_dtype)
    prompts = prompt_ids(model.config.vocab_size, shape)
    first = SamplingParams(max_new_tokens=1, ignore_eos=True)

    def prefills() -> Iterator[None]:
        while True:
            run = engine.start(prompts, first)
            named_stage("sampling", run.choose)(run.prefill())
            yield

    steps = shape.context - shape.prompt_len
    fast = _production(model, prompts, steps, attention, kv_dtype) if made and production else None
    return Workload(engine.model, {"prefill": prefills, "decode": _decode_steps(engine, prompts, steps, named=True)},
                    {"prefill": shape.batch * shape.prompt_len, "decode": shape.batch}, engine.dtype, engine.plan,
                    engine.kv_dtype, fast)


def _decode_steps(engine, prompts: list[list[int]], steps: int, *,
                  named: bool = False) -> Callable[[], Iterator[None]]:
    """A factory of `steps` steps of one run of `engine`: its prefill (the warm-up takes it), then each
    run.decode + the token's choice (`named`: inside the profile's sampling range)."""
    params = SamplingParams(max_new_tokens=steps, ignore_eos=True)

    def decodes() -> Iterator[None]:
        run = engine.start(prompts, params)
        choose = named_stage("sampling", run.choose) if named else run.choose
        token = choose(run.prefill())
        yield
        for _ in range(steps - 1):
            token = choose(run.decode(token))
            yield
        raise RuntimeError("the decode steps outran the cache: context too small for the steps asked for")

    return decodes


def _production(model: nn.Module, prompts: list[list[int]], steps: int, attention: str | None,
                kv_dtype: str | None) -> Production | None:
    """The decode steps through `engine_for(model)` as anatomy.generate makes it, each run longer by the
    steps before its capture; None where the model's context has no room for them."""
    from anatomy.inference.engine import engine_for
    from anatomy.inference.engine.run import CAPTURE_AFTER

    warmup = CAPTURE_AFTER + 1  # the eager steps, then the one that records the graph
    if len(prompts[0]) + steps + warmup > model.config.max_seq_len:
        return None
    engine = engine_for(model, attention=attention, kv_dtype=kv_dtype)
    context = engine.start(prompts, SamplingParams(max_new_tokens=steps + warmup)).max_len
    return Production(engine, _decode_steps(engine, prompts, steps + warmup), warmup, context)


def _encoder(model: nn.Module, shape: Shape, attention: str | None) -> Workload:
    from anatomy.inference.engine.view import engine_view

    view = engine_view(model, attention=attention)
    ids = torch.tensor(prompt_ids(model.config.vocab_size, shape), device=_device(view))

    def forwards() -> Iterator[None]:
        while True:
            view(ids)
            yield

    return Workload(view, {"prefill": forwards}, {"prefill": shape.batch * shape.prompt_len}, view_dtype(view))


def _seq2seq(model: nn.Module, shape: Shape, attention: str | None) -> Workload:
    from anatomy.inference.engine import engine_for

    engine = engine_for(model, attention=attention)
    source = prompt_ids(model.config.vocab_size, Shape(1, shape.prompt_len, shape.context))[0]
    greedy = SamplingParams()
    choose = named_stage("sampling", lambda logprobs: next_tokens(logprobs, greedy))

    def encodes() -> Iterator[None]:
        while True:
            engine.start(source, rows=shape.batch, max_new_tokens=shape.context)
            yield

    def decodes() -> Iterator[None]:
        run = engine.start(source, rows=shape.batch, max_new_tokens=shape.context)
        tokens = torch.full((shape.batch,), run.start_id, dtype=torch.long, device=engine.device)
        for slot in range(shape.context):
            tokens = choose(run.step(tokens, slot))
            yield
        raise RuntimeError("the decode steps outran the cache: context too small for the steps asked for")

    return Workload(engine.model, {"prefill": encodes, "decode": decodes},
                    {"prefill": shape.prompt_len, "decode": shape.batch}, view_dtype(engine.model))


def view_dtype(model: nn.Module) -> torch.dtype:
    """The dtype a model computes in without the engine's plan: that of its token embedding."""
    from anatomy.models.embedding import Embeddings

    return next(m for m in model.modules() if isinstance(m, Embeddings)).dtype


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device
