"""A HF `tokenizers` tokenizer rebuilt from GGUF metadata (llama.cpp's `tokenizer.ggml.*` keys).

- `tokenizer.ggml.model = "gpt2"`: byte-level BPE from the stored vocabulary, merges, token types
  and the pre-tokenizer named by `tokenizer.ggml.pre` (GPT-2, LLaMA-3, Qwen, SmolLM, ...).
- `tokenizer.ggml.model = "llama"`: SentencePiece BPE (LLaMA 1/2, Mistral, Gemma, Phi-3), rebuilt as
  HF BPE whose merges are derived from the pieces' scores, byte fallback on (docs/gguf.md,
  "SentencePiece vocabularies", says why that equals llama.cpp's tokenization).

Control tokens become special tokens, user-defined ones added tokens, matched before pre-tokenization.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from anatomy.errors import CheckpointError

NORMAL, UNKNOWN, CONTROL, USER_DEFINED = 1, 2, 3, 4  # token types used here (5 unused, 6 byte)
SPACE = "\u2581"  # SentencePiece's "▁", standing for a space

# The pre-tokenizers, as the regular expressions llama.cpp applies one after the other: each splits
# every piece left by the previous one into its matches and the text between them.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# LLaMA-3: case-insensitive contractions, letters with one leading non-letter, digits in groups of
# at most three, punctuation runs with their newlines, newline runs, other whitespace
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# llama.cpp's fallback when a file names no pre-tokenizer: punctuation runs first, then GPT-2's split
_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")


@dataclass(frozen=True)
class PreTokenizer:
    """How text is cut before BPE: `patterns` in order; with `ignore_merges` a piece that is a
    whole vocabulary entry is taken as is (LLaMA-3's tokenizer does this)."""

    patterns: tuple[str, ...]
    ignore_merges: bool = False

    def build(self) -> pre_tokenizers.PreTokenizer:
        splits = [pre_tokenizers.Split(Regex(p), behavior="isolated") for p in self.patterns]
        return pre_tokenizers.Sequence([*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


# tokenizer.ggml.pre -> pre-tokenizer (names as llama.cpp writes them)
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "default": PreTokenizer(_DEFAULT),
    "gpt-2": PreTokenizer((_GPT2,)),
    "gpt2": PreTokenizer((_GPT2,)),
    "smollm": PreTokenizer((r"\p{N}", _GPT2)),  # every digit on its own, then GPT-2's split
    "starcoder": PreTokenizer((r"\p{N}", _GPT2)),
    "llama-bpe": PreTokenizer((_LLAMA3,), ignore_merges=True),
    "llama3": PreTokenizer((_LLAMA3,), ignore_merges=True),
    "llama-v3": PreTokenizer((_LLAMA3,), ignore_merges=True),
}


def tokenizer_from_gguf(meta: Mapping[str, Any], *, source: str) -> Tokenizer:
    """The tokenizer described by a GGUF file's metadata; CheckpointError names the bad key."""
    kind = meta.get("tokenizer.ggml.model")
    if kind == "llama":
        return _sentencepiece(meta, source=source)
    if kind != "gpt2":
        raise CheckpointError(f"{source}: tokenizer.ggml.model={kind!r} is not supported "
                              f"(supported: 'gpt2', byte-level BPE; 'llama', SentencePiece BPE)")
    tokens = _string_list(meta, "tokenizer.ggml.tokens", source=source)
    merges = [_merge(m, i, source=source) for i, m in enumerate(_string_list(meta, "tokenizer.ggml.merges",
                                                                              source=source))]
    types = _token_types(meta, len(tokens), source=source)
    pre = _pre_tokenizer(meta, source=source)
    vocab = {token: i for i, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab, merges, ignore_merges=pre.ignore_merges))
    tokenizer.pre_tokenizer = pre.build()
    tokenizer.decoder = decoders.ByteLevel()
    _add_typed_tokens(tokenizer, tokens, types)
    _add_bos_eos(tokenizer, meta, tokens, source=source)
    return tokenizer


def _sentencepiece(meta: Mapping[str, Any], *, source: str) -> Tokenizer:
    """SentencePiece BPE as llama.cpp runs it: merges by score, byte fallback, "▁" for spaces."""
    tokens = _string_list(meta, "tokenizer.ggml.tokens", source=source)
    scores = _scores(meta, len(tokens), source=source)
    types = _token_types(meta, len(tokens), source=source)
    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise CheckpointError(f"{source}: tokenizer.ggml.tokens holds a token twice")
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    tokenizer = Tokenizer(models.BPE(vocab, _merges_by_score(tokens, scores), byte_fallback=True, fuse_unk=True,
                                     unk_token=tokens[unk] if isinstance(unk, int) and 0 <= unk < len(tokens) else None))
    prefix = meta.get("tokenizer.ggml.add_space_prefix", True) is not False
    tokenizer.normalizer = normalizers.Sequence([*([normalizers.Prepend(SPACE)] if prefix else []),
                                                 normalizers.Replace(" ", SPACE)])
    tokenizer.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse(),
                                           *([decoders.Strip(" ", 1, 0)] if prefix else [])])
    _add_typed_tokens(tokenizer, tokens, [CONTROL if t == UNKNOWN else t for t in types])
    _add_bos_eos(tokenizer, meta, tokens, source=source, bos_default=True)
    return tokenizer


def _scores(meta: Mapping[str, Any], n_tokens: int, *, source: str) -> list[float]:
    scores = _per_token(meta, "tokenizer.ggml.scores", n_tokens, source=source, why=" (SentencePiece merges by score)")
    return [float(x) for x in scores]


def _merges_by_score(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """Every split of every piece into two pieces, the joined piece's score deciding the rank
    (higher first; the lower token id first among equals): llama.cpp's merge order."""
    ids = {token: i for i, token in enumerate(tokens)}
    merges = []
    for i, token in enumerate(tokens):
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ids and right in ids:
                merges.append((-scores[i], i, ids[left], left, right))
    merges.sort()
    return [(left, right) for *_, left, right in merges]


def special_token_ids(meta: Mapping[str, Any], n_tokens: int, *, source: str) -> dict[str, int]:
    """{"bos": id, "eos": ..., "unk": ..., "pad": ...} for the ids the metadata names."""
    ids = {}
    for role, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("unk", "unknown_token_id"),
                      ("pad", "padding_token_id")):
        value = meta.get(f"tokenizer.ggml.{key}")
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n_tokens:
            raise CheckpointError(f"{source}: tokenizer.ggml.{key}={value!r} is not a token id "
                                  f"in [0, {n_tokens})")
        ids[role] = value
    return ids


def _string_list(meta: Mapping[str, Any], key: str, *, source: str) -> list[str]:
    value = meta.get(key)
    if not isinstance(value, (list, tuple)) or not all(isinstance(s, str) for s in value):
        raise CheckpointError(f"{source}: {key} must be an array of strings, got {type(value).__name__}")
    if key.endswith("tokens") and not value:
        raise CheckpointError(f"{source}: {key} is empty")
    return list(value)


def _merge(text: str, index: int, *, source: str) -> tuple[str, str]:
    parts = text.split(" ")
    if len(parts) != 2 or not all(parts):
        raise CheckpointError(f"{source}: tokenizer.ggml.merges[{index}]={text!r} is not 'left right'")
    return parts[0], parts[1]


def _token_types(meta: Mapping[str, Any], n_tokens: int, *, source: str) -> list[int]:
    types = meta.get("tokenizer.ggml.token_type")
    if types is None:
        return [NORMAL] * n_tokens
    return [int(t) for t in _per_token(meta, "tokenizer.ggml.token_type", n_tokens, source=source)]


def _per_token(meta: Mapping[str, Any], key: str, n_tokens: int, *, source: str, why: str = "") -> Any:
    """meta[key], an array with one entry per token (CheckpointError naming both lengths otherwise)."""
    values = meta.get(key)
    is_array = hasattr(values, "__len__") and not isinstance(values, (str, bytes))
    if not is_array or len(values) != n_tokens:
        size = len(values) if is_array else type(values).__name__
        raise CheckpointError(f"{source}: {key} has {size} entries, tokenizer.ggml.tokens has {n_tokens}{why}")
    return values


def _pre_tokenizer(meta: Mapping[str, Any], *, source: str) -> PreTokenizer:
    name = meta.get("tokenizer.ggml.pre", "default")
    if name not in PRE_TOKENIZERS:
        raise CheckpointError(f"{source}: tokenizer.ggml.pre={name!r} is not supported "
                              f"(supported: {', '.join(sorted(PRE_TOKENIZERS))})")
    return PRE_TOKENIZERS[name]


def _add_typed_tokens(tokenizer: Tokenizer, tokens: list[str], types: list[int]) -> None:
    """Control tokens -> special tokens (skipped by decode(skip_special_tokens=True));
    user-defined tokens -> added tokens. Both are matched whole in raw text."""
    def added(i: int, special: bool) -> AddedToken:
        return AddedToken(tokens[i], special=special, normalized=False)

    tokenizer.add_special_tokens([added(i, True) for i, t in enumerate(types) if t == CONTROL])
    tokenizer.add_tokens([added(i, False) for i, t in enumerate(types) if t == USER_DEFINED])


def _add_bos_eos(tokenizer: Tokenizer, meta: Mapping[str, Any], tokens: list[str], *, source: str,
                 bos_default: bool = False) -> None:
    """`tokenizer.ggml.add_bos_token` / `add_eos_token`: put BOS / EOS around every encoded text
    (llama.cpp adds BOS by default for SentencePiece vocabularies, `bos_default`)."""
    ids = special_token_ids(meta, len(tokens), source=source)
    add_bos = meta.get("tokenizer.ggml.add_bos_token")
    around = {"bos": add_bos is True or (add_bos is None and bos_default and "bos" in ids),
              "eos": meta.get("tokenizer.ggml.add_eos_token") is True}
    for role, wanted in around.items():
        if wanted and role not in ids:
            raise CheckpointError(f"{source}: tokenizer.ggml.add_{role}_token is set "
                                  f"but tokenizer.ggml.{role}_token_id is missing")
    chosen = {role: (tokens[ids[role]], ids[role]) for role, wanted in around.items() if wanted}
    if not chosen:
        return
    single = [chosen["bos"][0]] if "bos" in chosen else []
    single += ["$A"] + ([chosen["eos"][0]] if "eos" in chosen else [])
    tokenizer.post_processor = processors.TemplateProcessing(single=single, special_tokens=list(chosen.values()))
