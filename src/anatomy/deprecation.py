"""Old spellings that still work for a release, with a warning that names the new one.

    deprecated("dtype='float16' is deprecated, use 'f16'")

From Python the warning is a `DeprecationWarning` pointing at the caller's line (the first frame
outside anatomy), so Python shows it where a script calls anatomy and tests can turn it into an
error. The `anatomy` command shows every one of them as a one-line note on stderr (cli.py).
"""

from __future__ import annotations

import sys
import warnings


class AnatomyDeprecationWarning(DeprecationWarning):
    """An old spelling of an option, a dtype or a call form: it works, and will be removed."""


def deprecated(message: str) -> None:
    """Warn that something is deprecated; `message` says what and what to use instead."""
    warnings.warn(message, AnatomyDeprecationWarning, stacklevel=_outside_anatomy())


def _outside_anatomy() -> int:
    """The stacklevel of the first frame whose code is neither anatomy's nor the import system's
    (the user's call, or the user's import of a moved module). warnings.warn does not count the
    import system's bootstrap frames, so neither does this."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] in ("anatomy", "importlib"):
        frame = frame.f_back
        if frame is not None and not _bootstrap(frame):
            level += 1
    return level


def _bootstrap(frame) -> bool:
    filename = frame.f_code.co_filename
    return "importlib" in filename and "_bootstrap" in filename


def renamed_names(module: str, names: dict[str, str], space: dict):
    """A module's __getattr__ for names it renamed ({old: new} of the module whose globals are `space`):
    the old name gives the new object, with a deprecation warning."""
    def __getattr__(name: str):
        if name in names:
            deprecated(f"{module}.{name} is deprecated; use {names[name]}")
            return space[names[name]]
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    return __getattr__
