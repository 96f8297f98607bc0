"""Tokenize once, cache by content, split, read rows per rank; TSV pairs; errors on bad data."""

from __future__ import annotations

import numpy as np
import pytest

from anatomy.errors import InputError
from anatomy.training.data import prepare, rank_rows


def test_char_corpus_is_tokenized_once_and_cached_by_content(tmp_path):
    text = "hello world\n" * 100
    (tmp_path / "a.txt").write_text(text)
    data = prepare(tmp_path / "a.txt", "chars", cache_dir=tmp_path / "cache", progress=False)
    assert data.train.tokens.dtype == np.uint16
    assert len(data.train) + len(data.val) == len(text) + 1  # + the EOS after the document
    assert data.tokenizer.decode(data.train.tokens[:11]) == "hello world"
    mtime = (data.directory / "train.bin").stat().st_mtime_ns
    again = prepare(tmp_path / "a.txt", "chars", cache_dir=tmp_path / "cache", progress=False)
    assert again.directory == data.directory and (again.directory / "train.bin").stat().st_mtime_ns == mtime
    (tmp_path / "a.txt").write_text(text + "more")
    changed = prepare(tmp_path / "a.txt", "chars", cache_dir=tmp_path / "cache", progress=False)
    assert changed.directory != data.directory


def test_tokenizer_json_gives_the_same_ids_as_the_tokenizers_library(tmp_path):
    from tokenizers import Tokenizer

    (tmp_path / "t.txt").write_text("To be, or not to be\n" * 20)
    chars = prepare(tmp_path / "t.txt", "chars", cache_dir=tmp_path / "c", progress=False)
    path = chars.directory / "tokenizer.json"
    data = prepare(tmp_path / "t.txt", str(path), cache_dir=tmp_path / "c", progress=False)
    ref = Tokenizer.from_file(str(path)).encode("To be, or not to be\n" * 18).ids
    assert data.train.tokens[:len(ref)].tolist() == ref


def test_tsv_pairs(tmp_path):
    lines = [f"{i}\t{'x' * (i % 5 + 1)}" for i in range(20)]
    (tmp_path / "p.tsv").write_text("\n".join(lines))
    data = prepare(tmp_path / "p.tsv", "chars", cache_dir=tmp_path / "c", progress=False)
    assert data.kind == "pairs" and len(data.train) == 18 and len(data.val) == 2
    src, tgt = data.val.pair(1)
    assert data.tokenizer.decode(src) == "19" and data.tokenizer.decode(tgt) == "xxxxx"
    (tmp_path / "bad.tsv").write_text("a\tb\nno tab here\n")
    with pytest.raises(InputError, match="line 2 is not 'source<TAB>target'"):
        prepare(tmp_path / "bad.tsv", "chars", cache_dir=tmp_path / "c", progress=False)


def test_unreadable_data_names_the_file(tmp_path):
    (tmp_path / "bin.txt").write_bytes(b"abc\xff\xfe")
    with pytest.raises(InputError, match="bin.txt: not UTF-8 text"):
        prepare(tmp_path / "bin.txt", "chars", cache_dir=tmp_path / "c", progress=False)
    (tmp_path / "d").mkdir()
    with pytest.raises(InputError, match="holds no files"):
        prepare(tmp_path / "d", "chars", cache_dir=tmp_path / "c", progress=False)


def test_rank_rows_cover_the_batch_once():
    seen = []
    for rank in range(2):
        for micro in range(3):
            rows = rank_rows(12, rank=rank, world=2, accum=3, micro=micro)
            seen.extend(range(12)[rows])
    assert seen == list(range(12))


def test_a_damaged_cache_entry_says_to_delete_it(tmp_path):
    (tmp_path / "a.txt").write_text("hello world\n" * 50)
    data = prepare(tmp_path / "a.txt", "chars", cache_dir=tmp_path / "cache", progress=False)
    (data.directory / "train.bin").unlink()
    with pytest.raises(InputError, match=f"cache {data.directory} is damaged .*delete that directory"):
        prepare(tmp_path / "a.txt", "chars", cache_dir=tmp_path / "cache", progress=False)
    (data.directory / "meta.json").write_text("[1]")
    with pytest.raises(InputError, match="is damaged"):
        prepare(tmp_path / "a.txt", "chars", cache_dir=tmp_path / "cache", progress=False)
