"""anatomy.embed against sentence-transformers and HF BertModel + mean pooling, on the same files."""

from __future__ import annotations

import pytest
import torch

import anatomy
from anatomy.errors import InputError
from anatomy.inference.embed import load_embedder

TEXTS = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome!",
    "机器学习是人工智能的一个分支。",
    "Emoji 😀👍🏽 and naïve café",
    "",
    "long " * 400,  # past the 256 word pieces of sentence_bert_config.json: truncated
    "Short.",
]


@pytest.fixture(scope="module")
def minilm_dir():
    from anatomy.checkpoints.registry import resolve

    return resolve("all-minilm-l6-v2")


@pytest.fixture(scope="module")
def ours():
    return anatomy.embed(TEXTS, batch_size=3)  # [N, 384]


@pytest.mark.slow
def test_matches_sentence_transformers(minilm_dir, ours):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(minilm_dir), device="cpu")
    assert st.max_seq_length == 256
    theirs = st.encode(TEXTS, convert_to_tensor=True, normalize_embeddings=True)
    assert ours.shape == theirs.shape == (len(TEXTS), 384)
    cosine = torch.nn.functional.cosine_similarity(ours, theirs, dim=-1)
    assert cosine.min() >= 0.99999, cosine
    assert torch.allclose(ours, theirs, atol=1e-5)


@pytest.mark.slow
def test_matches_hf_bert_mean_pooling(minilm_dir, ours):
    from transformers import BertModel, BertTokenizerFast

    model = BertModel.from_pretrained(str(minilm_dir)).eval()
    tokenizer = BertTokenizerFast.from_pretrained(str(minilm_dir))
    batch = tokenizer(TEXTS, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state  # [N, S, 384]
    mask = batch["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    theirs = torch.nn.functional.normalize(pooled, dim=-1)
    cosine = torch.nn.functional.cosine_similarity(ours, theirs, dim=-1)
    assert cosine.min() >= 0.99999, cosine
    assert torch.allclose(ours, theirs, atol=1e-5)


def test_batched_with_padding_equals_one_at_a_time(ours):
    alone = torch.cat([anatomy.embed([t]) for t in TEXTS])
    assert torch.allclose(ours, alone, atol=1e-5)
    assert torch.allclose(ours.norm(dim=-1), torch.ones(len(TEXTS)), atol=1e-6)


def test_loaded_pair_and_cache(ours):
    encoder, tokenizer, _ = load_embedder("all-minilm-l6-v2")
    raw = anatomy.embed(TEXTS[:3], model=(encoder, tokenizer), normalize=False)
    assert torch.allclose(torch.nn.functional.normalize(raw, dim=-1), ours[:3], atol=1e-6)
    assert not torch.allclose(raw.norm(dim=-1), torch.ones(3))
    anatomy.embed("one string is one text")
    assert ("embed", "all-minilm-l6-v2") in anatomy.loaded_models.keys()
    assert load_embedder("all-minilm-l6-v2")[0] is encoder  # kept, not loaded again


def test_similar_sentences_are_closer(ours):
    similarity = ours @ ours.T  # [N, N] cosine
    assert similarity[0, 1] > 0.7 > similarity[0, 2]


@pytest.mark.parametrize("texts, kwargs, match", [
    ([], {}, "non-empty list"),
    (["ok", 3], {}, "text 1 is not a string"),
    (["ok"], {"batch_size": 0}, "batch_size must be a positive integer"),
    (["ok"], {"model": 42}, "model must be a name"),
])
def test_bad_input_is_input_error(texts, kwargs, match):
    with pytest.raises(InputError, match=match):
        anatomy.embed(texts, **kwargs)


def test_decoder_model_is_refused():
    decoder = anatomy.build_model(anatomy.get_preset("gpt2"), device="meta")
    _, tokenizer, _ = load_embedder("all-minilm-l6-v2")
    with pytest.raises(InputError, match="need an encoder model"):
        anatomy.embed(["x"], model=(decoder, tokenizer))
