"""anatomy.load / anatomy.save / load_config: dispatch by name or path, and clear errors."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
import torch

import anatomy
from anatomy.checkpoints.loader import load_config
from anatomy.errors import CheckpointError, InputError


@pytest.fixture()
def gpt2_dir(tmp_path):
    config = anatomy.get_preset("gpt2", d_model=16, n_layers=1, n_heads=2, d_ff=32, vocab_size=50, max_seq_len=8,
                                bos_token_id=1, eos_token_id=2)
    model = anatomy.build_model(config).eval()
    anatomy.save(model, tmp_path / "m")
    return model, tmp_path / "m"


def test_load_config_of_a_preset_name():
    assert load_config("llama-3-8b") == anatomy.get_preset("llama-3-8b")


def test_load_config_of_hf_directory_and_its_files(gpt2_dir):
    model, directory = gpt2_dir
    for path in (directory, directory / "config.json", str(directory)):
        assert load_config(path) == model.config


def test_load_accepts_the_directory_or_its_files(gpt2_dir):
    model, directory = gpt2_dir
    ids = torch.tensor([[1, 2, 3]])
    for path in (directory, directory / "model.safetensors", directory / "config.json"):
        with torch.no_grad():
            assert (anatomy.load(path)(ids) - model(ids)).abs().max() <= 1e-6  # Conv1D views: another sum order


@pytest.mark.parametrize("dtype", [torch.float16, "f16"])
def test_load_dtype(gpt2_dir, dtype):
    loaded = anatomy.load(gpt2_dir[1], dtype=dtype)
    assert {p.dtype for p in loaded.parameters()} == {torch.float16}


def test_load_dtype_old_spelling_is_deprecated(gpt2_dir):
    with pytest.deprecated_call(match="dtype='float16' is deprecated, use 'f16'"):
        loaded = anatomy.load(gpt2_dir[1], dtype="float16")
    assert {p.dtype for p in loaded.parameters()} == {torch.float16}


@pytest.mark.parametrize("dtype", ["fp8", torch.float64, "int8"])
def test_load_refuses_other_dtypes(gpt2_dir, dtype):
    with pytest.raises(InputError, match=r"dtype=.* is not one of f32, f16, bf16"):
        anatomy.load(gpt2_dir[1], dtype=dtype)


@pytest.mark.parametrize("path", ["no/such/dir", "missing.gguf", "nothing.json", Path("plain-name")])
def test_missing_path_is_named(path):
    with pytest.raises(CheckpointError, match=f"{path}: no such file or directory"):
        anatomy.load(path)


def test_unknown_name_goes_to_the_registry():
    with pytest.raises(CheckpointError, match="'smolm2-135m-instruct' is neither an existing file.*did you mean"):
        anatomy.load("smolm2-135m-instruct")


def test_file_that_is_not_a_checkpoint(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"\0")
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        anatomy.load(tmp_path / "weights.bin")


@pytest.fixture()
def fake_gguf(monkeypatch):
    """Stands in for anatomy.checkpoints.gguf to see what the loader passes it."""
    from anatomy.checkpoints.gguf import SAVE_DTYPES

    calls = []
    module = types.ModuleType("anatomy.checkpoints.gguf")
    module.SAVE_DTYPES = SAVE_DTYPES
    module.load_gguf = lambda path, dtype, weights: calls.append(("load", path, dtype, weights)) or "model"
    module.save_gguf = lambda model, path, dtype, **_: calls.append(("save", path, dtype))
    module.read_gguf_config = lambda path: calls.append(("config", path)) or "config"
    monkeypatch.setitem(sys.modules, "anatomy.checkpoints.gguf", module)
    return calls


def test_gguf_paths_dispatch_to_the_gguf_module(fake_gguf, tmp_path, gpt2_dir):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    assert anatomy.load(path, dtype=torch.float16) == "model"
    assert load_config(str(path)) == "config"
    anatomy.save(gpt2_dir[0], tmp_path / "out.gguf", dtype=torch.float16)
    anatomy.save(gpt2_dir[0], tmp_path / "out32.gguf", dtype="f32")
    anatomy.save(gpt2_dir[0], tmp_path / "own.gguf")  # None: the model's own dtype
    anatomy.save(gpt2_dir[0].half(), tmp_path / "own16.gguf")
    assert fake_gguf == [("load", path, torch.float16, "auto"), ("config", path), ("save", tmp_path / "out.gguf", "f16"),
                         ("save", tmp_path / "out32.gguf", "f32"), ("save", tmp_path / "own.gguf", "f32"),
                         ("save", tmp_path / "own16.gguf", "f16")]


def test_gguf_save_refuses_other_dtypes(fake_gguf, tmp_path, gpt2_dir):
    with pytest.raises(InputError, match=r"dtype=torch.bfloat16 is not one of f32, f16$"):
        anatomy.save(gpt2_dir[0], tmp_path / "x.gguf", dtype=torch.bfloat16)
    with pytest.raises(InputError, match=r"the model's weights are bf16.*pass dtype= one of f32, f16"):
        anatomy.save(gpt2_dir[0].bfloat16(), tmp_path / "x.gguf")


def test_dtype_none_keeps_the_files_own_in_both_formats(tmp_path):
    """An f16 GGUF loads as f16 with dtype=None, as an f16 HF directory does; a quantized GGUF
    (the embedded Q4_1 SmolLM2's matrices) is dequantized to f32."""
    from anatomy.checkpoints.gguf import save_gguf
    from anatomy.checkpoints.loader import _gguf_file_dtype
    from anatomy.checkpoints.registry import resolve

    config = anatomy.get_preset("smollm2-135m", d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64,
                                vocab_size=16, bos_token_id=None, eos_token_id=None)
    model = anatomy.build_model(config)
    tokens = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": [f"t{i}" for i in range(16)]}
    save_gguf(model, tmp_path / "m16.gguf", dtype="f16", tokenizer_metadata=tokens)
    anatomy.save(model.half(), tmp_path / "hf16")
    for path in (tmp_path / "m16.gguf", tmp_path / "hf16"):
        assert anatomy.load(path, dtype=None).lm_head.weight.dtype == torch.float16
        assert anatomy.load(path, weights="f32").lm_head.weight.dtype == torch.float32
    # weights="auto" (the default) keeps the GGUF file's f16 matrices beside f32 norms; HF's stay dense
    assert anatomy.load(tmp_path / "m16.gguf").lm_head.compact.weight.dtype == torch.float16
    assert anatomy.load(tmp_path / "hf16").lm_head.weight.dtype == torch.float32
    assert _gguf_file_dtype(resolve("smollm2-135m-instruct")) == torch.float32


def test_installed_bert_matches_hf():
    """The embedded all-MiniLM-L6-v2 (a real BertModel checkpoint, with its position_ids buffer)
    loads by name and matches HF's BertModel on it."""
    transformers = pytest.importorskip("transformers")
    from anatomy.checkpoints.registry import resolve

    try:
        directory = resolve("all-minilm-l6-v2")
    except CheckpointError as e:
        pytest.skip(str(e))
    ours = anatomy.load("all-minilm-l6-v2")
    hf = transformers.BertModel.from_pretrained(directory).eval()
    ids = torch.tensor([[101, 7592, 2088, 999, 102, 0], [101, 2023, 2003, 1037, 3231, 102]])
    mask = (ids != 0).long()
    with torch.no_grad():
        expected = hf(ids, attention_mask=mask).last_hidden_state
        got = ours(ids, attention_mask=mask)
    assert (got - expected)[mask.bool()].abs().max() <= 1e-4
    assert load_config("all-minilm-l6-v2") == ours.config
    assert json.loads((directory / "config.json").read_text())["hidden_size"] == ours.config.d_model == 384


def test_installed_gguf_config_is_the_preset():
    """The embedded SmolLM2 GGUF's metadata describes the smollm2-135m preset (its pad id aside)."""
    try:
        config = load_config("smollm2-135m-instruct")
    except CheckpointError as e:
        pytest.skip(str(e))
    assert config.replace(pad_token_id=None) == anatomy.get_preset("smollm2-135m")


@pytest.mark.parametrize("call, message", [
    (lambda: anatomy.load(123), "expected a model name or a path, got int: 123"),
    (lambda: anatomy.load_config(None), "expected a model name or a path, got NoneType"),
    (lambda: anatomy.load_tokenizer(["x"]), "expected a model name or a path, got list"),
    (lambda: anatomy.save("a model", "x.gguf"), r"save\(\) writes an anatomy model .*got str"),
])
def test_wrong_argument_types_are_input_errors(call, message):
    with pytest.raises(InputError, match=message):
        call()


@pytest.mark.parametrize("name", ["m.gguf", "hf"])
def test_unwritable_destination_is_an_input_error_naming_it(gpt2_dir, tmp_path, name):
    (tmp_path / "afile").write_text("")
    missing = tmp_path / "no" / "such" / "dir"
    with pytest.raises(InputError, match=f"{tmp_path / 'afile' / name}: cannot write it"):
        anatomy.save(gpt2_dir[0], tmp_path / "afile" / name)
    if name.endswith(".gguf"):
        with pytest.raises(InputError, match=f"{missing / name}: cannot write it: the directory {missing} does not"):
            anatomy.save(gpt2_dir[0], missing / name)
