"""checkpoints/source.py: what a model name or path is, decided once, before anything is read."""

from __future__ import annotations

import json

import pytest

import anatomy
from anatomy.checkpoints.hf_config import config_to_hf
from anatomy.checkpoints.registry import resolve
from anatomy.checkpoints.source import find_model
from anatomy.errors import CheckpointError


@pytest.fixture
def folders(tmp_path):
    """A config alone, and the same config with weights (a tiny GPT-2)."""
    config = anatomy.get_preset("gpt2", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=64, max_seq_len=16,
                                bos_token_id=0, eos_token_id=0)
    anatomy.save(anatomy.build_model(config), tmp_path / "hf")
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.json").write_text(json.dumps(config_to_hf(config)))
    return tmp_path


def _seen(source) -> tuple:
    return source.kind, source.with_weights, source.installed


def test_each_form(folders, monkeypatch):
    gguf = resolve("smollm2-135m-instruct")
    assert _seen(find_model("llama-7b")) == ("preset", False, None)
    assert _seen(find_model(str(folders / "config"))) == ("config", False, None)
    assert _seen(find_model(folders / "config" / "config.json")) == ("config", False, None)
    assert _seen(find_model(str(folders / "hf"))) == ("hf", True, None)
    assert _seen(find_model(str(folders / "hf" / "config.json"))) == ("config", True, None)  # weights beside it
    assert _seen(find_model(str(folders / "hf" / "model.safetensors"))) == ("hf", True, None)
    assert _seen(find_model(str(gguf))) == ("gguf", True, None)
    assert _seen(find_model("smollm2-135m-instruct")) == ("gguf", True, "smollm2-135m-instruct")
    assert _seen(find_model("all-minilm-l6-v2")) == ("hf", True, "all-minilm-l6-v2")
    monkeypatch.chdir(folders)
    (folders / "gpt2").mkdir()  # a folder named like a preset is the folder
    assert find_model("gpt2").kind != "preset"


def test_the_checkpoint_anatomy_load_reads(folders):
    assert find_model(str(folders / "hf" / "config.json")).checkpoint() == folders / "hf"
    assert find_model(str(folders / "hf" / "model.safetensors")).checkpoint() == folders / "hf"
    assert find_model("smollm2-135m-instruct").checkpoint() == resolve("smollm2-135m-instruct")


@pytest.mark.parametrize("name, message", [
    ("gpt2", "'gpt2' is a preset, a configuration without weights: serving needs weights: an installed model name "
             "(all-minilm-l6-v2, smollm2-135m-instruct), a .gguf file or an HF directory with model.safetensors "
             "(`anatomy inspect --model gpt2` shows a preset's anatomy)"),
    ("config", "config: a config without weights (neither model.safetensors nor model.safetensors.index.json is "
               "there, in it): serving needs weights"),
    ("config/config.json", "config/config.json: a config without weights (neither model.safetensors nor "
                           "model.safetensors.index.json is there, beside it)"),
])
def test_no_weights_is_one_message_naming_it_and_the_rule(folders, name, message):
    given = name if name == "gpt2" else str(folders / name)
    with pytest.raises(CheckpointError) as caught:
        find_model(given).checkpoint("serving")
    assert message in str(caught.value)


def test_unknown_names_and_missing_paths(tmp_path):
    with pytest.raises(CheckpointError, match="'smolm2-135m' is neither an existing file or directory nor a known "
                                              "model name; did you mean 'smollm2-135m-instruct'"):
        find_model("smolm2-135m")
    with pytest.raises(CheckpointError, match="no/such/config.json: no such file or directory"):
        find_model("no/such/config.json")
