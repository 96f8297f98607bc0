"""setuptools' build (pyproject.toml holds the metadata) with anatomy's native kernels compiled into the
package where torch is importable in the build environment (`pip install --no-build-isolation`, `pip
install -e .` likewise, `pip wheel --no-build-isolation`): the wheel then carries the library, an
editable install finds it in the source tree's _build/. Elsewhere (an isolated build, no compiler, a
failed compile) the package is built without it and compiles it on first use (kernels/native/library.py);
the install never fails for it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

NATIVE = Path(__file__).resolve().parent / "src" / "anatomy" / "kernels" / "native"


def _torch_importable() -> bool:
    return importlib.util.find_spec("torch") is not None


def _native_build():
    """kernels/native/build.py loaded by path (it needs only the standard library and torch)."""
    spec = importlib.util.spec_from_file_location("anatomy_native_build", NATIVE / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithKernels(build_py):
    """build_py, then the native library into the package (an editable install: into the source tree)."""

    def run(self) -> None:
        super().run()
        if not _torch_importable():
            print("anatomy: torch is not importable while building: the native kernels compile on first use",
                  file=sys.stderr)
            return
        build = _native_build()
        into = build.BUILD if self.editable_mode else Path(self.build_lib) / "anatomy" / "kernels" / "native" / "_build"
        try:
            print(f"anatomy: compiling the native kernels with {build.compiler()}", file=sys.stderr)
            print(f"anatomy: {build.build(into, objects=build.BUILD / 'objects', prune=self.editable_mode)}",
                  file=sys.stderr)
        except Exception as exc:  # noqa: BLE001 - a compiler missing or failing leaves a working package
            print(f"anatomy: the native kernels did not compile ({exc}); they compile on first use",
                  file=sys.stderr)


class KernelsDistribution(Distribution):
    """A platform wheel where the native library may be in it (torch importable), else a pure one."""

    def has_ext_modules(self) -> bool:
        return _torch_importable()


setup(cmdclass={"build_py": BuildPyWithKernels}, distclass=KernelsDistribution)
