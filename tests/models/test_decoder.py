"""DecoderLM behaviour: shapes, tying, padding, and clear errors for bad input. (Parity with HF's
LlamaForCausalLM and GPT2LMHeadModel is in tests/checkpoints/test_safetensors.py.)"""

from __future__ import annotations

import pytest
import torch

from anatomy import build_model, get_preset
from anatomy.errors import InputError


def llama(**changes):
    small = dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48, max_seq_len=16,
                 bos_token_id=1, eos_token_id=2)
    return build_model(get_preset("llama-7b", **{**small, **changes})).eval()


def gpt2(**changes):
    small = dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=48, max_seq_len=16, bos_token_id=1,
                 eos_token_id=2)
    return build_model(get_preset("gpt2", **{**small, **changes})).eval()


def test_shapes_and_last_only():
    model = llama()
    ids = torch.randint(0, 64, (3, 7))
    with torch.no_grad():
        logits = model(ids)
        assert logits.shape == (3, 7, 64)
        assert torch.allclose(model(ids, last_only=True), logits[:, -1:], atol=1e-6)
        assert model.stack(ids).shape == (3, 7, 32)


def test_tied_and_untied_heads():
    tied, untied = gpt2(), llama()
    assert tied.lm_head.weight is tied.stack.embed.tokens.weight
    assert "lm_head.weight" not in dict(tied.named_parameters())
    assert untied.lm_head.weight is not untied.stack.embed.tokens.weight


@pytest.mark.parametrize("make", [llama, gpt2], ids=["llama", "gpt2"])
def test_left_padding_gives_the_unpadded_logits(make):
    """A left-padded row, with its mask and positions counted from its first real token, gives the
    logits of the same tokens run alone."""
    model = make()
    ids = torch.randint(3, 64, (1, 6))
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], dim=1)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1]])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        alone = model(ids)
        got = model(padded, attention_mask=mask, position_ids=positions)[:, 3:]
    assert (got - alone).abs().max() <= 1e-5


@pytest.mark.parametrize("ids, message", [
    (torch.tensor([[1, 64]]), r"input_ids holds token id 64, outside \[0, vocab_size=64\)"),
    (torch.tensor([[-1, 3]]), r"input_ids holds token id -1, outside \[0, vocab_size=64\)"),
    (torch.tensor([[1.0, 2.0]]), r"input_ids must be an integer tensor \[B, S\], got \(1, 2\) torch.float32"),
    (torch.tensor([1, 2]), r"input_ids must be an integer tensor \[B, S\], got \(2,\)"),
    (torch.zeros(2, 0, dtype=torch.long), "input_ids is empty"),
])
def test_bad_token_ids(ids, message):
    with pytest.raises(InputError, match=message):
        gpt2()(ids)


def test_too_long_for_learned_positions_but_not_for_rope():
    ids = torch.randint(0, 64, (1, 17))
    with pytest.raises(InputError, match=r"position 16 is past max_seq_len=16 \(position='learned'"):
        gpt2()(ids)
    assert llama()(ids).shape == (1, 17, 64)  # RoPE has no table to run off


def test_kv_cache_needs_input_pos():
    class Cache:
        max_len = 8

    with pytest.raises(ValueError, match="a KV cache needs input_pos"):
        llama()(torch.tensor([[1, 2]]), cache=[Cache(), Cache()])
