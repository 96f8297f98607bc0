"""The tokenizers against independent references: HF transformers' tokenizer for SmolLM2 (which HF
builds itself from the same GGUF), llama.cpp's own tokenizer of that GGUF, and HF's
BertTokenizerFast for all-MiniLM-L6-v2."""

from __future__ import annotations

import json

import pytest

import anatomy
from anatomy.errors import CheckpointError, InputError

CORPUS = [
    "",
    "Hello, world! I'm here; they'll say it's fine, don't they?",
    "The quick brown fox jumps over the lazy dog.\nA second line.",
    "机器学习是人工智能的一个分支。你好，世界！",
    "日本語のテキストと한국어 텍스트, и немного кириллицы, وبعض العربية",
    "Emoji: 😀👍🏽 family 👨‍👩‍👧‍👦 flag 🇫🇷 heart ❤️ done",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math letters and e\u0301 combining, naïve café Ünïcödé, zero\u200bwidth",
    "def add(a, b):\n    \"\"\"Add.\"\"\"\n    return a + b\n\n\nclass X:\n\tpass\n",
    '{"key": [1, 2, 3], "nested": {"a": null}}  // trailing comment',
    "int main(void) { printf(\"%d\\n\", x << 2); return 0; }",
    " " * 50 + "spaces" + " " * 17 + "end" + " " * 9,
    "\n\n\n\t\t  \r\n \u3000 mixed whitespace\t\t\n",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text <repo_name>x<file_sep>y",
    "not special: <|im_start <im_end|> <|im_end |>",
    "Version 3.14159 on 2026-11-30 costs $1,000,000.",
    "replacement char \ufffd literal and a lone \x00 nul",
]

# whitespace runs before digits: SmolLM2's GGUF names the `smollm` pre-tokenizer (every digit split
# off first, as the original tokenizer.json's Digits step does). HF's GGUF converter ignores
# tokenizer.ggml.pre, so on these texts HF's ids differ from llama.cpp's; anatomy follows llama.cpp.
DIGITS_AFTER_SPACES = ["a   1", "x    123  456\n\n  7", "return x  +  1", "col1\t\t22\n    333"]


@pytest.fixture(scope="module")
def llama_cpp_vocab(smollm2_gguf_path):
    llama_cpp = pytest.importorskip("llama_cpp")
    return llama_cpp.Llama(str(smollm2_gguf_path), vocab_only=True, verbose=False)


@pytest.mark.slow
@pytest.mark.parametrize("text", CORPUS)
def test_smollm2_ids_and_decode_match_hf(smollm2_tokenizer, hf_smollm2_tokenizer, text):
    ids = smollm2_tokenizer.encode(text)
    assert ids == hf_smollm2_tokenizer.encode(text, add_special_tokens=True)
    assert smollm2_tokenizer.decode(ids) == hf_smollm2_tokenizer.decode(ids) == text
    assert (smollm2_tokenizer.decode(ids, skip_special_tokens=True)
            == hf_smollm2_tokenizer.decode(ids, skip_special_tokens=True))


@pytest.mark.slow
def test_smollm2_decode_of_split_utf8_matches_hf(smollm2_tokenizer, hf_smollm2_tokenizer):
    """Every prefix of the ids of multi-byte text, most ending inside a character (U+FFFD there)."""
    for text in CORPUS[3:7]:
        ids = smollm2_tokenizer.encode(text)
        for end in range(len(ids) + 1):
            assert smollm2_tokenizer.decode(ids[:end]) == hf_smollm2_tokenizer.decode(ids[:end])
    assert "\ufffd" in smollm2_tokenizer.decode(smollm2_tokenizer.encode("😀")[:1])


@pytest.mark.parametrize("text", CORPUS + DIGITS_AFTER_SPACES)
def test_smollm2_ids_match_llama_cpp(smollm2_tokenizer, llama_cpp_vocab, text):
    expected = llama_cpp_vocab.tokenize(text.encode(), add_bos=False, special=True)
    assert smollm2_tokenizer.encode(text) == expected
    assert smollm2_tokenizer.decode(expected) == text


def test_smollm2_special_tokens(smollm2_tokenizer, hf_smollm2_tokenizer):
    tok = smollm2_tokenizer
    assert tok.vocab_size == len(hf_smollm2_tokenizer) == 49152
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (
        hf_smollm2_tokenizer.bos_token_id, hf_smollm2_tokenizer.eos_token_id, hf_smollm2_tokenizer.pad_token_id)
    assert tok.id_to_token(tok.eos_id) == "<|im_end|>"
    assert tok.eos_ids == {tok.token_to_id("<|im_end|>")}
    assert tok.encode("<|im_start|>") == [1]
    assert tok.decode(tok.encode("<|im_start|>user\nHi<|im_end|>"), skip_special_tokens=True) == "user\nHi"


def test_batch_versions_equal_single(smollm2_tokenizer):
    tok = smollm2_tokenizer
    batch = tok.encode_batch(CORPUS)
    assert batch == [tok.encode(t) for t in CORPUS]
    assert tok.decode_batch(batch) == CORPUS


def test_minilm_ids_match_bert_tokenizer_fast(minilm_dir):
    from transformers import BertTokenizerFast

    hf = BertTokenizerFast.from_pretrained(str(minilm_dir))
    tok = anatomy.load_tokenizer("all-minilm-l6-v2")
    long_text = "word " * 600  # longer than the 128 tokens of truncation stored in tokenizer.json
    for text in CORPUS + [long_text, "UNAFFABLE Tokenization of HuggingFace's BERT"]:
        assert tok.encode(text) == hf(text)["input_ids"]
        assert tok.encode(text, add_special_tokens=False) == hf(text, add_special_tokens=False)["input_ids"]
    truncated = tok.encode_batch([long_text], max_length=256)[0]
    assert truncated == hf(long_text, truncation=True, max_length=256)["input_ids"]
    assert (tok.pad_id, tok.token_to_id("[CLS]")) == (hf.pad_token_id, hf.cls_token_id)


def test_bad_input_is_input_error(smollm2_tokenizer):
    with pytest.raises(InputError, match="not in"):
        smollm2_tokenizer.decode([1, 49152])
    with pytest.raises(InputError, match="not valid Unicode"):
        smollm2_tokenizer.encode("lone surrogate \ud800")
    with pytest.raises(InputError, match="strings"):
        smollm2_tokenizer.encode_batch([b"bytes"])
    with pytest.raises(InputError, match="max_length=0 must be an integer"):
        smollm2_tokenizer.encode_batch(["text"], max_length=0)


def test_missing_or_malformed_tokenizer_json(tmp_path):
    with pytest.raises(CheckpointError, match="no tokenizer.json"):
        anatomy.load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: not a valid tokenizer.json"):
        anatomy.load_tokenizer(tmp_path)
    with pytest.raises(CheckpointError, match="tokenizer.json"):
        anatomy.load_tokenizer(tmp_path / "tokenizer.json")


def test_tokenizer_config_special_tokens_and_template(tmp_path, minilm_dir):
    (tmp_path / "tokenizer.json").write_text((minilm_dir / "tokenizer.json").read_text())
    config = {"bos_token": {"content": "[CLS]"}, "eos_token": "[SEP]",
              "chat_template": [{"name": "default", "template": "{{ bos_token }}{{ messages[0]['content'] }}"}]}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = anatomy.load_tokenizer(tmp_path)
    assert (tok.bos_id, tok.eos_id) == (101, 102)
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "[CLS]hi"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<not-a-token>"}))
    with pytest.raises(CheckpointError, match="eos_token '<not-a-token>' is not in the vocabulary"):
        anatomy.load_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{oops")
    with pytest.raises(CheckpointError, match="tokenizer_config.json: not valid JSON"):
        anatomy.load_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{}")
    (tmp_path / "chat_template.jinja").write_bytes(b"{{ bos_token }}\xff")
    with pytest.raises(CheckpointError, match="chat_template.jinja: not UTF-8 text"):
        anatomy.load_tokenizer(tmp_path)


@pytest.fixture(scope="module")
def minilm_dir():
    from anatomy.checkpoints.registry import resolve

    return resolve("all-minilm-l6-v2")


def test_training_roles_mask_and_special_ids_against_bert_tokenizer_fast(minilm_dir):
    """MiniLM's config names [CLS]/[SEP] as cls/sep, not bos/eos: with_usual_roles adds the roles
    training needs from the usual spellings and keeps those the config names."""
    from transformers import BertTokenizerFast

    hf = BertTokenizerFast.from_pretrained(str(minilm_dir))
    tok = anatomy.load_tokenizer("all-minilm-l6-v2")
    assert tok.bos_id is None and tok.mask_id == hf.mask_token_id
    roles = tok.with_usual_roles()
    assert (roles.bos_id, roles.eos_id, roles.pad_id, roles.mask_id) == (
        hf.cls_token_id, hf.sep_token_id, hf.pad_token_id, hf.mask_token_id)
    assert roles.special_ids == tuple(sorted(hf.all_special_ids))
    assert roles.encode("a cat") == tok.encode("a cat")


def test_save_round_trip_keeps_vocabulary_roles_template_and_identity(tmp_path, smollm2_tokenizer):
    tok = smollm2_tokenizer
    again = anatomy.load_tokenizer(tok.save(tmp_path))
    assert again.special_tokens == tok.special_tokens
    assert again.chat_template.text == tok.chat_template.text
    assert again.identity == tok.identity
    assert again.encode_batch(CORPUS) == tok.encode_batch(CORPUS)
    assert tok.with_usual_roles().identity == tok.identity  # SmolLM2 names every role it has
    assert anatomy.load_tokenizer("all-minilm-l6-v2").with_usual_roles().identity != \
        anatomy.load_tokenizer("all-minilm-l6-v2").identity
