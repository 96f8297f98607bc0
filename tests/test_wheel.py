"""`pip install .` (not editable) gives a working anatomy: the wheel is built offline from a copy of
the source, holds every file under src/anatomy (page templates and assets included), and its
console script, installed into a fresh virtual environment and run from outside the source tree,
lists the presets and writes an inspect page with the templates' CSS inlined.

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


def _pip(*args: str, cwd: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args], cwd=cwd, check=True,
                   timeout=600, env=_clean_env())


def _clean_env() -> dict[str, str]:
    """This environment without PYTHONPATH (which could point at the source tree) nor a venv of its own."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    source = tmp_path_factory.mktemp("source")
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "_build"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("wheels")
    _pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(out), str(source), cwd=out)
    return next(out.glob("anatomy-*.whl"))


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
