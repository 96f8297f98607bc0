"""The captured decode step (inference/engine/capture.py) against the eager step it records: the same
logits, bit for bit, at every step, for each family and each position and mask rule, batched with
padding, across generations that reuse the captured graph; what cannot be captured runs eagerly."""

from __future__ import annotations

import copy

import pytest
import torch

from anatomy import build_model, get_preset
from anatomy.inference.engine import DecoderEngine
from anatomy.inference.engine import engine as engine_module
from anatomy.inference.engine.run import CAPTURE_AFTER
from anatomy.inference.sampling import SamplingParams
from anatomy.weights.choice import compact_formats, install

from ..conftest import SMALL, gpt2_tiny, llama_tiny

PROMPTS = [[5, 17, 33, 2, 9, 41, 8], [60, 3], [11, 12, 13, 14]]


def llama_with(**fields):
    torch.manual_seed(0)
    return build_model(get_preset("llama-7b", **SMALL, n_layers=2, n_kv_heads=2, d_ff=96, **fields)).eval()


def int4(model):
    """The model with every matrix as int4 (embedding and head int8): the engine computes its branches in bf16."""
    formats = compact_formats(model, "int4", dtype=torch.float32, lossless=lambda name: None,
                              dense=lambda name: model.get_parameter(name).detach())
    return install(model, formats, dtype=torch.float32)


MODELS = {
    "llama-gqa": llama_tiny,
    "gpt2": gpt2_tiny,
    "llama-int4": lambda: int4(llama_tiny()),
    "sliding-window": lambda: llama_with(sliding_window=3, sliding_window_layers=(0,)),
    "dynamic-ntk": lambda: llama_with(rope_scaling=dict(kind="dynamic", factor=2.0, original_max_seq_len=6)),
    "qk-norm-softcap-partial-rotary": lambda: llama_with(qk_norm=True, attn_softcap=30.0, rotary_dim=8),
    "alibi": lambda: llama_with(position="alibi"),
}


def step_logits(engine: DecoderEngine, prompts: list[list[int]], steps: int | None = None) -> list[torch.Tensor]:
    """The logits [B, V] a run samples from at each step (prefill's first). By default as many
    steps as fill the model's context: the captured engine's cache (rounded up to a bucket, capped
    at max_seq_len) then has the eager one's length, and attention sums over the same slots."""
    steps = steps or SMALL["max_seq_len"] - max(map(len, prompts))
    run = engine.start(prompts, SamplingParams(max_new_tokens=steps))
    seen = [run.prefill()]
    for _ in range(steps - 1):
        seen.append(run.decode(run.choose(seen[-1])))
    return seen


def eager_twin(engine: DecoderEngine) -> DecoderEngine:
    """The same engine (same view, same measured kernel plan) with none of its recorded steps (this test
    of the engine's own package may reach into it: no code outside the package does); eager_logits
    runs it without recording any."""
    twin = copy.copy(engine)
    twin._caches, twin._bodies, twin._seen_shapes = {}, {}, {}
    return twin


def eager_logits(engine: DecoderEngine, prompts: list[list[int]]) -> list[torch.Tensor]:
    """step_logits of an engine that records no step: its eager steps take the rows padded to the
    recorded graph's batch size, as the captured engine's own eager steps do (a float GEMM need not give
    a row the same bits at another row count: MKL on a Zen 4 does not)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine_module, "PAGED_RECORD_AFTER", 10 ** 9)
        return step_logits(engine, prompts)


@pytest.mark.parametrize("name", MODELS)
def test_captured_steps_give_the_eager_logits_bit_for_bit(name):
    captured = DecoderEngine(MODELS[name]())
    eager = eager_twin(captured)
    for prompts in (PROMPTS, PROMPTS[1:2], PROMPTS):  # batched with padding, alone, and the first graph again
        got, want = step_logits(captured, prompts), eager_logits(eager, prompts)
        assert len(got) == len(want) == 64 - max(map(len, prompts))
        for step, (a, b) in enumerate(zip(got, want)):
            assert torch.equal(a, b), f"{name}: step {step} differs by {(a - b).abs().max():.3g}"
    assert captured.captured_graphs == 2  # one graph per (batch size, cache length), reused


def test_int4_branches_compute_in_the_kernels_dtype(forced_timings):
    """A plan whose block kernels take bf16 (or any dtype: anatomy's own) computes the branches in bf16,
    the KV cache too, and keeps the residual stream in the model's float32."""
    engine = DecoderEngine(int4(llama_tiny()))
    assert engine.branch_dtype == torch.bfloat16
    run = engine.start(PROMPTS, SamplingParams(max_new_tokens=2))
    assert engine.dtype == torch.float32 and run.cache[0].k.dtype == torch.bfloat16


def test_experts_route_by_value_so_a_moe_stack_is_not_captured():
    captured = DecoderEngine(llama_with(n_experts=4, n_experts_per_token=2))
    eager = eager_twin(captured)
    got, want = step_logits(captured, PROMPTS), eager_logits(eager, PROMPTS)
    assert len(got) > CAPTURE_AFTER and all(torch.equal(a, b) for a, b in zip(got, want))
    assert captured.captured_graphs == 0


def test_an_engine_keeps_a_runs_cache_per_bucket_and_lends_it_again():
    model = llama_tiny()
    engine = DecoderEngine(model)
    run = engine.start(PROMPTS, SamplingParams(max_new_tokens=5))
    assert run.max_len == model.config.max_seq_len  # 7 + 5 rounded up to the bucket, capped at 64
    assert run.cache.num_blocks == 3 * 256 // run.cache.block_size  # a table of the bucket per row
    alive = engine.start(PROMPTS, SamplingParams(max_new_tokens=7))
    assert alive.cache is not run.cache  # lent to the first run while it lives
    cache = run.cache
    del run, alive
    assert engine.start(PROMPTS, SamplingParams(max_new_tokens=7)).cache is cache  # kept, lent again


def test_an_engine_that_neither_captures_nor_compiles_gives_each_run_a_fresh_cache():
    """No recorded step reads a cache of its own there: keeping one per shape would only hold memory."""
    engine = DecoderEngine(llama_tiny(), capture=False)
    run = engine.start(PROMPTS, SamplingParams(max_new_tokens=5))
    assert run.cache.num_blocks == 3 * 16 // run.cache.block_size  # 7 + 5 tokens: one block of 16 per row
    cache = run.cache
    del run
    assert engine.start(PROMPTS, SamplingParams(max_new_tokens=5)).cache is not cache
    assert engine._caches == {}


def test_a_short_generation_is_not_captured_and_a_longer_one_is_from_its_33rd_step():
    engine = DecoderEngine(llama_tiny())
    list(engine.tokens(PROMPTS, SamplingParams(max_new_tokens=CAPTURE_AFTER)))
    assert engine.captured_graphs == 0  # a short answer does not pay for the recording
    list(engine.tokens(PROMPTS, SamplingParams(max_new_tokens=CAPTURE_AFTER + 2)))
    assert engine.captured_graphs == 1
