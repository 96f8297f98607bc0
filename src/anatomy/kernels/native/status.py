"""What the native kernels are in this installation, for `anatomy doctor`: loaded, from where, the vector
code they run, or why not and the one command that fixes it. Nothing is compiled here (a library that
is found is loaded; one that is not is only described)."""

from __future__ import annotations

import platform
import shutil
import warnings
from typing import Any

from anatomy.kernels import native
from anatomy.kernels.native import build, library

BUILD_NOW = "anatomy doctor --build"


def describe() -> dict[str, Any]:
    """{loaded, path, isa, vector, why, fix, compiler, cache, cpu}: `isa` the vector code they run, `vector`
    whether the kernel plan offers them; `why` and `fix` empty when they run."""
    path = library.find()
    facts = {"loaded": False, "path": str(path) if path else None, "isa": None, "vector": False,
             "compiler": build.compiler(), "cache": str(library.cache_directory()), "cpu": platform.machine()}
    if path is None:
        return {**facts, "why": library.missing(), "fix": _build_fix()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the doctor says it itself, not as the engine's notice
        loaded = native.loaded()
        vector = loaded and native.available()
    why = native.why_not()
    if not loaded:
        return {**facts, "why": why, "fix": f"remove {path}, then {_build_fix()}"}
    return {**facts, "loaded": True, "isa": native.isa(), "vector": vector, "why": why, "fix": ""}


def _build_fix() -> str:
    """The one command that compiles the library here."""
    if shutil.which(build.compiler()) is None:
        return (f"install a C++ compiler (Debian, Ubuntu: `sudo apt-get install g++`) or point $CXX at one, "
                f"then `{BUILD_NOW}`")
    return f"`{BUILD_NOW}` (compiles them now, showing the compiler's output if it fails)"
