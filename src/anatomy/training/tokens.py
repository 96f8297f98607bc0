"""The tokenizer a training run uses, seen through one small interface.

Two sources: `chars` (every character of the corpus is a token, after four specials), or whatever
`anatomy.load_tokenizer` reads (a named model, a model directory, a .gguf, a tokenizer.json). Each is a
`tokenizers.Tokenizer` underneath, so a run directory always holds a tokenizer.json that any
tokenizer library can read back.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

CHAR_SPECIALS = ("<pad>", "<s>", "</s>", "<mask>")
_ROLE_CANDIDATES = {
    "pad": ("<pad>", "[PAD]", "<|pad|>"),
    "bos": ("<s>", "[CLS]", "<|im_start|>", "<|endoftext|>", "<|begin_of_text|>"),
    "eos": ("</s>", "[SEP]", "<|im_end|>", "<|endoftext|>", "<|end_of_text|>"),
    "mask": ("<mask>", "[MASK]"),
}


@dataclass(frozen=True)
class TrainTokenizer:
    """A `tokenizers.Tokenizer` with the special-token roles training needs (None when absent)."""

    tokenizer: Tokenizer
    name: str
    pad_id: int | None
    bos_id: int | None
    eos_id: int | None
    mask_id: int | None

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def special_ids(self) -> tuple[int, ...]:
        """Ids of every special token (never masked, never a sampling target worth decoding)."""
        return tuple(sorted(i for i, t in self.tokenizer.get_added_tokens_decoder().items() if t.special))

    @property
    def identity(self) -> str:
        """A hash of the whole tokenizer definition: part of the data cache key."""
        return hashlib.sha256(self.tokenizer.to_str().encode()).hexdigest()[:16]

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def save(self, path: Path) -> None:
        self.tokenizer.save(str(path))


def char_tokenizer(text_chars: Iterable[str]) -> TrainTokenizer:
    """Every distinct character is one token (sorted), after <pad> <s> </s> <mask> (ids 0-3)."""
    chars = sorted(set(text_chars) - set(CHAR_SPECIALS))
    vocab = {t: i for i, t in enumerate([*CHAR_SPECIALS, *chars])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one piece per character
    tok.decoder = decoders.Fuse()  # join the pieces without spaces
    tok.add_special_tokens(list(CHAR_SPECIALS))
    return wrap(tok, name="chars")


def load_train_tokenizer(spec: str) -> TrainTokenizer:
    """A named tokenizer, a model directory, a .gguf or a tokenizer.json (`anatomy.load_tokenizer`);
    "chars" is built from the corpus by the caller."""
    import anatomy

    loaded = anatomy.load_tokenizer(spec)
    return wrap(loaded.backend, name=str(spec), known=loaded.special_tokens)


def wrap(tok: Tokenizer, *, name: str, known: dict[str, str] | None = None) -> TrainTokenizer:
    """The pad/bos/eos/mask roles: as the tokenizer's config names them, else by usual spellings."""
    roles = {role: _first_id(tok, ((known or {}).get(role), *names)) for role, names in _ROLE_CANDIDATES.items()}
    return TrainTokenizer(tokenizer=tok, name=name, pad_id=roles["pad"], bos_id=roles["bos"],
                          eos_id=roles["eos"], mask_id=roles["mask"])


def _first_id(tok: Tokenizer, names: tuple[str | None, ...]) -> int | None:
    for name in names:
        token_id = tok.token_to_id(name) if name else None
        if token_id is not None:
            return token_id
    return None
