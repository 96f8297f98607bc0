"""anatomy.embed against sentence-transformers and HF BertModel + mean pooling, on the same files."""

from __future__ import annotations

import pytest
import torch

import anatomy
from anatomy.errors import CheckpointError, InputError
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
    return anatomy.embed("all-minilm-l6-v2", TEXTS, batch_size=3)  # [N, 384]


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
    alone = torch.cat([anatomy.embed("all-minilm-l6-v2", [t]) for t in TEXTS])
    assert torch.allclose(ours, alone, atol=1e-5)
    assert torch.allclose(ours.norm(dim=-1), torch.ones(len(TEXTS)), atol=1e-6)


def test_loaded_pair_and_cache(ours):
    encoder, tokenizer, _ = load_embedder("all-minilm-l6-v2")
    raw = anatomy.embed((encoder, tokenizer), TEXTS[:3], normalize=False)
    assert torch.allclose(torch.nn.functional.normalize(raw, dim=-1), ours[:3], atol=1e-6)
    assert not torch.allclose(raw.norm(dim=-1), torch.ones(3))
    anatomy.embed("all-minilm-l6-v2", "one string is one text")
    assert ("embed", "all-minilm-l6-v2") in anatomy.loaded_models.keys()
    assert load_embedder("all-minilm-l6-v2")[0] is encoder  # kept, not loaded again


def test_similar_sentences_are_closer(ours):
    similarity = ours @ ours.T  # [N, N] cosine
    assert similarity[0, 1] > 0.7 > similarity[0, 2]


def test_model_first_by_position_or_keyword():
    by_position = anatomy.embed("all-minilm-l6-v2", TEXTS[:2])
    assert torch.equal(anatomy.embed("all-minilm-l6-v2", texts=TEXTS[:2]), by_position)
    assert torch.equal(anatomy.embed(model="all-minilm-l6-v2", texts=TEXTS[:2]), by_position)


@pytest.mark.parametrize("call, form", [
    (lambda: anatomy.embed(TEXTS[:2]), r"embed\(texts\) is deprecated"),
    (lambda: anatomy.embed(TEXTS[:2], model="all-minilm-l6-v2"), r"embed\(texts, model=...\) is deprecated"),
    (lambda: anatomy.embed(TEXTS[:2], "all-minilm-l6-v2"), r"embed\(texts, model\) is deprecated"),
    (lambda: anatomy.embed(TEXTS[0], "all-minilm-l6-v2"), r"embed\(texts, model\) is deprecated"),
    (lambda: anatomy.embed(texts=TEXTS[:2]), r"embed\(texts\) is deprecated"),
])
def test_old_texts_first_calls_still_work_with_a_deprecation_warning(ours, call, form):
    with pytest.deprecated_call(match=form + r", use anatomy.embed\(model, texts\)"):
        vectors = call()
    assert torch.allclose(vectors, ours[:len(vectors)], atol=1e-6)


@pytest.mark.parametrize("args, kwargs, match", [
    (("all-minilm-l6-v2", []), {}, "non-empty list"),
    (("all-minilm-l6-v2", ["ok", 3]), {}, "text 1 is not a string"),
    (("all-minilm-l6-v2", ["ok"]), {"batch_size": 0}, "batch_size must be a positive integer"),
    ((42, ["ok"]), {}, "model must be a name"),
    (("all-minilm-l6-v2",), {"text": ["ok"]}, "embed\\(\\) has no argument 'text'"),
    ((), {"model": "all-minilm-l6-v2"}, "takes the model, then the texts"),
    (("all-minilm-l6-v2", ["ok"]), {"texts": ["ok"]}, "takes the model, then the texts"),
])
def test_bad_input_is_input_error(args, kwargs, match):
    with pytest.raises(InputError, match=match):
        anatomy.embed(*args, **kwargs)


def test_decoder_model_is_refused():
    decoder = anatomy.build_model(anatomy.get_preset("gpt2"), device="meta")
    _, tokenizer, _ = load_embedder("all-minilm-l6-v2")
    with pytest.raises(InputError, match="need an encoder model"):
        anatomy.embed((decoder, tokenizer), ["x"])


@pytest.mark.parametrize("content, message", [
    (b"[256]", "sentence_bert_config.json: expected a JSON object, got list"),
    (b"{\xff", "sentence_bert_config.json: not valid UTF-8 JSON"),
    (b'{"max_seq_length": 100000}', r"max_seq_length=100000 must be an integer in \[3, 512\]"),
])
def test_bad_sentence_bert_config_is_a_checkpoint_error(tmp_path, minilm_dir, content, message):
    for f in minilm_dir.iterdir():
        if f.is_file() and f.name != "sentence_bert_config.json":
            (tmp_path / f.name).symlink_to(f)
    (tmp_path / "sentence_bert_config.json").write_bytes(content)
    with pytest.raises(CheckpointError, match=message):
        anatomy.embed(str(tmp_path), ["x"])
