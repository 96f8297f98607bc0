"""The character-level training tokenizer: one id per character, the four specials first, and a
tokenizer.json the `tokenizers` library reads back to the same ids."""

from __future__ import annotations

import tokenizers

import anatomy
from anatomy.text.chars import chars_tokenizer

TEXT = "To be, or not to be: 日本 😀\n\tthat is the question."


def test_one_id_per_character_after_the_specials():
    tok = chars_tokenizer(TEXT)
    chars = sorted(set(TEXT))
    assert tok.vocab_size == 4 + len(chars)
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.mask_id) == (0, 1, 2, 3) and tok.special_ids == (0, 1, 2, 3)
    ids = tok.encode(TEXT, add_special_tokens=False)
    assert ids == [4 + chars.index(c) for c in TEXT]
    assert tok.decode(ids) == TEXT
    assert tok.decode([1, *ids[:2], 2], skip_special_tokens=True) == "To"


def test_saved_files_read_back_by_tokenizers_and_by_anatomy(tmp_path):
    tok = chars_tokenizer(TEXT)
    tok.save(tmp_path)
    assert tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json")).encode(TEXT).ids == tok.encode(TEXT)
    again = anatomy.load_tokenizer(tmp_path)
    assert again.special_tokens == tok.special_tokens and again.identity == tok.identity


def test_identity_follows_the_vocabulary():
    assert chars_tokenizer("abc").identity == chars_tokenizer("cab").identity
    assert chars_tokenizer("abc").identity != chars_tokenizer("abd").identity
