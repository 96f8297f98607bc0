"""Hand-crafted bad GGUF files: each is a CheckpointError naming the file, the field and the value;
and random byte mutations of a small valid file never raise anything but CheckpointError."""

from __future__ import annotations

import itertools
import struct

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anatomy import build_model, get_preset
from anatomy.checkpoints.gguf import load_gguf, read_gguf, save_gguf
from anatomy.checkpoints.gguf_types import TENSOR_TYPES_BY_NAME, ValueType
from anatomy.checkpoints.gguf_writer import TensorEntry, write_gguf
from anatomy.errors import CheckpointError

U32, STR, ARR, BOOL = 4, 8, 9, 7
F32, Q8_0 = 0, 8


# -- a byte-level builder, independent of anatomy's writer, that can also write what is invalid --
def s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", vtype) + payload


def info(name: str, ne: list[int], ttype: int = F32, offset: int = 0) -> bytes:
    return s(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne) + struct.pack("<IQ", ttype, offset)


ARCH = kv("general.architecture", STR, s("llama"))
TENSOR_A = info("a", [8])


def gguf(*, kvs=(ARCH,), infos=(TENSOR_A,), data: bytes = b"\0" * 32, magic=b"GGUF", version=3,
         n_tensors=None, n_kv=None) -> bytes:
    head = magic + struct.pack("<IQQ", version, len(infos) if n_tensors is None else n_tensors,
                               len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(infos)
    return body + b"\0" * (-len(body) % 32) + data


def test_the_builder_makes_a_valid_file(tmp_path):
    f = _read(tmp_path, gguf())
    assert f.metadata == {"general.architecture": "llama"} and f.tensors["a"].shape == (8,)


def _read(tmp_path, blob: bytes):
    path = tmp_path / "bad.gguf"
    path.write_bytes(blob)
    return read_gguf(path)


BAD_FILES = {
    "bad magic": (gguf(magic=b"GGUX"), "magic"),
    "version 0": (gguf(version=0), "version=0"),
    "version 99": (gguf(version=99), "version=99"),
    "version 1 (old layout)": (gguf(version=1), "version=1"),
    "tensor count 2^63": (gguf(n_tensors=2**63), "tensor_count=9223372036854775808"),
    "kv count 2^63": (gguf(n_kv=2**63), "metadata_kv_count=9223372036854775808"),
    "kv count 2^64-1": (gguf(n_kv=2**64 - 1), "metadata_kv_count"),
    "key length past EOF": (gguf(kvs=[struct.pack("<Q", 2**40) + b"general"]), "metadata key #0 length"),
    "string value past EOF": (gguf(kvs=[kv("general.name", STR, struct.pack("<Q", 10**6) + b"x")]), "general.name"),
    "array length past EOF": (gguf(kvs=[kv("x", ARR, struct.pack("<IQ", U32, 2**62))]), "x array length"),
    "string array past EOF": (gguf(kvs=[kv("x", ARR, struct.pack("<IQ", STR, 2**40))]), "x array length"),
    "arrays nested 3 deep": (gguf(kvs=[kv("x", ARR, struct.pack("<IQ", ARR, 1) + struct.pack("<IQ", ARR, 1)
                                           + struct.pack("<IQ", U32, 0))]), "nested deeper"),
    "unknown value type 255": (gguf(kvs=[kv("x", 255, b"\0" * 8)]), "x value type=255"),
    "unknown array element type": (gguf(kvs=[kv("x", ARR, struct.pack("<IQ", 99, 0))]), "x element type=99"),
    "bool value 2": (gguf(kvs=[kv("x", BOOL, b"\x02")]), "x=2"),
    "invalid utf-8 key": (gguf(kvs=[kv(b"\xff\xfe", U32, b"\0" * 4)]), "UTF-8"),
    "empty key": (gguf(kvs=[kv("", U32, b"\0" * 4)]), "must not be empty"),
    "duplicate key": (gguf(kvs=[ARCH, ARCH]), "duplicate key"),
    "alignment not a power of two": (gguf(kvs=[kv("general.alignment", U32, struct.pack("<I", 24))]),
                                     "general.alignment=24"),
    "alignment zero": (gguf(kvs=[kv("general.alignment", U32, struct.pack("<I", 0))]), "general.alignment=0"),
    "alignment of the wrong type": (gguf(kvs=[kv("general.alignment", STR, s("32"))]), "general.alignment"),
    "n_dims 5": (gguf(infos=[info("a", [1, 1, 1, 1, 8])]), "a n_dims=5"),
    "n_dims 0": (gguf(infos=[info("a", [])]), "a n_dims=0"),
    "a zero dimension": (gguf(infos=[info("a", [8, 0])]), "a ne[1]=0"),
    "unknown tensor type 255": (gguf(infos=[info("a", [8], ttype=255)]), "a type=255"),
    "row not a whole number of blocks": (gguf(infos=[info("a", [16], ttype=Q8_0)]), "a ne[0]=16"),
    "misaligned offset": (gguf(infos=[TENSOR_A, info("b", [4], offset=4)]), "b offset=4"),
    "overlapping tensors": (gguf(infos=[info("a", [16]), info("b", [8], offset=32)], data=b"\0" * 64), "overlaps"),
    "data past EOF": (gguf(infos=[info("a", [8], offset=64)]), "a offset=64"),
    "element count overflow": (gguf(infos=[info("a", [2**62, 2**62])]), "ends past the end"),
    "duplicate tensor names": (gguf(infos=[TENSOR_A, info("a", [8], offset=32)], data=b"\0" * 64),
                               "duplicate tensor name"),
    "tensor name past EOF": (gguf(infos=[struct.pack("<Q", 2**50) + b"a"]), "tensor #0 name length"),
    "empty file": (b"", "file size=0"),
    "header only": (b"GGUF\x03\0\0\0", "file size"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_file_is_a_checkpoint_error_naming_field_and_value(tmp_path, case):
    blob, expected = BAD_FILES[case]
    with pytest.raises(CheckpointError) as e:
        _read(tmp_path, blob)
    message = str(e.value)
    assert str(tmp_path / "bad.gguf") in message and expected in message


def test_truncated_at_every_header_offset_and_through_the_data(tmp_path, tiny_gguf):
    blob = tiny_gguf.read_bytes()
    data_start = read_gguf(tiny_gguf).data_offset
    cuts = itertools.chain(range(data_start + 1), range(data_start + 1, len(blob), 97))
    for cut in cuts:
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(blob[:cut])
        with pytest.raises(CheckpointError):
            load_gguf(path)
        path.unlink()


# -- metadata that makes no model, or not one anatomy runs ------------------------------------
@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A one-layer GQA llama with a 12-token vocabulary, written by anatomy (~40 KB)."""
    torch.manual_seed(0)
    config = get_preset("llama-7b", vocab_size=12, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=32,
                        max_seq_len=64, bos_token_id=1, eos_token_id=2)
    tokens = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": [f"t{i}" for i in range(12)]}
    return save_gguf(build_model(config), tmp_path_factory.mktemp("gguf") / "tiny.gguf", tokenizer_metadata=tokens)


def _entries(f, tensor_types=None) -> list[TensorEntry]:
    """The tensors of GGUFFile f to write again, optionally relabelled with other types."""
    entries = []
    for t in f.tensors.values():
        ttype = TENSOR_TYPES_BY_NAME[(tensor_types or {}).get(t.name, t.type.name)]
        n = ttype.nbytes(t.n_elements)
        raw = np.resize(f.raw(t.name), n)  # as many bytes as the new type needs
        entries.append(TensorEntry(name=t.name, type=ttype, shape=t.shape, data=lambda raw=raw: raw))
    return entries


def _rewrite(src, dst, *, set_keys=None, drop_keys=(), tensor_types=None, extra=()):
    """A copy of the GGUF `src` with metadata changed, tensor types relabelled, tensors added
    (written by anatomy's writer, which gguf-py reads: test_gguf_writer)."""
    f = read_gguf(src)
    set_keys = set_keys or {}
    metadata = [(k, f.value_types[k], v) for k, v in f.metadata.items() if k not in drop_keys and k not in set_keys]
    metadata += [(k, t, v) for k, (t, v) in set_keys.items()]
    return write_gguf(dst, metadata=metadata, tensors=[*_entries(f, tensor_types), *extra])


UINT32, STRING, FLOAT32 = (ValueType.UINT32,), (ValueType.STRING,), (ValueType.FLOAT32,)
BAD_METADATA = {
    "zero heads": ({"llama.attention.head_count": (UINT32, 0)}, (), "llama.attention.head_count=0"),
    "heads not dividing kv heads": ({"llama.attention.head_count_kv": (UINT32, 3)}, (),
                                    "llama.attention.head_count_kv"),
    "context length 2^31": ({"llama.context_length": (UINT32, 2**31)}, (), "llama.context_length=2147483648"),
    "block count as a string": ({"llama.block_count": (STRING, "1")}, (), "llama.block_count='1'"),
    "missing embedding length": ({}, ("llama.embedding_length",), "llama.embedding_length=None"),
    "unsupported architecture": ({"general.architecture": (STRING, "mamba")}, (),
                                 "supported: llama, qwen2, qwen3, qwen2moe, qwen3moe, gemma, gemma2, phi3, gpt2"),
    "bos id outside the vocabulary": ({"tokenizer.ggml.bos_token_id": (UINT32, 12)}, (),
                                      "tokenizer.ggml.bos_token_id"),
    "negative eps": ({"llama.attention.layer_norm_rms_epsilon": (FLOAT32, -1.0)}, (), "layer_norm_rms_epsilon"),
    "rope scaling": ({"llama.rope.scaling.type": (STRING, "yarn")}, (), "llama.rope.scaling.type='yarn'"),
    "partial rotary": ({"llama.rope.dimension_count": (UINT32, 4)}, (), "llama.rope.dimension_count=4"),
    "shape inconsistent with the config": ({"llama.feed_forward_length": (UINT32, 16)}, (),
                                           "blk.0.ffn_gate.weight shape=[32, 32]"),
    "more layers than tensors": ({"llama.block_count": (UINT32, 2)}, (), "missing"),
}


@pytest.mark.parametrize("case", sorted(BAD_METADATA))
def test_metadata_that_makes_no_model(tmp_path, tiny_gguf, case):
    set_keys, drop, expected = BAD_METADATA[case]
    path = _rewrite(tiny_gguf, tmp_path / "m.gguf", set_keys=set_keys, drop_keys=drop)
    with pytest.raises(CheckpointError) as e:
        load_gguf(path)
    assert str(path) in str(e.value) and expected in str(e.value), str(e.value)


def test_unsupported_tensor_type_names_it_and_lists_the_supported(tmp_path, tiny_gguf):
    path = _rewrite(tiny_gguf, tmp_path / "m.gguf", tensor_types={"blk.0.ffn_up.weight": "IQ4_NL"})
    with pytest.raises(CheckpointError, match=r"blk.0.ffn_up.weight type='IQ4_NL'.*supported: F32, F16, BF16"):
        load_gguf(path)


def test_unexpected_tensor_is_named(tmp_path, tiny_gguf):
    extra = TensorEntry(name="blk.0.attn_q.scale", type=TENSOR_TYPES_BY_NAME["F32"], shape=(4,),
                        data=lambda: np.zeros(4, np.float32))
    path = _rewrite(tiny_gguf, tmp_path / "m.gguf", extra=[extra])
    with pytest.raises(CheckpointError, match="blk.0.attn_q.scale.*unexpected"):
        load_gguf(path)


def test_rope_frequencies_no_llama3_rule_gives_are_refused(tmp_path, tiny_gguf):
    """llama.cpp divides each RoPE frequency by rope_freqs; anatomy reads them as Llama 3's rule or not at all."""
    extra = TensorEntry(name="rope_freqs.weight", type=TENSOR_TYPES_BY_NAME["F32"], shape=(4,),
                        data=lambda: np.array([1.0, 1.5, 3.0, 7.0], np.float32))
    path = _rewrite(tiny_gguf, tmp_path / "m.gguf", extra=[extra])
    with pytest.raises(CheckpointError, match="rope_freqs.weight=.*no Llama 3 rule"):
        load_gguf(path)


def test_long_but_sane_context_is_lazy(tmp_path, tiny_gguf):
    """A RoPE model allocates nothing per position: a 1M context loads (and costs nothing)."""
    path = _rewrite(tiny_gguf, tmp_path / "m.gguf", set_keys={"llama.context_length": (UINT32, 2**20)})
    assert load_gguf(path).config.max_seq_len == 2**20


# -- random mutations ---------------------------------------------------------------------------
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_files_load_cleanly_or_raise_checkpoint_error(tmp_path, tiny_gguf, data):
    blob = bytearray(tiny_gguf.read_bytes())
    header = read_gguf(tiny_gguf).data_offset
    # most mutations hit the header, where the structure is; some the data; some truncate or extend
    positions = st.one_of(st.integers(0, header - 1), st.integers(0, len(blob) - 1))
    for pos, value in data.draw(st.lists(st.tuples(positions, st.integers(0, 255)), min_size=1, max_size=6)):
        blob[pos] = value
    tail = data.draw(st.sampled_from(["keep", "cut", "extend"]))
    if tail == "cut":
        blob = blob[:data.draw(st.integers(0, len(blob)))]
    elif tail == "extend":
        blob += bytes(data.draw(st.integers(1, 64)))
    path = tmp_path / f"fuzz{data.draw(st.integers(0, 2**32))}.gguf"
    path.write_bytes(bytes(blob))
    try:
        model = load_gguf(path)
        assert model.config.vocab_size > 0
    except CheckpointError as e:
        assert str(path) in str(e)
    finally:
        path.unlink()
