"""The rows of a pass near a sampled one (kernels/sampled_rows.py): the runs a product splits its rows into,
and an engine's prompt step naming its sampled rows to the products, whose logits stay within the plan's
error of the model's own."""

from __future__ import annotations

import pytest
import torch

from anatomy.errors import InputError
from anatomy.inference.engine import DecoderEngine
from anatomy.inference.sampling import SamplingParams
from anatomy.kernels import sampled_rows
from anatomy.kernels.sampled_rows import TAIL, near_sampled, runs, split_rows

original_runs = runs


def test_runs_cover_the_rows_within_tail_up_to_each_sampled_one():
    assert split_rows([39], 40) == [(0, 40 - TAIL, False), (40 - TAIL, 40, True)]
    assert split_rows([3], 40) == [(0, 4, True), (4, 40, False)]
    assert split_rows([TAIL, TAIL + 2], 40) == [(0, 1, False), (1, TAIL + 3, True), (TAIL + 3, 40, False)]
    assert split_rows([0, 1, 2], 3) == [(0, 3, True)]
    assert split_rows([], 5) == [(0, 5, False)]


def test_a_sampled_row_outside_the_pass_is_refused():
    with pytest.raises(InputError, match="row 40 lies outside the pass's 40 rows"):
        split_rows([40], 40)


def test_runs_are_the_current_pass_s_and_only_for_its_rows():
    assert runs(40) is None
    with near_sampled([39], 40) as spans:
        assert runs(40) == spans and runs(39) is None
        with near_sampled([0], 2):
            assert runs(2) == [(0, 1, True), (1, 2, False)] and runs(40) is None
        assert runs(40) == spans
    assert runs(40) is None


def test_a_prompt_step_splits_its_products_and_keeps_the_models_logits(int4_tiny, native_forced, monkeypatch):
    """Forced native kernels (q4t ranked before q4t16): a 30-token prompt's products past the batch rows run
    their first 30 - TAIL rows on int8 activations and the last TAIL on int16; the sampled logits lie within the
    plan's error of the model's own (float32 on the dequantized weights), and a decode step asks for no runs."""
    asked = []
    original = sampled_rows.runs

    def spy(rows):
        asked.append((rows, original(rows)))
        return asked[-1][1]

    monkeypatch.setattr(sampled_rows, "runs", spy)
    engine = DecoderEngine(int4_tiny)
    prefill = {w.choices["prefill"] for w in engine.plan.weights.values() if "prefill" in w.choices}
    assert prefill == {"q4t16"}
    ids = torch.randint(0, 96, (1, 31), generator=torch.Generator().manual_seed(2))
    run = engine.start([ids[0, :30].tolist()], SamplingParams(max_new_tokens=2))
    got = torch.stack([run.prefill(), run.decode(ids[:, 30])], dim=1)  # [1, 2, V]
    split = [(0, 30 - TAIL, False), (30 - TAIL, 30, True)]
    assert asked and all(spans == split for rows, spans in asked if rows == 30)
    assert len([1 for rows, spans in asked if spans is not None]) == 2 * 4  # every product of both blocks
    assert not [rows for rows, _ in asked if rows != 30]  # the decode step's rows take their own route
    with torch.no_grad():
        ref = int4_tiny(ids)[:, 29:]
    assert (got - ref).norm() / ref.norm() < 1e-2


def test_an_engine_with_an_8_bit_cache_keeps_every_prompt_row_on_the_prompt_kernel(int4_tiny, native_forced,
                                                                                   monkeypatch):
    """A cache of 8-bit codes rounds every key and value already: its engine's prompt step names no sampled
    rows (the products find no runs), so every product keeps the prompt rule's kernel."""
    asked = []
    monkeypatch.setattr(sampled_rows, "runs", lambda rows: asked.append((rows, original_runs(rows))) or asked[-1][1])
    engine = DecoderEngine(int4_tiny, kv_dtype="int8")
    run = engine.start([list(range(3, 33))], SamplingParams(max_new_tokens=1))
    run.prefill()
    assert asked and asked == [(30, None)] * len(asked)
