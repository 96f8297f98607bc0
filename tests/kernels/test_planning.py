"""The engine's planned view: float weights run on exact f32 kernels (the logits of weights="f32"
are the model's), compact weights on the measured kernels within the plan's error bound, the LM
head held ten times tighter; and on SmolLM2 the f32 path's mean token NLL is fp32's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import anatomy
from anatomy.inference.engine import DecoderEngine
from anatomy.inference.sampling import SamplingParams
from anatomy.kernels import native
from anatomy.kernels.planned_linear import PlannedLinear
from anatomy.kernels.planning import HEAD_THRESHOLD
from anatomy.inference.quality import mean_nll

from ..inference.conftest import llama_tiny

ENGLISH = Path(__file__).parents[1] / "data" / "english.txt"


def _planned(engine: DecoderEngine) -> dict[str, PlannedLinear]:
    return {n: m for n, m in engine.model.named_modules() if isinstance(m, PlannedLinear)}


def _chosen(engine: DecoderEngine) -> set[str]:
    return {k for w in engine.plan.weights.values() for k in w.choices.values()}


def test_float_weights_run_on_exact_kernels():
    model = llama_tiny()
    engine = DecoderEngine(model)
    assert len(_planned(engine)) == 2 * 4 + 1 and _chosen(engine) <= {"f32", "f32/chunked"}
    ids = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(engine.model(ids), model(ids), rtol=1e-5, atol=1e-5)


def test_compact_weights_within_the_plans_error(int4_tiny):
    engine = DecoderEngine(int4_tiny)
    ids = torch.randint(0, 96, (3, 11))
    with torch.no_grad():
        ref, got = int4_tiny(ids), engine.model(ids)
    assert (got - ref).norm() / ref.norm() < 1e-2
    head = next(w for w in engine.plan.weights.values() if "lm_head.weight" in w.layers)
    for phase, kernel in head.choices.items():  # the head's products are the logits: held to 1e-3
        chosen = next(m for m in head.measurements[phase] if m.kernel == kernel)
        assert chosen.error <= HEAD_THRESHOLD
    assert [line.split(":")[0] for line in engine.kernel_summary()] == ["decode", "batch", "prefill"]


@pytest.mark.parametrize("isa", native.ISAS[:native.ISAS.index(native.isa()) + 1])
def test_each_vector_path_of_this_cpu_plans_and_decodes_within_the_plans_error(int4_tiny, isa):
    """A machine with less than this one (simulated by limiting the native kernels' vector code: no
    AVX-512, no AVX2): the plan measures what runs there (no native kernel without a vector path, and
    no fused block), and teacher-forced decode steps give the model's own logits within the plan's
    error bound, whichever kernels won."""
    with native.limited(isa):
        engine = DecoderEngine(int4_tiny)
        measured = {m.kernel for w in engine.plan.weights.values() for ms in w.measurements.values() for m in ms}
        if isa == "portable":
            assert not measured & {"q4x", "q4f", "q8x", "q8f"} and engine.native_blocks == 0
        else:
            assert {"q4x", "q4f"} <= measured
        assert bool(measured & {"q4t", "q4t16"}) == native.runs("avx512-vnni")  # tiles: AVX-512 VNNI only
        assert bool(measured & {"q4t16/amx"}) == (isa == "amx")  # and their AMX product: AMX only
        ids = torch.randint(0, 96, (1, 30), generator=torch.Generator().manual_seed(1))
        run = engine.start([ids[0, :4].tolist()], SamplingParams(max_new_tokens=26))
        got = torch.stack([run.prefill()] + [run.decode(ids[:, t]) for t in range(4, 29)], dim=1)  # [1, 26, V]
    with torch.no_grad():
        ref = int4_tiny(ids[:, :29])[:, 3:]  # the logits after each of the same tokens
    assert (got - ref).norm() / ref.norm() < 1e-2


def test_the_callers_compact_model_is_left_alone(int4_tiny):
    before = {n: type(m) for n, m in int4_tiny.named_modules()}
    anatomy.generate(int4_tiny, [3, 4, 5], max_new_tokens=4)
    assert {n: type(m) for n, m in int4_tiny.named_modules()} == before


@pytest.mark.slow
def test_f32_weights_through_the_planned_prefill_give_fp32s_nll(smollm2, smollm2_tokenizer):
    """2,068 tokens of English in one forward through the engine's planned kernels with weights="f32":
    the same NLL as the model's own fp32 forward (the default weights' quality is measured through
    the decode step generation runs: tests/inference/test_perplexity.py)."""
    ids = smollm2_tokenizer.encode(ENGLISH.read_text())
    assert len(ids) >= 2000
    exact = mean_nll(DecoderEngine(smollm2), ids)
    assert abs(exact - mean_nll(smollm2, ids)) < 1e-4
