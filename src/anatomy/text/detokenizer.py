"""Incremental detokenization for streaming: token ids in, one at a time; text deltas out.

Decoding each new token alone is wrong twice over: a byte-level token may hold only part of a
UTF-8 character (the emoji 😀 is four bytes, often two or more tokens), and some decoders depend
on the previous token (WordPiece's "##ing" glues to it, SentencePiece drops a leading space at
the start of a text). So IncrementalDecoder decodes from an earlier offset into the ids seen so far
and holds back text that ends in U+FFFD (docs/tokenizers.md, "Streaming detokenization").
"""

from __future__ import annotations

from typing import Protocol


class Decodes(Protocol):
    """What the decoder needs of a tokenizer (anatomy.text.tokenizer.Tokenizer has it)."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str: ...

REPLACEMENT = "\ufffd"


class IncrementalDecoder:
    """push(token_id) -> the new text ("" while a character is incomplete); flush() at the end.

    Two offsets into the ids seen so far:

        ids:    ... [prefix ......... read) [read ... end)
                     already emitted text    not yet emitted

    `ids[prefix:]` is decoded; the part beyond the decode of `ids[prefix:read]` is the new text. It is
    held back while it ends in U+FFFD, the mark of a character whose remaining bytes are still to come.
    """

    def __init__(self, tokenizer: Decodes, *, skip_special_tokens: bool = False) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self._prefix = 0  # start of the context decoded with each new token
        self._read = 0  # end of the ids whose text has been emitted

    def push(self, token_id: int) -> str:
        """Add one token id; return the text it completes."""
        self.ids.append(int(token_id))
        emitted, text = self._texts()
        if len(text) <= len(emitted) or text.endswith(REPLACEMENT):
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        return text[len(emitted):]

    def flush(self) -> str:
        """The text still held back (an incomplete character decodes to U+FFFD here)."""
        emitted, text = self._texts()
        self._prefix = self._read = len(self.ids)
        return text[len(emitted):]

    def _texts(self) -> tuple[str, str]:
        decode = self.tokenizer.decode
        emitted = decode(self.ids[self._prefix:self._read], skip_special_tokens=self.skip_special_tokens)
        text = decode(self.ids[self._prefix:], skip_special_tokens=self.skip_special_tokens)
        return emitted, text
