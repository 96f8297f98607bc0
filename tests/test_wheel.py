"""`pip install .` (not editable) gives a working anatomy: the wheel is built offline from a copy of
the source, holds every file under src/anatomy (page templates and assets included) and the native
library setup.py compiled into it (from the objects `make kernels` left, where they are there), and its
console script, installed into a fresh virtual environment and run from outside the source tree,
lists the presets and writes an inspect page with the templates' CSS inlined; the installed package
loads its native library without compiling anything, with this process's vector code. Built where
no compiler is, the wheel builds all the same, without the library.

The fresh environment reaches the installed dependencies (torch, ...) through a .pth file added
after the wheel is installed, so that pip never sees (or touches) the anatomy installed here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _pip(*args: str, cwd: Path, **env: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args], cwd=cwd, check=True,
                   timeout=900, env={**_clean_env(), **env})


def _clean_env() -> dict[str, str]:
    """This environment without PYTHONPATH (which could point at the source tree) nor a venv of its own."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}


def _build_wheel(tmp_path_factory, **env: str) -> Path:
    source = tmp_path_factory.mktemp("source")
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "_build"))
    objects = Path("anatomy/kernels/native/_build/objects")
    if (ROOT / "src" / objects).is_dir():  # compiled objects of unchanged sources are reused: the wheel only links
        shutil.copytree(ROOT / "src" / objects, source / "src" / objects)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("wheels")
    _pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(out), str(source), cwd=out, **env)
    return next(out.glob("anatomy-*.whl"))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return _build_wheel(tmp_path_factory)


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    env = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    python = env / "bin" / "python"
    _pip("--python", str(python), "install", "--no-deps", "--no-index", "--ignore-installed", str(wheel), cwd=env)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    here = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "zz_dependencies.pth").write_text("\n".join(sorted(here)) + "\n")  # after the wheel's own files
    return env


def test_the_wheel_holds_every_file_of_the_package(wheel):
    """Every source file (not caches, dotfiles or a native build's output) is in the wheel."""
    names = set(zipfile.ZipFile(wheel).namelist())
    files = {str(p.relative_to(ROOT / "src")) for p in (ROOT / "src" / "anatomy").rglob("*")
             if p.is_file() and not {"__pycache__", "_build"} & set(p.parts) and p.suffix != ".pyc"
             and not p.name.startswith(".")}
    assert files - names == set()
    assert {"anatomy/analysis/page/templates/inspect.html.j2", "anatomy/analysis/page/assets/page.css",
            "anatomy/text/__init__.py", "anatomy/kernels/plan.py", "anatomy/inference/engine/__init__.py",
            "anatomy/analysis/profile/api.py", "anatomy/kernels/native/gemv.cpp"} <= names


def _run(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    out = subprocess.run([str(venv / "bin" / "anatomy"), *args], cwd=cwd, capture_output=True, text=True,
                         timeout=300, env=_clean_env())
    assert out.returncode == 0, out.stderr
    return out


def test_the_installed_command_works_outside_the_source_tree(venv, tmp_path):
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import anatomy; print(anatomy.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, check=True, env=_clean_env()).stdout
    assert where.startswith(str(venv)) and not where.startswith(str(ROOT))
    assert "llama-70b" in _run(venv, "presets", cwd=tmp_path).stdout
    _run(venv, "inspect", "--model", "gpt2", "--html", "x.html", "--seq-len", "16", cwd=tmp_path)
    page = (tmp_path / "x.html").read_text(encoding="utf-8")
    css = (ROOT / "src/anatomy/analysis/page/assets/page.css").read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and css.splitlines()[0] in page and "<svg" in page


def test_every_module_imports_from_the_wheel(venv, tmp_path):
    script = ("import importlib, pkgutil, anatomy\n"
              "names = [m.name for m in pkgutil.walk_packages(anatomy.__path__, 'anatomy.')\n"
              "         if not m.name.endswith('__main__')]  # `python -m anatomy` runs the command\n"
              "for name in names:\n"
              "    importlib.import_module(name)\n"
              "print(len(names))\n")
    out = subprocess.run([str(venv / "bin" / "python"), "-W", "ignore", "-c", script], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300, env=_clean_env())
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) > 150


def _libraries(wheel: Path) -> list[str]:
    return [n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("anatomy/kernels/native/_build/")]


def test_the_wheel_carries_the_native_library_of_this_source_and_torch(wheel):
    from anatomy.kernels.native.build import library_name

    assert _libraries(wheel) == [f"anatomy/kernels/native/_build/{library_name()}"]
    assert "-none-any" not in wheel.name  # a platform wheel: it holds a compiled library


def test_the_installed_package_runs_its_native_kernels(venv, tmp_path):
    """Fast where installed: the wheel's library loads, nothing is compiled on first use (turned off
    here, with an empty cache), and it runs the vector code this process runs."""
    from anatomy.kernels import native

    script = ("from anatomy.kernels import native\n"
              "from anatomy.kernels.native import library\n"
              "print(native.loaded(), native.isa(), library.find())\n")
    env = {**_clean_env(), "ANATOMY_NATIVE_BUILD": "0", "ANATOMY_CACHE_DIR": str(tmp_path / "cache")}
    env.pop(native.ISA_ENV, None)
    out = subprocess.run([str(venv / "bin" / "python"), "-c", script], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    loaded, isa, path = out.stdout.split()
    assert loaded == "True" and "native kernels unavailable" not in out.stderr
    with native.limited("amx") as cpus_own:  # no limit but the CPU's
        assert isa == cpus_own and path.startswith(str(venv))


def test_a_wheel_built_without_a_compiler_builds_without_the_library(tmp_path_factory):
    wheel = _build_wheel(tmp_path_factory, CXX="/nonexistent/g++")
    assert _libraries(wheel) == [] and "anatomy/kernels/native/gemv.cpp" in zipfile.ZipFile(wheel).namelist()
