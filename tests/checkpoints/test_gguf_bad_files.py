"""Hand-crafted bad GGUF files: each is a CheckpointError naming the file, the field and the value;
and random byte mutations of a small valid file never raise anything but CheckpointError."""

from __future__ import annotations

import itertools
import re
import struct

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants
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
                                 "supported: llama, qwen2, qwen3, qwen2moe, qwen3moe, gemma, gemma2, gemma3, smollm3, "
                                 "gpt-oss, phi3, deepseek2, gpt2"),
    "bos id outside the vocabulary": ({"tokenizer.ggml.bos_token_id": (UINT32, 12)}, (),
                                      "tokenizer.ggml.bos_token_id"),
    "negative eps": ({"llama.attention.layer_norm_rms_epsilon": (FLOAT32, -1.0)}, (), "layer_norm_rms_epsilon"),
    "rope scaling": ({"llama.rope.scaling.type": (STRING, "longrope")}, (), "llama.rope.scaling.type='longrope'"),
    "yarn log multiplier": ({"llama.rope.scaling.type": (STRING, "yarn"),
                             "llama.rope.scaling.yarn_log_multiplier": (FLOAT32, 0.1)}, (),
                            "llama.rope.scaling.yarn_log_multiplier"),
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


@pytest.fixture(scope="module")
def wide_gguf(tmp_path_factory):
    """A one-layer llama with rows of 256 (the K-quant super-block), written by anatomy (f32, ~1.3 MB)."""
    torch.manual_seed(0)
    config = get_preset("llama-7b", vocab_size=12, d_model=256, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=256,
                        max_seq_len=64, bos_token_id=1, eos_token_id=2)
    tokens = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": [f"t{i}" for i in range(12)]}
    return save_gguf(build_model(config), tmp_path_factory.mktemp("gguf") / "wide.gguf", tokenizer_metadata=tokens)


# every block type anatomy runs beside Q4_0/Q4_1/Q8_0, one per matrix (random blocks, finite scales)
BLOCK_TYPES = {"token_embd.weight": "Q5_K", "blk.0.attn_q.weight": "Q2_K", "blk.0.attn_k.weight": "Q3_K",
               "blk.0.attn_v.weight": "Q4_K", "blk.0.attn_output.weight": "Q6_K", "blk.0.ffn_gate.weight": "IQ4_NL",
               "blk.0.ffn_up.weight": "IQ4_XS", "blk.0.ffn_down.weight": "MXFP4", "output.weight": "Q5_1"}


F16_FIELDS = {"Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "IQ4_NL": [0],
              "IQ4_XS": [0], "MXFP4": [], "Q5_1": [0, 2]}  # byte offsets of the float16 scales in a block


@pytest.fixture(scope="module")
def blocks_gguf(wide_gguf, tmp_path_factory):
    f, rng = read_gguf(wide_gguf), np.random.default_rng(0)
    entries = []
    for t in f.tensors.values():
        ttype = TENSOR_TYPES_BY_NAME[BLOCK_TYPES.get(t.name, t.type.name)]
        raw = _random_blocks(ttype, t.n_elements, rng) if t.name in BLOCK_TYPES else f.raw(t.name)
        entries.append(TensorEntry(name=t.name, type=ttype, shape=t.shape, data=lambda raw=raw: raw))
    metadata = [(k, f.value_types[k], v) for k, v in f.metadata.items()]
    return write_gguf(tmp_path_factory.mktemp("gguf") / "blocks.gguf", metadata=metadata, tensors=entries)


def _random_blocks(ttype, n_elements: int, rng: np.random.Generator) -> np.ndarray:
    blocks = rng.integers(0, 256, size=(n_elements // ttype.block_size, ttype.type_size), dtype=np.uint8)
    for offset in F16_FIELDS[ttype.name]:
        blocks[:, offset:offset + 2] = rng.uniform(-1e-3, 1e-3, (len(blocks), 1)).astype(np.float16).view(np.uint8)
    if ttype.name == "MXFP4":
        blocks[:, 0] = rng.integers(118, 123, size=len(blocks))  # 2^-10 .. 2^-6
    return blocks.reshape(-1)


@pytest.mark.parametrize("ttype", ["IQ2_XXS", "TQ1_0", "IQ1_S", "Q8_K", "F64"])
def test_unsupported_tensor_type_names_it_and_lists_the_supported(tmp_path, wide_gguf, ttype):
    path = _rewrite(wide_gguf, tmp_path / "m.gguf", tensor_types={"blk.0.ffn_up.weight": ttype})
    with pytest.raises(CheckpointError, match=rf"blk.0.ffn_up.weight type='{ttype}'.*supported: F32, F16, BF16") as e:
        load_gguf(path)
    runs = str(e.value).split("supported: ")[1].split(", ")
    assert str(path) in str(e.value) and {"Q2_K", "Q3_K", "Q5_K", "IQ4_NL", "IQ4_XS", "MXFP4"} <= set(runs)


def test_every_block_type_loads_as_gguf_py_dequantizes_it(blocks_gguf):
    """Seven block types, each where the loader puts it (v and up: the last rows of qkv and gate|up)."""
    f = read_gguf(blocks_gguf)
    state = load_gguf(blocks_gguf).state_dict()
    for gguf_name, ours in [("token_embd.weight", "stack.embed.tokens"), ("output.weight", "lm_head"),
                            ("blk.0.attn_v.weight", "stack.blocks.0.attn.qkv"),
                            ("blk.0.attn_output.weight", "stack.blocks.0.attn.out"),
                            ("blk.0.ffn_up.weight", "stack.blocks.0.ffn.gate_up"),
                            ("blk.0.ffn_down.weight", "stack.blocks.0.ffn.down")]:
        t = f.tensors[gguf_name]
        reference = quants.dequantize(f.raw(gguf_name).reshape(t.shape[0], -1), GGMLQuantizationType[t.type.name])
        got = state[f"{ours}.weight"][-t.shape[0]:]
        assert np.array_equal(got.numpy().view(np.uint32), reference.view(np.uint32)), gguf_name


@pytest.mark.parametrize("ttype", sorted(set(BLOCK_TYPES.values())))
def test_block_data_shorter_than_its_type_needs_is_refused_before_reading(tmp_path, ttype):
    t = TENSOR_TYPES_BY_NAME[ttype]
    need = 2 * t.type_size  # two rows of one block
    blob = gguf(infos=[info("a", [t.block_size, 2], ttype=t.id)], data=b"\0" * (need - 1))
    start = len(blob) - need + 1
    expected = f"a offset=0: data [{start}, {start + need}) of shape [2, {t.block_size}] {ttype} ends past the end"
    with pytest.raises(CheckpointError, match=re.escape(expected)):
        _read(tmp_path, blob)
    with pytest.raises(CheckpointError, match=rf"a ne\[0\]={t.block_size // 2}.*{ttype} block size {t.block_size}"):
        _read(tmp_path, gguf(infos=[info("a", [t.block_size // 2], ttype=t.id)]))


def test_block_typed_file_truncated_through_its_data(tmp_path, blocks_gguf):
    blob = blocks_gguf.read_bytes()
    for cut in range(read_gguf(blocks_gguf).data_offset, len(blob), 4099):
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(blob[:cut])
        with pytest.raises(CheckpointError, match="ends past the end of the file"):
            load_gguf(path)
        path.unlink()


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
@pytest.mark.parametrize("source", ["tiny_gguf", "blocks_gguf"])  # f32, and the block types
def test_mutated_files_load_cleanly_or_raise_checkpoint_error(tmp_path, request, source, data):
    original = request.getfixturevalue(source)
    blob = bytearray(original.read_bytes())
    header = read_gguf(original).data_offset
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


@pytest.fixture(scope="module")
def gemma3_gguf(tmp_path_factory):
    """A two-layer Gemma 3 (layer 0 sliding, its own RoPE base), written by anatomy."""
    torch.manual_seed(0)
    config = get_preset("gemma-3-1b", vocab_size=12, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16,
                        d_ff=32, max_seq_len=64, sliding_window=4, sliding_window_layers=(0,), attn_scale=0.25,
                        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    tokens = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": [f"t{i}" for i in range(12)]}
    return save_gguf(build_model(config), tmp_path_factory.mktemp("gguf") / "g3.gguf", tokenizer_metadata=tokens)


BOOLS = (ValueType.ARRAY, ValueType.BOOL)
BAD_GEMMA3 = {
    "pattern of another length": ({"gemma3.attention.sliding_window_pattern": (BOOLS, [True])},
                                  "gemma3.attention.sliding_window_pattern=[True]: must be one bool per layer (2)"),
    "pattern as a string": ({"gemma3.attention.sliding_window_pattern": (STRING, "6")},
                            "gemma3.attention.sliding_window_pattern='6'"),
    "sliding base zero": ({"gemma3.rope.freq_base_swa": (FLOAT32, 0.0)}, "gemma3.rope.freq_base_swa=0.0"),
    "negative soft-cap": ({"gemma3.final_logit_softcapping": (FLOAT32, -2.0)}, "gemma3.final_logit_softcapping=-2.0"),
}


def test_gemma3_metadata_reads_back(gemma3_gguf):
    config = load_gguf(gemma3_gguf).config
    assert (config.sliding_window_layers, config.sliding_rope_theta, config.qk_norm) == ((0,), 10000.0, True)


@pytest.mark.parametrize("case", sorted(BAD_GEMMA3))
def test_gemma3_metadata_that_makes_no_model(tmp_path, gemma3_gguf, case):
    set_keys, expected = BAD_GEMMA3[case]
    path = _rewrite(gemma3_gguf, tmp_path / "m.gguf", set_keys=set_keys)
    with pytest.raises(CheckpointError) as e:
        load_gguf(path)
    assert str(path) in str(e.value) and expected in str(e.value), str(e.value)
