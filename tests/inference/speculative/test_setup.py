"""generate()'s speculative options: bad input is one InputError naming the value and the rule."""

from __future__ import annotations

import pytest

import anatomy
from anatomy import build_model, get_preset
from anatomy.errors import InputError
from anatomy.inference.engine import DecoderEngine
from anatomy.inference.speculative import Speculation, first_layers

from .conftest import TINY, tiny


@pytest.mark.parametrize("options, message", [
    (dict(speculative="medusa"), "speculative='medusa' is not one of 'ngram', 'draft'"),
    (dict(speculative="ngram", num_speculative_tokens=0), "num_speculative_tokens=0 must be an integer >= 1"),
    (dict(speculative="ngram", num_speculative_tokens=-2), "num_speculative_tokens=-2 must be an integer >= 1"),
    (dict(speculative="ngram", num_speculative_tokens=2.5), "num_speculative_tokens=2.5 must be an integer >= 1"),
    (dict(speculative="ngram", num_speculative_tokens=96),
     "num_speculative_tokens=96 is beyond the model's context of 96 tokens"),
    (dict(speculative="draft"), "speculative='draft' needs a draft_model"),
    (dict(num_speculative_tokens=3), "draft_model and num_speculative_tokens need speculative='ngram' or 'draft'"),
    (dict(speculative="draft", draft_model=42), "draft_model must be an anatomy model, a DecoderEngine or a model"),
])
def test_bad_options(options, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        anatomy.generate(tiny(), [1, 2, 3], max_new_tokens=4, **options)


def test_a_draft_with_another_vocabulary():
    other = build_model(get_preset("llama-7b", **(TINY | dict(vocab_size=50)))).eval()
    with pytest.raises(InputError, match=r"the draft model's vocabulary \(50 tokens\) differs from the target's "
                                         r"\(97\): speculative decoding needs one tokenizer for both"):
        anatomy.generate(tiny(), [1, 2, 3], max_new_tokens=4, speculative="draft", draft_model=other)


def test_a_draft_with_a_shorter_context():
    short = build_model(get_preset("llama-7b", **(TINY | dict(max_seq_len=16)))).eval()
    with pytest.raises(InputError, match="the draft model's context of 16 tokens .* shorter than the 3-token prompt "
                                         r"\+ 20 new tokens"):
        anatomy.generate(tiny(), [1, 2, 3], max_new_tokens=20, speculative="draft", draft_model=short)


def test_speculation_needs_decoder_only_models():
    seq2seq = build_model(get_preset("transformer-base", vocab_size=97, d_model=64, n_heads=4, max_seq_len=64,
                                     n_layers=1, n_decoder_layers=1, d_ff=64)).eval()
    with pytest.raises(InputError, match="speculative decoding needs decoder-only models; the target has "
                                         "architecture='encoder-decoder'"):
        anatomy.generate(seq2seq, [1, 2, 3], max_new_tokens=4, speculative="ngram")
    with pytest.raises(InputError, match="the draft has architecture='encoder-decoder'"):
        anatomy.generate(tiny(), [1, 2, 3], max_new_tokens=4, speculative="draft", draft_model=seq2seq)
    encoder = build_model(get_preset("bert-base", vocab_size=97, d_model=64, n_heads=4, max_seq_len=64, n_layers=1,
                                     d_ff=64)).eval()
    with pytest.raises(InputError, match="generation needs a decoder or encoder-decoder model"):
        anatomy.generate(encoder, [1, 2, 3], max_new_tokens=4, speculative="ngram")


def test_a_speculation_object_and_its_rules():
    with pytest.raises(InputError, match="a draft_model is for speculative='draft'"):
        Speculation(method="ngram", draft=DecoderEngine(tiny()))
    with pytest.raises(InputError, match="give draft_model and num_speculative_tokens inside the Speculation"):
        anatomy.generate(tiny(), [1, 2], max_new_tokens=2, speculative=Speculation(method="ngram"),
                         num_speculative_tokens=3)
    with pytest.raises(InputError, match=r"draft layers=0 must be an integer in \[1, 2\]"):
        first_layers(tiny(), 0)
    result = anatomy.generate(tiny(), [1, 2, 1, 2, 1], max_new_tokens=6,
                              speculative=Speculation(method="ngram", adaptive=False, ngram=(2, 2)))
    assert result.speculative.method == "ngram" and result.speculative.tokens == 5


def test_first_layers_shares_the_weights_and_leaves_the_model_alone():
    model = tiny()
    draft = first_layers(model, 1)
    assert len(draft.stack.blocks) == 1 and len(model.stack.blocks) == 2 and draft.config.n_layers == 1
    assert draft.lm_head.weight is model.lm_head.weight and draft.stack.blocks[0].attn.qkv.weight is \
        model.stack.blocks[0].attn.qkv.weight
