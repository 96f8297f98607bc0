"""EncoderDecoder behaviour: encode/decode halves, source padding, the causal decoder, the scaled
sinusoidal embeddings, and clear errors. (Parity with HF's MarianMTModel is in
tests/checkpoints/test_safetensors.py.)"""

from __future__ import annotations

import math

import pytest
import torch

from anatomy import build_model, get_preset
from anatomy.errors import InputError

SMALL = dict(vocab_size=64, d_model=32, n_layers=2, n_decoder_layers=2, n_heads=4, d_ff=48, max_seq_len=16,
             dropout=0.0)


def transformer(**changes):
    return build_model(get_preset("transformer-base", **{**SMALL, **changes})).eval()


def test_forward_is_encode_then_decode():
    model = transformer()
    src, tgt = torch.randint(3, 64, (2, 7)), torch.randint(3, 64, (2, 5))
    mask = torch.ones_like(src)
    mask[1, 4:] = 0
    with torch.no_grad():
        logits = model(src, tgt, src_mask=mask)
        memory = model.encode(src, mask)
        assert torch.equal(model.decode(tgt, memory, src_mask=mask), logits)
        assert torch.equal(model.decode(tgt, memory_kv=model.memory_kv(memory), src_mask=mask), logits)
    assert logits.shape == (2, 5, 64)


@pytest.mark.parametrize("n_kv_heads", [4, 2], ids=["MHA", "GQA"])
def test_source_padding_gives_the_unpadded_logits(n_kv_heads):
    model = transformer(n_kv_heads=n_kv_heads)
    state = model.state_dict()
    src, tgt = torch.randint(3, 64, (1, 5)), torch.randint(3, 64, (1, 4))
    padded = torch.cat([src, torch.randint(3, 64, (1, 3))], dim=1)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0, 0]])
    with torch.no_grad():
        for backend in ("sdpa", "eager"):
            model = build_model(model.config, attention=backend).eval()
            model.load_state_dict(state)
            assert (model(padded, tgt, src_mask=mask) - model(src, tgt)).abs().max() <= 1e-5


def test_decoder_is_causal_and_encoder_is_not():
    model = transformer()
    src, tgt = torch.randint(3, 64, (1, 6)), torch.randint(3, 64, (1, 6))
    changed = tgt.clone()
    changed[0, 3] = (tgt[0, 3] + 1) % 64
    with torch.no_grad():
        a, b = model(src, tgt), model(src, changed)
        assert torch.equal(a[:, :3], b[:, :3]) and (a[:, 3:] - b[:, 3:]).abs().max() > 1e-4
        src2 = src.clone()
        src2[0, -1] = (src[0, -1] + 1) % 64
        assert (model.encode(src)[0, 0] - model.encode(src2)[0, 0]).abs().max() > 1e-4


def test_embeddings_are_scaled_and_sinusoidal():
    model = transformer()
    ids = torch.randint(0, 64, (1, 5))
    pos = torch.arange(5)[None]
    expected = model.shared(ids) * math.sqrt(32) + model.encoder.embed.positions.table[:5]
    assert torch.allclose(model.encoder.embed(ids, pos), expected)
    assert model.lm_head.weight is model.shared.weight


@pytest.mark.parametrize("call, message", [
    (lambda m: m(torch.ones(2, 3, dtype=torch.long), torch.ones(3, 3, dtype=torch.long)),
     "batch sizes differ: src_ids has 2 rows, tgt_ids 3"),
    (lambda m: m.decode(torch.ones(3, 2, dtype=torch.long), m.encode(torch.ones(2, 3, dtype=torch.long))),
     "batch sizes differ: tgt_ids has 3 rows, the encoder output 2"),
    (lambda m: m(torch.ones(1, 3, dtype=torch.long), torch.ones(1, 2, dtype=torch.long), src_mask=torch.ones(1, 4)),
     r"src_mask has shape \(1, 4\), src_ids has \(1, 3\)"),
    (lambda m: m(torch.ones(1, 17, dtype=torch.long), torch.ones(1, 2, dtype=torch.long)),
     r"position 16 is past max_seq_len=16 \(position='sinusoidal'"),
    (lambda m: m(torch.ones(1, 3, dtype=torch.long), torch.full((1, 2), 64)),
     r"tgt_ids holds token id 64, outside \[0, vocab_size=64\)"),
])
def test_bad_inputs(call, message):
    with pytest.raises(InputError, match=message):
        call(transformer())
