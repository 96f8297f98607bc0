"""A character-level tokenizer built from a corpus: `anatomy train --tokenizer chars`.

    tok = chars_tokenizer("hello world")   ids 0-3: <pad> <s> </s> <mask>; then " ", "d", "e", ...
    tok.encode("hello", add_special_tokens=False)  -> one id per character

It is an ordinary `tokenizers.Tokenizer` underneath (a word-level model over single characters),
so `tok.save(directory)` writes a tokenizer.json any tokenizer library reads back.
"""

from __future__ import annotations

from collections.abc import Iterable

import tokenizers
from tokenizers import Regex, decoders, models, pre_tokenizers

from anatomy.text.tokenizer import Tokenizer

SPECIALS = {"pad": "<pad>", "bos": "<s>", "eos": "</s>", "mask": "<mask>"}


def chars_tokenizer(text_chars: Iterable[str]) -> Tokenizer:
    """Every distinct character is one token (sorted), after <pad> <s> </s> <mask> (ids 0-3)."""
    specials = list(SPECIALS.values())
    chars = sorted(set(text_chars) - set(specials))
    vocab = {t: i for i, t in enumerate([*specials, *chars])}
    backend = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token=None))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one piece per character
    backend.decoder = decoders.Fuse()  # join the pieces without spaces
    backend.add_special_tokens(specials)
    return Tokenizer(backend, source="chars", special_tokens=SPECIALS)
