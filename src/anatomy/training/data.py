"""Training data: text files (or a directory of them) tokenized once into uint16/uint32 memmaps
with a train/val split, cached under a content hash; or a TSV of source<TAB>target pairs.

    cache/<hash>/train.bin, val.bin      token streams (documents separated by the EOS token)
    cache/<hash>/{src,tgt}_{train,val}.bin + *.idx   seq2seq pairs, ragged (offsets in .idx)
    cache/<hash>/tokenizer.json, tokenizer_config.json, meta.json

The hash covers the file names and bytes, the tokenizer definition and the split, so the same
inputs never tokenize twice (docs/training.md, "What it does").
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from anatomy import progress
from anatomy.errors import InputError
from anatomy.text_file import read_text
from anatomy.text.tokenizer import Tokenizer

FORMAT_VERSION = 1
CHUNK_CHARS = 1 << 20  # tokenize in ~1M-character pieces, cut at line ends


@dataclass(frozen=True)
class TokenSplit:
    """One token stream (memmap) of a split."""

    tokens: np.ndarray

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class PairSplit:
    """Ragged source/target token lists of a split: pair i is src[src_idx[i]:src_idx[i+1]], ..."""

    src: np.ndarray
    src_idx: np.ndarray
    tgt: np.ndarray
    tgt_idx: np.ndarray

    def __len__(self) -> int:
        return len(self.src_idx) - 1

    def pair(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return (self.src[self.src_idx[i]:self.src_idx[i + 1]], self.tgt[self.tgt_idx[i]:self.tgt_idx[i + 1]])


@dataclass(frozen=True)
class Dataset:
    kind: str  # "text" or "pairs"
    train: TokenSplit | PairSplit
    val: TokenSplit | PairSplit
    tokenizer: Tokenizer
    directory: Path


def data_files(path: Path) -> list[Path]:
    """The file itself, or every regular non-hidden file under a directory (sorted)."""
    if not path.exists():
        raise InputError(f"--data {path}: no such file or directory")
    if path.is_file():
        files = [path]
    else:
        files = sorted(p for p in path.rglob("*") if p.is_file() and not any(s.startswith(".") for s in p.parts))
    if not files:
        raise InputError(f"--data {path}: the directory holds no files")
    return files


def prepare(data: Path, tokenizer_spec: str, *, cache_dir: Path, val_fraction: float = 0.1,
            progress: bool = True) -> Dataset:
    """Tokenize once (or find the cached result) and open the memmaps."""
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float)) or not 0 <= val_fraction < 1:
        raise InputError(f"val_fraction={val_fraction!r} must be in [0, 1)")
    files = data_files(Path(data))
    texts = {f: read_text(f, label="--data") for f in files}
    if not any(t.strip() for t in texts.values()):
        raise InputError(f"--data {data}: the text is empty")
    pairs = len(files) == 1 and files[0].suffix.lower() == ".tsv"
    tok = training_tokenizer(tokenizer_spec, texts.values())
    key = _cache_key(texts, tok, val_fraction=val_fraction, pairs=pairs)
    directory = Path(cache_dir) / key
    if not (directory / "meta.json").is_file():
        _build(directory, texts, tok, val_fraction=val_fraction, pairs=pairs, show_progress=progress)
    return open_dataset(directory, tok)


def training_tokenizer(spec: str, texts: Iterable[str]) -> Tokenizer:
    """"chars" (built from the texts), or a named model, a model directory, a .gguf or a
    tokenizer.json (anatomy.load_tokenizer), with the pad/bos/eos/mask roles training needs."""
    if spec == "chars":
        from anatomy.text.chars import chars_tokenizer

        return chars_tokenizer(c for text in texts for c in set(text))
    from anatomy.text.tokenizer import load_tokenizer

    return load_tokenizer(spec).with_usual_roles()


def _cache_key(texts: dict[Path, str], tok: Tokenizer, *, val_fraction: float, pairs: bool) -> str:
    h = hashlib.sha256(f"v{FORMAT_VERSION} {tok.identity} val={val_fraction} pairs={pairs}".encode())
    for path, text in texts.items():
        h.update(path.name.encode() + b"\0" + text.encode() + b"\0")
    return h.hexdigest()[:20]


def _build(directory: Path, texts: dict[Path, str], tok: Tokenizer, *, val_fraction: float,
           pairs: bool, show_progress: bool) -> None:
    """Tokenize into a temporary directory next to the cache entry, then rename it into place."""
    tmp = directory.with_name(f".{directory.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    dtype = np.uint16 if tok.vocab_size <= 1 << 16 else np.uint32
    with progress.quieted(not show_progress):
        if pairs:
            counts = _write_pairs(tmp, next(iter(texts.items())), tok, dtype=dtype, val_fraction=val_fraction)
        else:
            counts = _write_stream(tmp, texts, tok, dtype=dtype, val_fraction=val_fraction)
    tok.save(tmp)
    meta = {"format": FORMAT_VERSION, "kind": "pairs" if pairs else "text", "dtype": np.dtype(dtype).name,
            "tokenizer": tok.source, "vocab_size": tok.vocab_size, **counts}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    try:
        os.replace(tmp, directory)
    except OSError:  # another process built the same entry first
        shutil.rmtree(tmp, ignore_errors=True)


def _ids(tok: Tokenizer, text: str) -> np.ndarray:
    """The ids of a piece of corpus text: the text alone, nothing added around it."""
    return np.asarray(tok.encode(text, add_special_tokens=False), dtype=np.int64)


def _encode_with_progress(text: str, tok: Tokenizer, name: str) -> np.ndarray:
    pieces, start = [], 0
    with progress.task(f"tokenizing {name}", total=len(text)) as bar:
        while start < len(text):
            end = text.find("\n", start + CHUNK_CHARS)
            end = len(text) if end < 0 else end + 1
            pieces.append(_ids(tok, text[start:end]))
            bar.advance(end - start)
            start = end
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)


def _write_stream(tmp: Path, texts: dict[Path, str], tok: Tokenizer, *, dtype: type, val_fraction: float
                  ) -> dict[str, int]:
    docs = []
    for path, text in texts.items():
        docs.append(_encode_with_progress(text, tok, path.name))
        if tok.eos_id is not None:
            docs.append(np.array([tok.eos_id]))
    stream = np.concatenate(docs)
    n_val = int(len(stream) * val_fraction)
    train, val = stream[:len(stream) - n_val], stream[len(stream) - n_val:]
    train.astype(dtype).tofile(tmp / "train.bin")
    val.astype(dtype).tofile(tmp / "val.bin")
    return {"train_tokens": len(train), "val_tokens": len(val)}


def _write_pairs(tmp: Path, item: tuple[Path, str], tok: Tokenizer, *, dtype: type, val_fraction: float
                 ) -> dict[str, int]:
    path, text = item
    lines = [line for line in text.splitlines() if line.strip()]
    bad = next((n for n, line in enumerate(lines, 1) if line.count("\t") != 1), None)
    if bad is not None:
        raise InputError(f"--data {path}: line {bad} is not 'source<TAB>target' (one tab per line)")
    src, tgt = [], []
    for line in progress.track(lines, f"tokenizing {path.name}"):
        s, t = line.split("\t")
        src.append(_ids(tok, s))
        tgt.append(_ids(tok, t))
    n_val = int(len(lines) * val_fraction)
    cut = len(lines) - n_val
    for split, rows in (("train", slice(0, cut)), ("val", slice(cut, None))):
        for side, seqs in (("src", src[rows]), ("tgt", tgt[rows])):
            flat = np.concatenate(seqs) if seqs else np.zeros(0)
            flat.astype(dtype).tofile(tmp / f"{side}_{split}.bin")
            np.cumsum([0, *map(len, seqs)]).astype(np.int64).tofile(tmp / f"{side}_{split}.idx")
    return {"train_pairs": cut, "val_pairs": n_val}


def open_dataset(directory: Path, tok: Tokenizer) -> Dataset:
    """The memmaps of a cache entry; a damaged entry (a file missing, cut short or rewritten) is
    an InputError that says to delete it."""
    try:
        return _open(directory, tok, _read_meta(directory))
    except OSError as exc:
        raise _damaged(directory, exc) from exc


def _read_meta(directory: Path) -> dict:
    try:
        meta = json.loads((directory / "meta.json").read_text())
    except (OSError, ValueError) as exc:
        raise _damaged(directory, exc) from exc
    if not isinstance(meta, dict) or meta.get("kind") not in ("text", "pairs") \
            or meta.get("dtype") not in ("uint16", "uint32"):
        raise _damaged(directory, "meta.json does not describe a cache entry")
    return meta


def _damaged(directory: Path, why: object) -> InputError:
    return InputError(f"the tokenized-data cache {directory} is damaged ({why}): "
                      "delete that directory and it is tokenized again")


def _open(directory: Path, tok: Tokenizer, meta: dict) -> Dataset:
    dtype = np.dtype(meta["dtype"])

    def memmap(name: str, dt: np.dtype = dtype) -> np.ndarray:
        path = directory / name
        return np.memmap(path, dtype=dt, mode="r") if path.stat().st_size else np.zeros(0, dtype=dt)

    if meta["kind"] == "text":
        splits = [TokenSplit(memmap(f"{s}.bin")) for s in ("train", "val")]
    else:
        splits = [PairSplit(memmap(f"src_{s}.bin"), memmap(f"src_{s}.idx", np.dtype(np.int64)),
                            memmap(f"tgt_{s}.bin"), memmap(f"tgt_{s}.idx", np.dtype(np.int64)))
                  for s in ("train", "val")]
    return Dataset(kind=meta["kind"], train=splits[0], val=splits[1], tokenizer=tok, directory=directory)


def check_size(data: Dataset, *, seq_len: int, need_val: bool) -> None:
    """A text corpus must hold more than one context window (plus the shifted target) per split."""
    if data.kind != "text":
        if len(data.train) == 0 or (need_val and len(data.val) == 0):
            raise InputError(f"the TSV has {len(data.train)} training and {len(data.val)} validation pairs: "
                             "too few to train and evaluate (need at least one of each)")
        return
    for name, split in (("training", data.train), ("validation", data.val)):
        if (name == "training" or need_val) and len(split) < seq_len + 1:
            raise InputError(f"the {name} split holds {len(split)} tokens, fewer than one context window "
                             f"(--seq-len {seq_len} + 1): use more text or a shorter --seq-len")


def step_generator(seed: int, step: int, stream: int = 0) -> np.random.Generator:
    """The random numbers of one step (stream 0: training; 1: evaluation batches)."""
    return np.random.default_rng([seed, stream, step])


def rank_rows(batch_rows: int, *, rank: int, world: int, accum: int, micro: int) -> slice:
    """The rows of a global batch one rank reads in one micro-step: rank-major, then micro-steps."""
    per_rank = batch_rows // world
    size = per_rank // accum
    start = rank * per_rank + micro * size
    return slice(start, start + size)
