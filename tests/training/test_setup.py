"""The pre-flight checks of a training run: its memory estimate is analysis.memory's (one source),
counted for f32 training on the CPU; micro-batches that cannot fit fail with the accumulation that
would make them fit."""

from __future__ import annotations

import pytest
import torch

from anatomy import build_model, get_preset
from anatomy.analysis.memory import training_activations
from anatomy.errors import InputError
from anatomy.training.setup import check_memory, estimated_bytes

CONFIG = get_preset("bert-base", d_model=64, n_layers=2, n_heads=4, d_ff=128, vocab_size=100, max_seq_len=32)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_cpu_estimate_is_f32_activations_of_the_mlm_model_and_16_bytes_per_parameter(checkpointing):
    model = build_model(CONFIG, head="mlm")
    n = sum(p.numel() for p in model.parameters())
    activations, state = estimated_bytes(model, CONFIG, rows=3, seq_len=32, world=1, sharded=False,
                                         device=torch.device("cpu"), activation_checkpointing=checkpointing)
    measured = training_activations(CONFIG, batch=3, seq=32, dtype="f32", head="mlm")
    assert activations == (measured.checkpointed if checkpointing else measured.total)
    assert measured.block_input == 3 * 32 * 64 * 4  # f32, not bf16
    assert state == 16 * n


def test_fsdp_shards_the_state_over_the_ranks():
    model = build_model(CONFIG, head="mlm")
    args = dict(rows=1, seq_len=32, device=torch.device("cpu"), activation_checkpointing=False)
    _, whole = estimated_bytes(model, CONFIG, world=4, sharded=False, **args)
    _, shard = estimated_bytes(model, CONFIG, world=4, sharded=True, **args)
    assert shard * 4 == whole


def test_a_micro_batch_that_does_not_fit_names_the_accumulation_that_would():
    check_memory(6e9, 1e9, 8e9, rows=8, accum=1)  # fits: nothing raised
    with pytest.raises(InputError, match=r"use --accum 2 \(4 rows per micro-step\)"):
        check_memory(12e9, 1e9, 8e9, rows=8, accum=1)
    with pytest.raises(InputError, match="even one row per micro-step does not fit"):
        check_memory(12e9, 9e9, 8e9, rows=8, accum=1)
