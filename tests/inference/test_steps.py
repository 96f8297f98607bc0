"""The per-step inputs of a generation: left padding, and each decode step's Context equal to the
one the model's own (checked) forward builds from scratch."""

from __future__ import annotations

import pytest
import torch

from anatomy.inference.steps import DecodeSteps, PaddedBatch

from .conftest import gpt2_tiny, llama_tiny


def test_padded_batch_left_pads_and_masks():
    batch = PaddedBatch.of([[1, 2, 3], [4]], pad_id=0)
    assert batch.ids.tolist() == [[1, 2, 3], [0, 0, 4]]
    assert batch.slot_mask(5).tolist() == [[True] * 5, [False, False, True, True, True]]
    assert batch.positions(torch.tensor([3])).tolist() == [[3], [1]]
    assert PaddedBatch.of([[1], [2]]).slot_mask(4) is None


@pytest.mark.parametrize("make", [llama_tiny, gpt2_tiny], ids=["rope", "learned"])
@pytest.mark.parametrize("prompts", [[[1, 2, 3], [4]], [[5, 6]]], ids=["padded", "unpadded"])
def test_step_context_equals_the_models_own(make, prompts):
    """Rotary angles, positions and which key slots each row may attend to, at every decode slot."""
    stack = make().stack
    batch = PaddedBatch.of(prompts)
    T = 8
    steps = DecodeSteps(stack, batch, max_len=T, dtype=torch.float32)
    cache = [type("Cache", (), {"max_len": T})()]
    for s in range(batch.ids.shape[1], T):
        slot = torch.tensor([s])
        ctx, positions = steps.context(slot)
        ref, ref_positions = stack.prepare(torch.zeros(len(prompts), 1, dtype=torch.long),
                                           attention_mask=batch.slot_mask(T), position_ids=batch.positions(slot),
                                           cache=cache, input_pos=slot)
        assert torch.equal(positions, ref_positions)
        ref_mask = ref.mask.expand(len(prompts), 1, 1, T)
        assert torch.equal(ctx.mask.expand(len(prompts), 1, 1, T) == 0, ref_mask)
        assert torch.isinf(ctx.mask[~(ctx.mask == 0)]).all()
        if ref.rope is None:
            assert ctx.rope is None
        else:
            assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(ctx.rope, ref.rope))
