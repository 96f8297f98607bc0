"""Tokenizers: text <-> token ids, special tokens and the chat template of a model.

    tok = anatomy.load_tokenizer("<model>")   # or a .gguf, a model dir, a tokenizer.json
    tok.encode("Hello")                    -> [19556]
    tok.decode([19556])                    -> "Hello"
    tok.apply_chat_template([{"role": "user", "content": "Hi"}])  -> "<|im_start|>system\\n..."

The work is done by HF's `tokenizers` library; this module builds its Tokenizer from what a
checkpoint ships and keeps the special tokens and chat template next to it (docs/tokenizers.md).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import tokenizers

from anatomy.atomic import atomic_file
from anatomy.text.chat_template import ChatTemplate
from anatomy.text.detokenizer import IncrementalDecoder
from anatomy.errors import CheckpointError, InputError

SPECIAL_ROLES = ("bos", "eos", "unk", "pad", "cls", "sep", "mask")
# how the roles training needs are usually spelled, for a tokenizer whose config does not name them
# (a bare tokenizer.json; BERT's, whose [CLS]/[SEP] open and close every text)
USUAL_SPELLINGS = {
    "pad": ("<pad>", "[PAD]", "<|pad|>"),
    "bos": ("<s>", "[CLS]", "<|im_start|>", "<|endoftext|>", "<|begin_of_text|>"),
    "eos": ("</s>", "[SEP]", "<|im_end|>", "<|endoftext|>", "<|end_of_text|>"),
    "mask": ("<mask>", "[MASK]"),
}
# tokens that end an assistant turn in common chat formats; a generation stops on them when the
# model's chat template writes them
CHAT_END_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")


class Tokenizer:
    """A `tokenizers.Tokenizer` with the model's special tokens and chat template.

    `special_tokens` maps roles ("bos", "eos", "unk", "pad", "cls", "sep", "mask") to token
    strings present in the vocabulary. Padding and truncation stored in a tokenizer.json are
    switched off: callers pad and truncate explicitly (see `encode_batch(max_length=)`).
    `gguf_metadata` holds the `tokenizer.*` metadata of the GGUF file it was read from ({key:
    (value type path, value)}, arrays of strings as read-only sequences; None for other sources):
    `anatomy.save(model, "x.gguf", tokenizer=tok)` writes it back, so that llama.cpp finds its vocabulary.
    """

    def __init__(self, backend: tokenizers.Tokenizer, *, source: str | Path,
                 special_tokens: Mapping[str, str] | None = None, chat_template: str | None = None,
                 gguf_metadata: Mapping[str, Any] | None = None) -> None:
        self.backend = backend
        self.source = str(source)
        self.gguf_metadata = dict(gguf_metadata) if gguf_metadata is not None else None
        backend.no_padding()
        backend.no_truncation()
        self.special_tokens = dict(special_tokens or {})
        for role, token in self.special_tokens.items():
            if backend.token_to_id(token) is None:
                raise CheckpointError(f"{self.source}: {role}_token {token!r} is not in the vocabulary")
        self.chat_template = None
        if chat_template is not None:
            names = {f"{role}_token": token for role, token in self.special_tokens.items()}
            self.chat_template = ChatTemplate(chat_template, source=self.source, special_tokens=names)

    # -- special tokens -------------------------------------------------------------------------

    def _id(self, role: str) -> int | None:
        token = self.special_tokens.get(role)
        return None if token is None else self.backend.token_to_id(token)

    @property
    def bos_id(self) -> int | None:
        return self._id("bos")

    @property
    def eos_id(self) -> int | None:
        return self._id("eos")

    @property
    def pad_id(self) -> int | None:
        return self._id("pad")

    @property
    def unk_id(self) -> int | None:
        return self._id("unk")

    @property
    def mask_id(self) -> int | None:
        return self._id("mask")

    @property
    def special_ids(self) -> tuple[int, ...]:
        """Ids of every special token (masked language modelling never masks them), sorted."""
        return tuple(sorted(i for i, t in self.backend.get_added_tokens_decoder().items() if t.special))

    def with_usual_roles(self) -> Tokenizer:
        """This tokenizer with its missing pad/bos/eos/mask roles taken from the usual spellings in
        its vocabulary (USUAL_SPELLINGS), as training needs them; roles it names stay as they are."""
        special = dict(self.special_tokens)
        for role, spellings in USUAL_SPELLINGS.items():
            found = next((t for t in spellings if self.backend.token_to_id(t) is not None), None)
            if role not in special and found is not None:
                special[role] = found
        return Tokenizer(self.backend, source=self.source, special_tokens=special,
                         chat_template=self.chat_template.text if self.chat_template else None,
                         gguf_metadata=self.gguf_metadata)

    @property
    def eos_ids(self) -> frozenset[int]:
        """Ids that end a generation: EOS, and the turn-end token the chat template writes."""
        ids = {self.eos_id} if self.eos_id is not None else set()
        template = self.chat_template.text if self.chat_template else ""
        for token in CHAT_END_TOKENS:
            token_id = self.backend.token_to_id(token)
            if token_id is not None and token in template:
                ids.add(token_id)
        return frozenset(ids)

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def id_to_token(self, token_id: int) -> str:
        token = self.backend.id_to_token(token_id) if isinstance(token_id, int) and token_id >= 0 else None
        if token is None:
            raise InputError(f"token id {token_id!r} is not in [0, vocab_size={self.vocab_size})")
        return token

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    # -- text <-> ids ---------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`. Special tokens written in the text (e.g. "<|im_start|>") become
        their ids; `add_special_tokens` adds what the model puts around every text (BOS, [CLS]...)."""
        return self.encode_batch([text], add_special_tokens=add_special_tokens)[0]

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True, *,
                     max_length: int | None = None) -> list[list[int]]:
        """Token ids of each text. `max_length` truncates each to that many ids, the added special
        tokens included (the end of the text is cut, its [CLS]/[SEP] kept)."""
        if max_length is None:
            return [e.ids for e in self._encode(texts, add_special_tokens=add_special_tokens)]
        added = self.backend.num_special_tokens_to_add(False) if add_special_tokens else 0
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length <= added:
            raise InputError(f"max_length={max_length!r} must be an integer above the {added} added special tokens")
        encodings = self._encode(texts, add_special_tokens=False)
        for encoding in encodings:
            encoding.truncate(max_length - added)
        return [self.backend.post_process(e, add_special_tokens=add_special_tokens).ids for e in encodings]

    def _encode(self, texts: Sequence[str], *, add_special_tokens: bool) -> list[tokenizers.Encoding]:
        _check_texts(texts)
        try:
            return self.backend.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        except TypeError:  # the library's answer to a str it cannot turn into UTF-8
            for i, text in enumerate(texts):
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise InputError(f"text {i} is not valid Unicode: {exc.reason} at {exc.start}") from None
            raise

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """The text of `ids`. Bytes of an incomplete UTF-8 character decode to U+FFFD."""
        return self.backend.decode(self._check_ids(ids), skip_special_tokens=skip_special_tokens)

    def decode_batch(self, batch: Iterable[Iterable[int]], skip_special_tokens: bool = False) -> list[str]:
        checked = [self._check_ids(ids) for ids in batch]
        return self.backend.decode_batch(checked, skip_special_tokens=skip_special_tokens)

    def decode_stream(self, skip_special_tokens: bool = False):
        """An IncrementalDecoder: push ids one at a time, get text deltas that never split a character."""
        return IncrementalDecoder(self, skip_special_tokens=skip_special_tokens)

    def _check_ids(self, ids: Iterable[int]) -> list[int]:
        ids = list(ids.tolist() if hasattr(ids, "tolist") else ids)
        size = self.vocab_size
        for i in ids:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < size:
                raise InputError(f"token id {i!r} is not in [0, vocab_size={size})")
        return ids

    # -- chat -----------------------------------------------------------------------------------

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                            **variables: Any) -> str:
        """The prompt text for a conversation, rendered by the model's own chat template."""
        if self.chat_template is None:
            raise InputError(f"{self.source} has no chat template: pass the prompt as plain text")
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt, **variables)

    # -- identity and files -------------------------------------------------------------------

    @property
    def identity(self) -> str:
        """A hash of the whole definition (vocabulary, rules, special tokens, chat template): two
        tokenizers with the same identity turn every text into the same ids."""
        definition = json.dumps([self.backend.to_str(), self.special_tokens,
                                 self.chat_template.text if self.chat_template else None], sort_keys=True)
        return hashlib.sha256(definition.encode()).hexdigest()[:16]

    def save(self, directory: str | Path) -> Path:
        """Write tokenizer.json and tokenizer_config.json (special tokens by role, chat template) into
        `directory`, which load_tokenizer reads back as this tokenizer; each file atomically."""
        directory = Path(directory)
        config = {f"{role}_token": token for role, token in self.special_tokens.items()}
        if self.chat_template is not None:
            config["chat_template"] = self.chat_template.text
        for name, text in (("tokenizer.json", self.backend.to_str()),
                           ("tokenizer_config.json", json.dumps(config, indent=1, ensure_ascii=False))):
            with atomic_file(directory / name) as f:
                f.write(text.encode("utf-8"))
        return directory

    def __repr__(self) -> str:
        return (f"Tokenizer({self.source!r}, vocab_size={self.vocab_size}, "
                f"special_tokens={self.special_tokens}, chat_template={self.chat_template is not None})")


def _check_texts(texts: Any) -> None:
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise InputError(f"expected a list of strings, got {type(texts).__name__}")
    for text in texts:
        if not isinstance(text, str):
            raise InputError(f"can only encode strings, got {type(text).__name__}: {text!r:.60}")


# -- loading ------------------------------------------------------------------------------------

def load_tokenizer(name_or_path: str | Path) -> Tokenizer:
    """The tokenizer of an installed model name, a .gguf file, a model directory (tokenizer.json +
    tokenizer_config.json) or a tokenizer.json file."""
    from anatomy.checkpoints.source import resolve_path

    path = resolve_path(name_or_path)
    if path.is_dir():
        return _from_directory(path)
    if path.suffix == ".gguf":
        return _from_gguf(path)
    if path.suffix == ".json":
        return _from_tokenizer_json(path, config_path=path.parent / "tokenizer_config.json")
    raise InputError(f"{path}: not a tokenizer: expected a .gguf file, a model directory or a tokenizer.json")


def _from_directory(folder: Path) -> Tokenizer:
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise CheckpointError(f"{folder}: no tokenizer.json (a model directory needs tokenizer.json, "
                              f"and tokenizer_config.json for special tokens and the chat template)")
    return _from_tokenizer_json(path, config_path=folder / "tokenizer_config.json")


def _from_tokenizer_json(path: Path, *, config_path: Path) -> Tokenizer:
    try:
        backend = tokenizers.Tokenizer.from_str(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such tokenizer file") from None
    except Exception as exc:  # bad UTF-8, or the Rust parser's plain Exception for bad JSON/fields
        raise CheckpointError(f"{path}: not a valid tokenizer.json: {exc}") from None
    config = _read_json_object(config_path) if config_path.is_file() else {}
    special = {role: token for role in SPECIAL_ROLES
               if (token := _token_content(config.get(f"{role}_token"), config_path, role)) is not None}
    return Tokenizer(backend, source=path, special_tokens=special,
                     chat_template=_chat_template(config, config_path))


def _read_json_object(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def _token_content(value: Any, path: Path, role: str) -> str | None:
    """A special token in tokenizer_config.json: a string, or {"content": string, ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    if value is not None and not isinstance(value, str):
        raise CheckpointError(f"{path}: {role}_token={value!r} is not a string")
    return value


def _chat_template(config: dict[str, Any], config_path: Path) -> str | None:
    """chat_template.jinja next to the config, or the config's chat_template: a string, or a
    list of {"name", "template"} of which "default" is taken."""
    jinja_file = config_path.parent / "chat_template.jinja"
    if jinja_file.is_file():
        try:
            return jinja_file.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise CheckpointError(f"{jinja_file}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default", next(iter(named.values()), None))
    if template is not None and not isinstance(template, str):
        raise CheckpointError(f"{config_path}: chat_template must be a string or a list of named templates")
    return template


def _from_gguf(path: Path) -> Tokenizer:
    from anatomy.checkpoints.gguf import tokenizer_metadata
    from anatomy.checkpoints.gguf_reader import read_gguf
    from anatomy.text.gguf_vocab import special_token_ids, tokenizer_from_gguf

    f = read_gguf(path)
    meta = f.metadata
    backend = tokenizer_from_gguf(meta, source=str(path))
    tokens = meta["tokenizer.ggml.tokens"]
    ids = special_token_ids(meta, len(tokens), source=str(path))
    template = meta.get("tokenizer.chat_template")
    if template is not None and not isinstance(template, str):
        raise CheckpointError(f"{path}: tokenizer.chat_template must be a string, got {type(template).__name__}")
    return Tokenizer(backend, source=path, special_tokens={role: tokens[i] for role, i in ids.items()},
                     chat_template=template, gguf_metadata=tokenizer_metadata(f))
