"""The engine's device seam (inference/engine/backend.py): the `torch` backend, what a GPU runs, runs on
this CPU and is held to the `cpu` backend's answers on SmolLM2-135M in fp32 (the cpu backend's native
paths forced: fused blocks, native products where exact, the native cache readers): 64 greedy tokens
equal, logits within 1e-4, static and paged caches; under the torch backend no anatomy:: operator
runs, an int8 KV cache included (torch's profiler lists every operator a step calls)."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from anatomy.errors import InputError
from anatomy.inference.engine import DecoderEngine
from anatomy.inference.engine.backend import CPU, TORCH, backend_for
from anatomy.inference.engine.paged import Chunk
from anatomy.inference.sampling import SamplingParams

PROMPT = [1, 504, 3458, 314, 260, 3575, 282, 4649, 47, 198, 9, 14437, 314]  # a 13-token prompt of SmolLM2's ids


def anatomy_ops(fn) -> set[str]:
    """The anatomy:: operators `fn()` calls (torch's profiler records every dispatched operator)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {e.key for e in prof.key_averages() if e.key.startswith("anatomy::")}


def greedy(engine: DecoderEngine, n: int) -> list[int]:
    return [int(t) for t in engine.tokens([PROMPT], SamplingParams(max_new_tokens=n))]


def test_each_device_has_its_backend_and_cpu_runs_cpu_tensors_only():
    assert backend_for(torch.device("cpu")) is CPU
    assert backend_for(torch.device("cuda", 0)) is TORCH and backend_for(torch.device("meta")) is TORCH
    assert backend_for(torch.device("cpu"), "torch") is TORCH
    with pytest.raises(InputError, match="runs CPU tensors only"):
        backend_for(torch.device("cuda", 0), "cpu")
    with pytest.raises(InputError, match="'tpu' is not one of cpu, torch"):
        backend_for(torch.device("cpu"), "tpu")


def engine_of(model, backend: str, **options) -> DecoderEngine:
    return DecoderEngine(model, backend=backend, **options)


@pytest.mark.slow
def test_the_torch_backend_answers_as_the_cpu_backend(smollm2, native_forced):
    cpu, torch_ = engine_of(smollm2, "cpu"), engine_of(smollm2, "torch")
    assert torch_.plan is None and not torch_.captured and torch_.native_blocks == 0
    assert cpu.captured
    ids = torch.tensor([PROMPT])
    torch.testing.assert_close(torch_.logits(ids), cpu.logits(ids), atol=1e-4, rtol=0)
    assert anatomy_ops(lambda: greedy(cpu, 4)), "the profiler sees the cpu backend's native operators"
    assert anatomy_ops(lambda: greedy(torch_, 4)) == set(), "the torch backend calls no native operator"
    assert greedy(torch_, 64) == greedy(cpu, 64)


def test_the_torch_backend_steps_a_paged_cache_as_the_cpu_backend(smollm2, native_forced):
    """The serving step: a prefill chunk and a decode row over blocks of 16."""
    logits = {}
    for name in ("cpu", "torch"):
        engine = engine_of(smollm2, name)
        cache = engine.paged_cache(num_blocks=8, block_size=16)
        first = engine.step(cache, [Chunk(PROMPT, 0, [0])])
        token = int(first[-1].argmax())
        ops = anatomy_ops(lambda: logits.setdefault(name, (first, engine.step(cache, [Chunk([token], len(PROMPT),
                                                                                             [0])]))))
        assert bool(ops) == (name == "cpu"), (name, ops)
    for mine, theirs in zip(logits["torch"], logits["cpu"]):
        torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_an_int8_cache_under_the_torch_backend_calls_no_native_operator(smollm2, native_forced):
    cpu = engine_of(smollm2, "cpu", kv_dtype="int8")
    torch_ = engine_of(smollm2, "torch", kv_dtype="int8")
    assert cpu._reader is not None and torch_._reader is None
    assert anatomy_ops(lambda: greedy(cpu, 4)), "the cpu backend reads the codes natively"
    assert anatomy_ops(lambda: greedy(torch_, 4)) == set(), "the torch backend calls no native operator"
    assert greedy(torch_, 16) == greedy(cpu, 16), "the same int8 codes, read by torch or by the native reader"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (this torch sees none)")
def test_a_cuda_model_runs_the_torch_backend_with_an_int8_cache(smollm2):
    """On a GPU: the torch backend by default, an int8 cache read by torch, the cpu backend's tokens."""
    import copy

    on_gpu = copy.deepcopy(smollm2).cuda()
    engine = DecoderEngine(on_gpu, kv_dtype="int8")
    assert engine.backend is TORCH and engine._reader is None
    assert greedy(engine, 16) == greedy(DecoderEngine(smollm2, kv_dtype="int8"), 16)
    with pytest.raises(InputError, match="runs CPU tensors only"):
        DecoderEngine(on_gpu, backend="cpu")
