"""StringTable (checkpoints/gguf_strings.py) against the list of str it stands for, and a GGUF vocabulary
kept that way written back as gguf-py reads the file's own."""

from __future__ import annotations

import pytest
from gguf import GGUFReader

from anatomy import build_model, get_preset
from anatomy.checkpoints.gguf import read_gguf, save_gguf, tokenizer_metadata
from anatomy.checkpoints.gguf_strings import StringTable

STRINGS = ["", "Ġthe", "a", "", "é", "日本語", "𝄞 clef", "t 0", "\x00nul"]  # empty, 2-, 3- and 4-byte UTF-8


def test_a_table_reads_back_as_its_list():
    table = StringTable(STRINGS)
    assert len(table) == len(STRINGS) and list(table) == STRINGS
    assert [table[i] for i in range(-len(STRINGS), len(STRINGS))] == STRINGS + STRINGS
    assert table[2:7] == STRINGS[2:7] and table[::-3] == STRINGS[::-3] and table[5:2] == []
    assert table == STRINGS and table == tuple(STRINGS) and table != STRINGS[:-1] and table != "".join(STRINGS)
    assert list(StringTable([])) == [] and len(StringTable([])) == 0
    for bad in (len(STRINGS), -len(STRINGS) - 1):
        with pytest.raises(IndexError, match=f"string {bad} of 9"):
            table[bad]


def test_a_files_vocabulary_is_kept_as_tables_and_written_back(tmp_path):
    tiny_llama = build_model(get_preset("llama-7b", vocab_size=64, d_model=32, n_layers=1, n_heads=2, d_ff=48,
                                        max_seq_len=64))
    tokens = [f"tok{i}" for i in range(tiny_llama.config.vocab_size - len(STRINGS))] + STRINGS
    given = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": ["t 0", "é 日"]}
    path = save_gguf(tiny_llama, tmp_path / "v.gguf", tokenizer_metadata=given)
    kept = tokenizer_metadata(read_gguf(path))
    assert isinstance(kept["tokenizer.ggml.tokens"][1], StringTable)
    assert isinstance(kept["tokenizer.ggml.model"][1], str)
    again = save_gguf(tiny_llama, tmp_path / "again.gguf", tokenizer_metadata=None,
                      tokenizer=type("Carrier", (), {"source": str(path), "gguf_metadata": kept})())
    fields = GGUFReader(again).fields
    assert fields["tokenizer.ggml.tokens"].contents() == tokens
    assert fields["tokenizer.ggml.merges"].contents() == ["t 0", "é 日"]
