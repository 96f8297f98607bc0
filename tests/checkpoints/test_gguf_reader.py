"""read_gguf on files written by gguf-py's GGUFWriter (llama.cpp's own Python writer): every value
type, float and quantized tensors; and HF transformers reading a GGUF anatomy wrote."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import quants

from anatomy import build_model, get_preset
from anatomy.checkpoints.gguf import load_gguf, read_gguf, read_gguf_config, save_gguf
from anatomy.checkpoints.gguf_dequant import dequantize
from anatomy.checkpoints.gguf_types import ValueType as V

SCALARS = {  # key: (gguf-py method, value, our type)
    "t.u8": ("add_uint8", 200, V.UINT8), "t.i8": ("add_int8", -100, V.INT8),
    "t.u16": ("add_uint16", 60000, V.UINT16), "t.i16": ("add_int16", -30000, V.INT16),
    "t.u32": ("add_uint32", 4_000_000_000, V.UINT32), "t.i32": ("add_int32", -2_000_000_000, V.INT32),
    "t.u64": ("add_uint64", 2**63 + 5, V.UINT64), "t.i64": ("add_int64", -(2**62), V.INT64),
    "t.f32": ("add_float32", 0.5, V.FLOAT32), "t.f64": ("add_float64", 1e-300, V.FLOAT64),
    "t.bool": ("add_bool", True, V.BOOL), "t.str": ("add_string", "héllo ✓ 你好", V.STRING),
}


@pytest.fixture(scope="module")
def gguf_py_file(tmp_path_factory):
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("gguf") / "gguf-py.gguf"
    w = gguf.GGUFWriter(str(path), arch="llama")
    for key, (method, value, _) in SCALARS.items():
        getattr(w, method)(key, value)
    w.add_array("t.ints", [3, -1, 7])
    w.add_array("t.floats", [0.25, -2.0])
    w.add_array("t.strs", ["a", "", "ü"])
    w.add_array("t.nested", [[1, 2], [3]])
    tensors = {"f32": rng.standard_normal((3, 32)).astype(np.float32),
               "f16": rng.standard_normal((2, 4, 8)).astype(np.float16),
               "q8": rng.standard_normal((4, 64)).astype(np.float32),
               "q4k": rng.standard_normal((2, 256)).astype(np.float32)}
    w.add_tensor("f32", tensors["f32"])
    w.add_tensor("f16", tensors["f16"])
    q8 = quants.quantize(tensors["q8"], Q.Q8_0)
    w.add_tensor("q8", q8, raw_shape=q8.shape, raw_dtype=Q.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, tensors, q8


def test_every_value_type_reads_back(gguf_py_file):
    f = read_gguf(gguf_py_file[0])
    assert f.metadata["general.architecture"] == "llama"
    for key, (_, value, vtype) in SCALARS.items():
        assert f.value_types[key] == (vtype,)
        assert f.metadata[key] == (pytest.approx(value) if vtype == V.FLOAT32 else value), key
    assert f.value_types["t.ints"] == (V.ARRAY, V.INT32) and f.metadata["t.ints"].tolist() == [3, -1, 7]
    assert f.metadata["t.floats"].tolist() == [0.25, -2.0]
    assert f.metadata["t.strs"] == ["a", "", "ü"]
    assert f.value_types["t.nested"] == (V.ARRAY, V.ARRAY, V.INT32)
    assert [a.tolist() for a in f.metadata["t.nested"]] == [[1, 2], [3]]


def test_tensors_read_back_in_torch_order(gguf_py_file):
    path, tensors, q8 = gguf_py_file
    f = read_gguf(path)
    assert [(t.name, t.shape, t.type.name) for t in f.tensors.values()] == [
        ("f32", (3, 32), "F32"), ("f16", (2, 4, 8), "F16"), ("q8", (4, 64), "Q8_0")]
    for name in ("f32", "f16"):
        t = f.tensors[name]
        np.testing.assert_array_equal(dequantize(f.raw(name), t.type, t.shape).numpy(), tensors[name])
    ours = dequantize(f.raw("q8"), f.tensors["q8"].type, (4, 64))
    np.testing.assert_array_equal(ours.numpy(), quants.dequantize(q8, Q.Q8_0))
    assert np.abs(ours.numpy() - tensors["q8"]).max() < 0.05  # and it is the data, quantized


@torch.no_grad()
def test_hf_transformers_reads_what_anatomy_writes(tmp_path):
    """HF's GGUF loader undoes llama.cpp's Q/K row order with its own code: a GQA llama written by
    anatomy and read by HF computes anatomy's logits."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = get_preset("llama-7b", vocab_size=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=96,
                        max_seq_len=128, bos_token_id=1, eos_token_id=2)
    model = build_model(config).eval()
    tokens = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": [f"t{i}" for i in range(64)],
              "tokenizer.ggml.merges": ["t 0"], "tokenizer.ggml.token_type": [1] * 64}
    path = save_gguf(model, tmp_path / "tiny.gguf", tokenizer_metadata=tokens)
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 7, 3, 60, 22, 9, 41]])
    assert (model(ids) - hf(ids).logits).abs().max().item() < 1e-5
    assert read_gguf_config(path) == config
    assert torch.equal(load_gguf(path)(ids), model(ids))


def test_alignment_1_puts_tensors_at_odd_offsets_and_they_still_read(tmp_path):
    from anatomy.checkpoints.gguf_types import TENSOR_TYPES_BY_NAME as T
    from anatomy.checkpoints.gguf_writer import TensorEntry, write_gguf

    half = np.array([1.5, -2.0, 3.25], dtype=np.float16)  # 6 bytes: the next tensor starts unaligned
    full = np.arange(5, dtype=np.float32)
    q8 = quants.quantize(np.linspace(-1, 1, 32, dtype=np.float32)[None], Q.Q8_0)  # 34 bytes
    tensors = [TensorEntry(name="h", type=T["F16"], shape=(3,), data=lambda: half),
               TensorEntry(name="f", type=T["F32"], shape=(5,), data=lambda: full),
               TensorEntry(name="q", type=T["Q8_0"], shape=(1, 32), data=lambda: q8),
               TensorEntry(name="g", type=T["F32"], shape=(5,), data=lambda: full)]
    metadata = [("general.architecture", (V.STRING,), "x"), ("general.alignment", (V.UINT32,), 1)]
    f = read_gguf(write_gguf(tmp_path / "a1.gguf", metadata=metadata, tensors=tensors, alignment=1))
    assert f.alignment == 1 and any(f.tensors[n].offset % 4 for n in ("f", "g"))  # an F32 tensor off its alignment
    read = {name: dequantize(f.raw(name), t.type, t.shape) for name, t in f.tensors.items()}
    np.testing.assert_array_equal(read["h"].numpy(), half)
    np.testing.assert_array_equal(read["f"].numpy(), full)
    np.testing.assert_array_equal(read["g"].numpy(), full)
    np.testing.assert_array_equal(read["q"].numpy(), quants.dequantize(q8, Q.Q8_0))
