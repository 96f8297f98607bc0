"""Writing a file so that a crash or an error never leaves a partial file where a good one was,
and so that a path the file system refuses is an InputError naming it, not an OSError."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator

from anatomy.errors import InputError

# what the file system answers when the path the user named cannot be written (not a bug of ours)
_REFUSALS = {errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC,
             errno.EDQUOT, errno.ENAMETOOLONG, errno.EEXIST}


@contextlib.contextmanager
def atomic_file(path: str | Path) -> Iterator[BinaryIO]:
    """`with atomic_file(path) as f:` writes a sibling temporary file, fsyncs it and renames it over
    `path` only when the block succeeds; on any failure the temporary file is removed and `path`
    is untouched."""
    path = Path(path)
    with write_errors_named(path):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; the result gets an ordinary file's mode
            with os.fdopen(fd, "wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


@contextlib.contextmanager
def write_errors_named(path: str | Path, *, option: str | None = None) -> Iterator[None]:
    """Inside the block, an OSError that means `path` cannot be written (no such directory, a
    directory in the way, no permission, a full disk) becomes an InputError naming the path (and
    the option that named it); other OSErrors pass unchanged."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in _REFUSALS:
            raise
        raise InputError(f"{f'{option} ' if option else ''}{path}: cannot write it: {_reason(Path(path), exc)}") from exc


def _reason(path: Path, exc: OSError) -> str:
    if exc.errno == errno.ENOENT and not path.parent.is_dir():
        return f"the directory {path.parent} does not exist"
    if path.exists() and exc.errno in (errno.EISDIR, errno.EEXIST, errno.ENOTDIR):
        return f"a {'directory' if path.is_dir() else 'file'} is in the way"
    return str(exc.strerror or exc)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
