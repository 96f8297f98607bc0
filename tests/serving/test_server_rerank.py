"""`anatomy serve`'s /v1/rerank, /v1/score and decoder embeddings, against HF transformers on the same
random weights (fp32): a BertForSequenceClassification cross-encoder (one label), a Qwen3ForCausalLM
used as Qwen3-Reranker is (P(yes) after its prompt) and pooled for embeddings (last token, mean).
Rerank and score through httpx, embeddings through the openai client; bad input gets a 400 naming
the field."""

from __future__ import annotations

import json
import shutil

import httpx
import numpy as np
import openai
import pytest
import torch

from .conftest import Server

pytestmark = pytest.mark.slow
QUERY = "What is the capital of France?"
DOCS = ["Paris is the capital of France.", "The cat sat on the mat.", "Berlin is in Germany.",
        "France's capital city, Paris, lies on the Seine.", "Bananas are yellow."]
TEXTS = ["a cat", "the capital of France is Paris", "x"]


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    """A random one-label BertForSequenceClassification with all-MiniLM-L6-v2's tokenizer files."""
    import transformers

    from anatomy.checkpoints.source import find_model

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=128, num_labels=1)
    model = transformers.BertForSequenceClassification(config).eval()
    for layer in (model.bert.pooler.dense, model.classifier):  # logits that differ by order 1, not 0.001
        torch.nn.init.normal_(layer.weight, std=1.0)
    path = tmp_path_factory.mktemp("cross-encoder")
    model.save_pretrained(path)
    source = find_model("all-minilm-l6-v2").checkpoint("tests")
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(source / name, path / name)
    return path


@pytest.fixture(scope="module")
def qwen3_dir(smollm2_tokenizer, tmp_path_factory):
    """A random Qwen3ForCausalLM of SmolLM2's vocabulary, with its tokenizer."""
    import transformers

    torch.manual_seed(0)
    config = transformers.Qwen3Config(vocab_size=smollm2_tokenizer.vocab_size, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                      max_position_embeddings=512, tie_word_embeddings=False)
    model = transformers.Qwen3ForCausalLM(config).eval()
    torch.nn.init.normal_(model.lm_head.weight, std=1.0)
    path = tmp_path_factory.mktemp("qwen3")
    model.save_pretrained(path)
    smollm2_tokenizer.save(path)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"  # what HF's AutoTokenizer needs of a bare tokenizer.json
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def hf(path, kind):
    import transformers

    model = getattr(transformers, kind).from_pretrained(path, torch_dtype=torch.float32).eval()
    return model, transformers.AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def decoder_server(qwen3_dir):
    """The Qwen3 model as its own reranker (yes/no) and embedder (last token)."""
    s = Server("--model", str(qwen3_dir), "--weights", "f32", "--kv-memory", "16MiB", "--embedding-model", "self",
               "--rerank-model", "self")
    yield s
    s.close()


@pytest.fixture(scope="module")
def cross_server(qwen3_dir, bert_dir):
    """The Qwen3 model embedding by its mean, the BERT cross-encoder reranking."""
    s = Server("--model", str(qwen3_dir), "--weights", "f32", "--kv-memory", "16MiB", "--embedding-model", "self",
               "--embedding-pooling", "mean", "--rerank-model", str(bert_dir))
    yield s
    s.close()


def post(server, path, body):
    return httpx.post(f"{server.url}{path}", json=body, timeout=60)


# -- references: HF transformers ----------------------------------------------------------------

def cross_encoder_logits(bert_dir, query, docs) -> list[float]:
    model, tok = hf(bert_dir, "BertForSequenceClassification")
    batch = tok([query] * len(docs), docs, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(**batch).logits[:, 0].tolist()


def qwen3_reranker_scores(qwen3_dir, query, docs, instruction) -> list[float]:
    """Qwen3-Reranker's model card: prefix + tokenized pair + suffix, P(yes) against "no" at the end."""
    model, tok = hf(qwen3_dir, "Qwen3ForCausalLM")
    prefix = ('<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the '
              'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n')
    suffix = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    scores = []
    for doc in docs:
        pair = f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}"
        ids = tok.encode(prefix, add_special_tokens=False) + tok(pair)["input_ids"] + \
            tok.encode(suffix, add_special_tokens=False)
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1]
        scores.append(torch.stack([logits[no], logits[yes]]).log_softmax(-1)[1].exp().item())
    return scores


def qwen3_embeddings(qwen3_dir, inputs, pooling) -> np.ndarray:
    model, tok = hf(qwen3_dir, "Qwen3ForCausalLM")
    out = []
    for x in inputs:
        ids = tok(x)["input_ids"] if isinstance(x, str) else x
        with torch.no_grad():
            hidden = model.model(torch.tensor([ids])).last_hidden_state[0]  # [S, D], after the final norm
        vector = hidden[-1] if pooling == "last" else hidden.mean(0)
        out.append(torch.nn.functional.normalize(vector, dim=-1).numpy())
    return np.stack(out)


def cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a), np.asarray(b)
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


# -- rerank and score -----------------------------------------------------------------------------

def test_cross_encoder_rerank_equals_hf(cross_server, bert_dir):
    logits = cross_encoder_logits(bert_dir, QUERY, DOCS)
    expected = torch.sigmoid(torch.tensor(logits)).tolist()  # vLLM's default activation for one label
    r = post(cross_server, "/v1/rerank", {"model": str(bert_dir), "query": QUERY,
                                          "documents": [DOCS[0], *({"text": d} for d in DOCS[1:])]})
    assert r.status_code == 200, r.text
    body = r.json()
    order = sorted(range(len(DOCS)), key=lambda i: -expected[i])
    assert [x["index"] for x in body["results"]] == order
    for x in body["results"]:
        assert abs(x["relevance_score"] - expected[x["index"]]) < 1e-4
        assert x["document"] == {"text": DOCS[x["index"]]}
    assert body["model"] == str(bert_dir) and body["usage"]["total_tokens"] > 0
    raw = post(cross_server, "/rerank", {"query": QUERY, "documents": DOCS, "top_n": 2, "return_documents": False,
                                         "activation": False}).json()
    assert [x["index"] for x in raw["results"]] == order[:2] and "document" not in raw["results"][0]
    assert np.allclose([x["relevance_score"] for x in raw["results"]], [logits[i] for i in order[:2]], atol=1e-4)


def test_cross_encoder_score_one_to_many_and_pairwise(cross_server, bert_dir):
    expected = torch.sigmoid(torch.tensor(cross_encoder_logits(bert_dir, QUERY, DOCS[:3]))).tolist()
    one = post(cross_server, "/v1/score", {"text_1": QUERY, "text_2": DOCS[:3]}).json()
    assert [d["index"] for d in one["data"]] == [0, 1, 2] and one["data"][0]["object"] == "score"
    assert np.allclose([d["score"] for d in one["data"]], expected, atol=1e-4)
    pairwise = post(cross_server, "/score", {"text_1": [QUERY] * 3, "text_2": DOCS[:3]}).json()
    assert np.allclose([d["score"] for d in pairwise["data"]], expected, atol=1e-4)
    assert one["usage"]["prompt_tokens"] > 0


def test_decoder_as_yes_no_reranker_equals_hf(decoder_server, qwen3_dir):
    from anatomy.serving.rerank import INSTRUCTION

    expected = qwen3_reranker_scores(qwen3_dir, QUERY, DOCS, INSTRUCTION)
    for path in ("/v1/rerank", "/v2/rerank"):
        body = post(decoder_server, path, {"model": str(qwen3_dir), "query": QUERY, "documents": DOCS}).json()
        assert [x["index"] for x in body["results"]] == sorted(range(len(DOCS)), key=lambda i: -expected[i])
        assert max(abs(x["relevance_score"] - expected[x["index"]]) for x in body["results"]) < 1e-4
    asked = qwen3_reranker_scores(qwen3_dir, QUERY, DOCS[:2], "Find the city")
    score = post(decoder_server, "/v1/score", {"text_1": QUERY, "text_2": DOCS[:2], "instruction": "Find the city"})
    assert np.allclose([d["score"] for d in score.json()["data"]], asked, atol=1e-4)


# -- decoder embeddings ---------------------------------------------------------------------------

@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_decoder_embeddings_equal_hf_pooling(decoder_server, cross_server, qwen3_dir, pooling):
    server = decoder_server if pooling == "last" else cross_server
    client = server.client()
    expected = qwen3_embeddings(qwen3_dir, TEXTS, pooling)
    got = client.embeddings.create(model=str(qwen3_dir), input=TEXTS)  # base64, as the client asks
    assert (cosines([d.embedding for d in got.data], expected) > 1 - 1e-5).all()
    assert np.allclose(np.linalg.norm([d.embedding for d in got.data], axis=-1), 1, atol=1e-5)
    ids = [[5, 6, 7, 8], [100, 200]]
    by_ids = client.embeddings.create(model=str(qwen3_dir), input=ids, encoding_format="float")
    assert (cosines([d.embedding for d in by_ids.data], qwen3_embeddings(qwen3_dir, ids, pooling)) > 1 - 1e-5).all()
    one = client.embeddings.create(model=str(qwen3_dir), input=ids[0], encoding_format="float")
    assert np.allclose(one.data[0].embedding, by_ids.data[0].embedding, atol=1e-6)


def test_dimensions_truncate_then_normalize(decoder_server, qwen3_dir):
    client = decoder_server.client()
    full = np.array(client.embeddings.create(model=str(qwen3_dir), input=TEXTS, encoding_format="float")
                    .data[1].embedding)
    short = client.embeddings.create(model=str(qwen3_dir), input=TEXTS, dimensions=8, encoding_format="float")
    vector = np.array(short.data[1].embedding)
    assert vector.shape == (8,) and np.allclose(vector, full[:8] / np.linalg.norm(full[:8]), atol=1e-6)
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        client.embeddings.create(model=str(qwen3_dir), input="x", dimensions=33)


def test_pooling_beside_generation_changes_neither(decoder_server, qwen3_dir):
    """Embedding and reranking passes run beside the loop's steps: both answers equal their solo ones."""
    from concurrent.futures import ThreadPoolExecutor

    def generate(i):
        body = {"model": str(qwen3_dir), "prompt": f"text {i}", "max_tokens": 32, "temperature": 0, "ignore_eos": True}
        return post(decoder_server, "/v1/completions", body).json()["choices"][0]["text"]

    def pooled(_):
        vectors = post(decoder_server, "/v1/embeddings", {"model": str(qwen3_dir), "input": TEXTS * 4}).json()
        ranked = post(decoder_server, "/v1/rerank", {"query": QUERY, "documents": DOCS}).json()
        return [d["embedding"] for d in vectors["data"]], ranked["results"]

    alone = [generate(i) for i in range(4)], pooled(0)
    with ThreadPoolExecutor(8) as pool:
        texts = pool.map(generate, range(4))
        both = list(pool.map(pooled, range(4)))
    assert list(texts) == alone[0] and all(x == alone[1] for x in both)


# -- bad input ------------------------------------------------------------------------------------

@pytest.mark.parametrize("path, body, param", [
    ("/v1/rerank", {"query": "q", "documents": []}, "documents"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
    ("/v1/rerank", {"query": "q", "documents": [1, 2]}, "documents.0"),
    ("/v1/rerank", {"query": 3, "documents": ["a"]}, "query"),
    ("/v1/rerank", {"documents": ["a"]}, "query"),
    ("/v1/rerank", {"query": "q", "documents": [{"txt": "a"}]}, "documents.0"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": "2"}, "top_n"),
    ("/v1/rerank", {"query": "q", "documents": ["a" * 5000]}, "documents"),
    ("/v1/score", {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, "text_1"),
    ("/v1/score", {"text_1": "a", "text_2": []}, "text_2"),
    ("/v1/embeddings", {"model": "M", "input": [[1, 2], []]}, "input"),
    ("/v1/embeddings", {"model": "M", "input": [10 ** 9]}, "input"),
    ("/v1/embeddings", {"model": "M", "input": ["a", 1]}, "input"),
    ("/v1/embeddings", {"model": "M", "input": "x", "dimensions": 0}, "dimensions"),
    ("/v1/embeddings", {"model": "M", "input": "x", "dimensions": 10 ** 6}, "dimensions"),
])
def test_bad_input_gets_400_naming_the_field(decoder_server, qwen3_dir, path, body, param):
    body = {**body, "model": str(qwen3_dir)} if "model" in body else body
    r = post(decoder_server, path, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
    assert post(decoder_server, "/v1/rerank", {"query": "q", "documents": ["a"]}).status_code == 200


def test_a_server_without_a_reranker_says_so_naming_model(qwen3_dir):
    server = Server("--model", str(qwen3_dir), "--weights", "f32", "--kv-memory", "16MiB", "--embedding-model", "none")
    try:
        for path in ("/v1/rerank", "/v1/score"):
            r = post(server, path, {"query": "q", "documents": ["a"], "text_1": "q", "text_2": "a"})
            assert r.status_code == 400 and r.json()["error"]["param"] == "model", r.text
        r = post(server, "/v1/embeddings", {"model": str(qwen3_dir), "input": "x"})
        assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    finally:
        server.close()


def test_another_model_name_is_404_and_the_cross_encoder_takes_no_instruction(cross_server):
    r = post(cross_server, "/v1/rerank", {"model": "other", "query": "q", "documents": ["a"]})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    r = post(cross_server, "/v1/rerank", {"query": "q", "documents": ["a"], "instruction": "x"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "instruction"
    names = [m["id"] for m in httpx.get(f"{cross_server.url}/v1/models").json()["data"]]
    assert len(names) == 2 and len(set(names)) == 2  # the decoder (also the embedder), the cross-encoder
