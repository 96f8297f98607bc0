"""Reading a text file the user named: UTF-8, and an InputError naming the file when it is not
readable text (the checkpoint readers have their own, CheckpointError, for files a model ships)."""

from __future__ import annotations

from pathlib import Path

from anatomy.errors import InputError


def read_text(path: str | Path, *, label: str) -> str:
    """The UTF-8 text of `path`; `label` says what it is in messages ("--data", "hardware file")."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{label} {path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except OSError as exc:
        raise InputError(f"{label} {path}: cannot read it ({exc.strerror or exc})") from None
