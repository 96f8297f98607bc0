"""Where the native library comes from, first found first:

    the package's _build/   `make kernels`, or `pip install` where torch was importable (setup.py)
    the per-user cache      <cache_dir()>/native/: compiled there on first use, once per source and torch
                            version (build.py's digest), a line on stderr at its start and one at its end;
                            a file lock keeps two processes from both compiling, and the library is
                            renamed into place whole

obtain() gives the library's path, or None and why there is none: no compiler, a failed build (its
output kept beside it, and not retried by every process: `anatomy doctor --build` retries), or
$ANATOMY_NATIVE_BUILD=0 (never compile on first use). missing() says why without compiling.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from anatomy.kernels.cache_dir import cache_dir
from anatomy.kernels.native import build

BUILD_ENV = "ANATOMY_NATIVE_BUILD"  # "0": never compile on first use
SECONDS_PER_SOURCE = 7  # one source's compile on one core, for the estimate on the first line


def cache_directory() -> Path:
    """Where a first use compiles the library (not created here)."""
    return cache_dir() / "native"


def find() -> Path | None:
    """The library of this source and torch version where one is built; None when none is."""
    name = build.library_name()
    for directory in (build.BUILD, cache_directory()):
        if (directory / name).is_file():
            return directory / name
    return None


def failure_log() -> Path:
    """The compiler's output of a first-use build that failed (there only after a failure)."""
    return cache_directory() / (Path(build.library_name()).stem + ".log")


def missing() -> str:
    """Why no library is found, and what a first use will do about it (nothing is compiled here)."""
    blocked = _blocked(retry=False)
    if blocked:
        return blocked
    return (f"not compiled for this torch yet: the first use compiles it with {build.compiler()} "
            f"(~{estimate_s()} s) into {cache_directory()}")


def obtain(*, retry: bool = False) -> tuple[Path | None, str]:
    """The library's path, compiling it into the per-user cache when none is found, or (None, why not).
    `retry`: compile even after a failed build or under $ANATOMY_NATIVE_BUILD=0."""
    path = find()
    if path is not None:
        return path, ""
    blocked = _blocked(retry)
    if blocked:
        return None, blocked
    directory = cache_directory()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return None, f"the cache {directory} is not writable ({exc.strerror})"
    with _locked(directory / ".lock"):
        path = find()  # another process may have compiled it while this one waited
        if path is not None:
            return path, ""
        blocked = _blocked(retry)
        return (None, blocked) if blocked else _compile(directory)


def estimate_s() -> int:
    """About how long a build takes here: the sources a core at a time, and the link."""
    cores = min(os.cpu_count() or 1, len(build.SOURCES))
    return math.ceil(len(build.SOURCES) / cores) * SECONDS_PER_SOURCE + 2


def _blocked(retry: bool) -> str:
    """Why no first-use build is attempted now ("" when one is)."""
    if os.environ.get(BUILD_ENV) == "0" and not retry:
        return f"not compiled for this torch, and ${BUILD_ENV}=0 turns off compiling them on first use"
    if shutil.which(build.compiler()) is None:
        return f"no C++ compiler {build.compiler()!r} found"
    if failure_log().is_file() and not retry:
        return f"their build failed (the compiler's output: {failure_log()})"
    return ""


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` inside (a line on stderr while another process holds it)."""
    try:
        import fcntl
    except ImportError:  # no POSIX locks: two first uses at once may both compile (each renames whole)
        yield
        return
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            print("anatomy: waiting for another process compiling the native kernels...", file=sys.stderr,
                  flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _compile(directory: Path) -> tuple[Path | None, str]:
    """Compile into `directory` (objects in a temporary folder), the compiler's output to a log that is
    kept only when the build fails."""
    import torch

    print(f"anatomy: compiling the native kernels once for torch {torch.__version__} (~{estimate_s()} s)...",
          file=sys.stderr, flush=True)
    start, log = time.monotonic(), failure_log()
    partial_log = log.with_name(f".{log.name}.{os.getpid()}")
    try:
        with open(partial_log, "w") as output, tempfile.TemporaryDirectory(dir=directory) as objects:
            path = _build_logged(directory, Path(objects), output)
    except OSError as exc:
        partial_log.unlink(missing_ok=True)
        return None, f"the cache {directory} is not writable ({exc.strerror})"
    seconds = time.monotonic() - start
    if path is None:
        partial_log.replace(log)
        print(f"anatomy: the native kernels did not compile ({seconds:.0f} s; the compiler's output: {log})",
              file=sys.stderr, flush=True)
        return None, f"their build failed (the compiler's output: {log})"
    partial_log.unlink()
    log.unlink(missing_ok=True)  # a failure retried
    print(f"anatomy: native kernels compiled in {seconds:.0f} s ({path})", file=sys.stderr, flush=True)
    return path, ""


def _build_logged(directory: Path, objects: Path, output) -> Path | None:
    """build.build with the compiler's output to `output`; None when it fails (the reason written there)."""
    try:
        return build.build(directory, objects=objects, log=output, prune=False)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"anatomy: {exc}", file=output, flush=True)
        return None
