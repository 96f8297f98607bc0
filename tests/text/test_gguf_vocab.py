"""Tokenizers rebuilt from GGUF metadata, checked against llama.cpp's tokenizer of the same file.

SmolLM2's vocabulary is written to vocab-only GGUF files (by gguf-py's writer) naming each
supported pre-tokenizer in turn; llama.cpp loads each file and tokenizes the texts its own way."""

from __future__ import annotations

import numpy as np
import pytest

import anatomy
from anatomy.errors import CheckpointError
from anatomy.text.gguf_vocab import tokenizer_from_gguf

TEXTS = [
    "Hello 12345 world, I'M here: they'll GO's",
    "x    123  456\n\n  7 and a1b22c333 and 1234567",
    "def f(x):\n    return x  +  1\n\n\n",
    "你好，世界 😀👍🏽 \r\n\r\n  x",
    "...!!!\n\n\nabc  \n  def $x+=<y>^~|z",
    "price: $1,234.56 (approx.) <|im_start|>user<|im_end|>",
]


@pytest.fixture(scope="module")
def smollm2_gguf(smollm2_gguf_path):
    from anatomy.checkpoints.gguf_reader import read_gguf

    return read_gguf(smollm2_gguf_path)


def _write_vocab_gguf(path, source, **changes):
    """A GGUF holding `source`'s metadata (no tensors), with `changes` applied (None removes a key)."""
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(path), source.metadata["general.architecture"])
    for key, value in {**source.metadata, **changes}.items():
        if key == "general.architecture" or value is None:
            continue
        if isinstance(value, (list, np.ndarray)):
            writer.add_array(key, value.tolist() if isinstance(value, np.ndarray) else list(value))
        elif key in changes and isinstance(value, bool):
            writer.add_bool(key, value)
        elif key in changes:
            writer.add_string(key, value)
        else:
            writer.add_key_value(key, value, gguf.GGUFValueType(int(source.value_types[key][0])))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("pre, add_bos", [("smollm", False), ("gpt-2", False), ("llama-bpe", True),
                                          (None, False)])
def test_pre_tokenizers_match_llama_cpp(tmp_path, smollm2_gguf, pre, add_bos):
    llama_cpp = pytest.importorskip("llama_cpp")
    path = _write_vocab_gguf(tmp_path / "vocab.gguf", smollm2_gguf,
                             **{"tokenizer.ggml.pre": pre, "tokenizer.ggml.add_bos_token": add_bos})
    reference = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    tok = anatomy.load_tokenizer(path)
    for text in TEXTS:
        expected = reference.tokenize(text.encode(), add_bos=True, special=True)
        assert tok.encode(text) == expected, (pre, text)
        assert (expected[0] == tok.bos_id) == add_bos
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_user_defined_tokens_match_llama_cpp(tmp_path, smollm2_gguf):
    """A user-defined token (type 4) is cut out of raw text whole, before pre-tokenization."""
    llama_cpp = pytest.importorskip("llama_cpp")
    types = np.array(smollm2_gguf.metadata["tokenizer.ggml.token_type"])
    hello = smollm2_gguf.metadata["tokenizer.ggml.tokens"].index("hello")
    types[hello] = 4
    path = _write_vocab_gguf(tmp_path / "vocab.gguf", smollm2_gguf, **{"tokenizer.ggml.token_type": types})
    reference = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    tok = anatomy.load_tokenizer(path)
    text = "xhellox sayhello, hello"
    ids = tok.encode(text)
    assert ids == reference.tokenize(text.encode(), add_bos=False, special=False)
    assert ids.count(hello) == 3 and tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == text  # added, not special


def test_the_pre_tokenizers_differ(smollm2_gguf):
    """The test above would not notice a wrong pre-tokenizer if they all cut text alike."""
    text = TEXTS[1] + TEXTS[4]
    ids = {pre: tokenizer_from_gguf({**smollm2_gguf.metadata, "tokenizer.ggml.pre": pre}, source="t").encode(text).ids
           for pre in ("smollm", "gpt-2", "llama-bpe", "default")}
    assert len({tuple(v) for v in ids.values()}) == 4


@pytest.mark.parametrize("changes, match", [
    ({"tokenizer.ggml.pre": "qwen9"}, r"tokenizer.ggml.pre='qwen9' is not supported \(supported: default, "),
    ({"tokenizer.ggml.model": "bert"}, r"tokenizer.ggml.model='bert' is not supported"),
    ({"tokenizer.ggml.tokens": None}, "tokenizer.ggml.tokens must be an array of strings"),
    ({"tokenizer.ggml.merges": ["a b c"]}, r"tokenizer.ggml.merges\[0\]='a b c' is not 'left right'"),
    ({"tokenizer.ggml.token_type": [1, 2]}, "token_type has 2 entries, tokenizer.ggml.tokens has 49152"),
    ({"tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.bos_token_id": None}, "bos_token_id is missing"),
    ({"tokenizer.ggml.eos_token_id": 10**9}, "eos_token_id=1000000000 is not a token id in"),
])
def test_bad_metadata_is_checkpoint_error(smollm2_gguf, changes, match):
    meta = {k: v for k, v in {**smollm2_gguf.metadata, **changes}.items() if v is not None}
    with pytest.raises(CheckpointError, match=match):
        tokenizer_from_gguf(meta, source="bad.gguf")


# -- SentencePiece vocabularies (tokenizer.ggml.model = "llama") -------------------------------------
SPM_TEXTS = ["Hello world, the model loads!", "  two  spaces and\nnewlines\n\n", "emoji 😀 and 你好 not in vocab",
             "<s>special</s> and <|user|>user-defined", 'anatomy.load("x.gguf") -> DecoderLM', " leading space", ""]


@pytest.fixture(scope="module")
def spm_vocab(tmp_path_factory):
    """A SentencePiece-style vocabulary: pieces learned by BPE on this project's docs ("▁" for spaces,
    scores falling with the merge order), the 256 byte tokens, <unk> <s> </s>, one user-defined token."""
    gguf = pytest.importorskip("gguf")
    from pathlib import Path

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    root = Path(__file__).resolve().parents[2]
    corpus = (root / "README.md").read_text().splitlines() + (root / "docs" / "foundation.md").read_text().splitlines()
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=600, show_progress=False))
    pieces = [p for p, _ in sorted(bpe.get_vocab().items(), key=lambda kv: kv[1])]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces + ["<|user|>"]
    path = tmp_path_factory.mktemp("spm") / "vocab.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * 259 + [-float(i) for i in range(len(pieces))] + [0.0])
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * len(pieces) + [4])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_sentencepiece_vocabulary_matches_llama_cpp(spm_vocab):
    """Merges by score, byte fallback for what the pieces lack, "▁" prefix, BOS by default, special and
    user-defined tokens cut out whole: token for token what llama.cpp's tokenizer gives."""
    llama_cpp = pytest.importorskip("llama_cpp")
    reference = llama_cpp.Llama(str(spm_vocab), vocab_only=True, verbose=False)
    tok = anatomy.load_tokenizer(spm_vocab)
    for text in SPM_TEXTS:
        assert tok.encode(text) == reference.tokenize(text.encode(), add_bos=True, special=True), text
    assert tok.bos_id == 1 and tok.encode("")[0] == 1
    assert len(tok.encode("😀", add_special_tokens=False)) == 5  # "▁" + the emoji's 4 UTF-8 bytes
    for text in SPM_TEXTS[:3] + SPM_TEXTS[4:]:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
