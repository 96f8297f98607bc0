"""Where the native library comes from (kernels/native/library.py): the package's build, else the
per-user cache, compiled there on first use once (a file lock between concurrent first uses, the start
and the end said on stderr), or why not: no compiler, $ANATOMY_NATIVE_BUILD=0, a failed build (kept,
not retried until asked). build.build is replaced by a stand-in that writes the library file, so
these tests compile nothing; the real build is tests/test_wheel.py's and `make kernels`'."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest

from anatomy.kernels import native
from anatomy.kernels.native import build, library

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def nothing_built(monkeypatch, tmp_path):
    """No library in the package, an empty per-user cache, a compiler that exists (this Python)."""
    monkeypatch.setattr(build, "BUILD", tmp_path / "package_build")
    monkeypatch.setenv("ANATOMY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", sys.executable)
    monkeypatch.delenv(library.BUILD_ENV, raising=False)
    return tmp_path


@pytest.fixture
def fake_build(monkeypatch):
    """build.build replaced: writes the library file after `delay` seconds (or raises `error`); the
    directories it was asked to build into, in order."""
    calls = []

    def stand_in(directory, *, objects=None, log=None, prune=True):
        calls.append(directory)
        time.sleep(stand_in.delay)
        if stand_in.error is not None:
            log.write("gemv.cpp:1: error: something\n")
            raise stand_in.error
        path = directory / build.library_name()
        path.write_bytes(b"library")
        return path

    stand_in.delay, stand_in.error = 0.0, None
    monkeypatch.setattr(build, "build", stand_in)
    stand_in.calls = calls
    return stand_in


def test_the_packages_library_is_found_first(nothing_built, fake_build):
    build.BUILD.mkdir()
    (build.BUILD / build.library_name()).write_bytes(b"library")
    assert library.obtain() == (build.BUILD / build.library_name(), "")
    assert fake_build.calls == []


def test_a_first_use_compiles_into_the_cache_once_and_says_so(nothing_built, fake_build, capsys):
    path, why = library.obtain()
    assert (path, why) == (library.cache_directory() / build.library_name(), "")
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2
    assert err[0].startswith("anatomy: compiling the native kernels once for torch") and err[0].endswith(" s)...")
    assert err[1].startswith("anatomy: native kernels compiled in") and str(path) in err[1]
    assert library.obtain() == (path, "") and len(fake_build.calls) == 1  # found, not compiled again
    assert library.find() == path and not library.failure_log().exists()


def test_two_first_uses_at_once_compile_once(nothing_built, fake_build, capsys):
    fake_build.delay = 0.5
    results = []
    threads = [threading.Thread(target=lambda: results.append(library.obtain())) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(fake_build.calls) == 1
    assert results == [(library.cache_directory() / build.library_name(), "")] * 2
    assert "waiting for another process compiling the native kernels" in capsys.readouterr().err


@pytest.mark.parametrize("env, reason", [
    ({"CXX": "/nonexistent/g++"}, "no C++ compiler '/nonexistent/g++' found"),
    ({"CXX": "", "PATH": "/nonexistent"}, "no C++ compiler 'g++' found"),
    ({library.BUILD_ENV: "0"}, "$ANATOMY_NATIVE_BUILD=0 turns off compiling them on first use"),
])
def test_without_a_compiler_or_when_turned_off_nothing_is_compiled(nothing_built, fake_build, monkeypatch, env,
                                                                     reason):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    path, why = library.obtain()
    assert path is None and reason in why
    assert reason in library.missing()
    assert fake_build.calls == []


def test_a_failed_build_keeps_its_output_and_is_retried_only_when_asked(nothing_built, fake_build, capsys):
    fake_build.error = subprocess.CalledProcessError(1, ["g++"])
    path, why = library.obtain()
    assert path is None and why == f"their build failed (the compiler's output: {library.failure_log()})"
    assert "error: something" in library.failure_log().read_text()
    assert "anatomy: the native kernels did not compile" in capsys.readouterr().err
    assert library.obtain() == (None, why) and len(fake_build.calls) == 1  # not every process again
    assert library.missing() == why
    fake_build.error = None
    path, why = library.obtain(retry=True)
    assert path == library.cache_directory() / build.library_name() and why == ""
    assert not library.failure_log().exists() and len(fake_build.calls) == 2


def test_the_notice_is_said_once_per_process(monkeypatch):
    monkeypatch.setitem(native._state, "said", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        native._unavailable("no C++ compiler 'g++' found")
        native._unavailable("no C++ compiler 'g++' found")
    assert [str(w.message) for w in caught] == [(
        "native kernels unavailable (no C++ compiler 'g++' found); decoding runs on torch's kernels, ~0.6x the "
        "speed; `anatomy doctor` says more")]
    assert caught[0].category is RuntimeWarning


@pytest.mark.parametrize("machine, why", [
    ("aarch64", "their vector code is x86-64's; this aarch64 CPU runs their portable loops only"),
    ("x86_64", "this CPU has no AVX2 (with FMA and F16C)"),
])
def test_a_cpu_without_a_vector_path_is_a_reason_and_a_limit_is_not(monkeypatch, machine, why):
    if not native.loaded():
        pytest.skip("the native library is built by make")
    monkeypatch.setattr(native, "isa", lambda: "portable")
    monkeypatch.setattr(native.platform, "machine", lambda: machine)
    monkeypatch.delenv(native.ISA_ENV, raising=False)
    assert why in native.why_not()
    monkeypatch.setenv(native.ISA_ENV, "portable")
    assert native.why_not() == ""


GENERATE = """
import torch
import anatomy
torch.manual_seed(0)
model = anatomy.build_model(anatomy.get_preset("llama-7b", vocab_size=96, d_model=64, n_layers=2, n_heads=4,
                                               n_kv_heads=2, d_ff=128, max_seq_len=32))
for _ in range(2):  # a second call says nothing more
    print(len(anatomy.generate(model, [1, 2, 3], max_new_tokens=4, ignore_eos=True).token_ids))
"""


@pytest.mark.slow
def test_installed_without_a_compiler_the_package_works_and_says_why_once(tmp_path):
    """The package as `pip install` leaves it where no compiler was found: no library in it, none in
    the cache, no g++ on PATH; a model generates, and the one line naming the missing piece comes once."""
    shutil.copytree(ROOT / "src" / "anatomy", tmp_path / "src" / "anatomy",
                    ignore=shutil.ignore_patterns("__pycache__", "_build"))
    (tmp_path / "bin").mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("CXX", native.ISA_ENV, library.BUILD_ENV)}
    env.update(PYTHONPATH=str(tmp_path / "src"), PATH=str(tmp_path / "bin"), ANATOMY_CACHE_DIR=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-c", GENERATE], capture_output=True, text=True, timeout=600, env=env,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["4", "4"]
    notices = [line for line in out.stderr.splitlines() if "native kernels unavailable" in line]
    assert len(notices) == 1, out.stderr
    assert "(no C++ compiler 'g++' found); decoding runs on torch's kernels, ~0.6x the speed" in notices[0]
    assert not (tmp_path / "cache" / "native").exists()  # nothing compiled, nothing half-written
