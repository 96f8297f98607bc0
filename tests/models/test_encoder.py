"""Encoder and MaskedLM behaviour: padding, segments, pooler, and clear errors. (Parity with HF's
BertModel / BertForMaskedLM is in tests/checkpoints/test_safetensors.py.)"""

from __future__ import annotations

import pytest
import torch

from anatomy import build_model, get_preset
from anatomy.errors import InputError

SMALL = dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=48, max_seq_len=16)


def bert(head="auto", **changes):
    return build_model(get_preset("bert-base", **{**SMALL, **changes}), head=head).eval()


def test_padding_gives_the_unpadded_hidden_states():
    model = bert()
    ids = torch.randint(3, 64, (1, 5))
    padded = torch.cat([ids, torch.randint(3, 64, (1, 4))], dim=1)  # junk after the real tokens
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0, 0, 0]])
    with torch.no_grad():
        assert (model(padded, attention_mask=mask)[:, :5] - model(ids)).abs().max() <= 1e-5


def test_token_types_matter_and_default_to_zero():
    model = bert()
    ids = torch.randint(3, 64, (2, 6))
    with torch.no_grad():
        zeros = model(ids, token_type_ids=torch.zeros_like(ids))
        assert torch.equal(model(ids), zeros)
        assert (model(ids, token_type_ids=torch.ones_like(ids)) - zeros).abs().max() > 1e-3


def test_pooler_and_mlm_head():
    model = bert()
    hidden = model(torch.randint(0, 64, (2, 5)))
    assert model.pool(hidden).shape == (2, 32)
    with pytest.raises(InputError, match="built without a pooler"):
        bert(pooler=False).pool(hidden)
    mlm = bert(head="mlm")
    assert mlm.encoder.pooler is None and mlm.decoder.weight is mlm.encoder.stack.embed.tokens.weight
    assert mlm(torch.randint(0, 64, (2, 5))).shape == (2, 5, 64)


@pytest.mark.parametrize("kwargs, message", [
    (dict(token_type_ids=torch.full((1, 4), 2)), r"token_type_ids holds token id 2, outside \[0, vocab_size=2\)"),
    (dict(attention_mask=torch.ones(1, 3)), r"attention_mask has shape \(1, 3\), input_ids has \(1, 4\)"),
    (dict(token_type_ids=torch.zeros(2, 4, dtype=torch.long)), r"token_type_ids has shape \(2, 4\)"),
])
def test_bad_inputs(kwargs, message):
    with pytest.raises(InputError, match=message):
        bert()(torch.tensor([[1, 2, 3, 4]]), **kwargs)


def test_too_long():
    with pytest.raises(InputError, match="position 16 is past max_seq_len=16"):
        bert()(torch.randint(0, 64, (1, 17)))
