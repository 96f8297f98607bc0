"""Figures written to a file the user names (`inspect --plot`, `anatomy plot -o`): the format
comes from the suffix (none: PNG) and is checked before anything is computed or drawn; the file is
written atomically, with matplotlib's Agg backend (no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from anatomy.atomic import atomic_file
from anatomy.errors import InputError


def image_format(path: str | Path, *, option: str) -> str:
    """The matplotlib format a path's suffix names ("png" without one); InputError for others."""
    from matplotlib.backend_bases import FigureCanvasBase

    suffix = Path(path).suffix.lstrip(".").lower() or "png"
    formats = FigureCanvasBase.get_supported_filetypes()
    if suffix not in formats:
        raise InputError(f"{option} {path}: .{suffix} is not an image format matplotlib writes "
                         f"(choose one of {', '.join('.' + f for f in sorted(formats))})")
    return suffix


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | Path, *, option: str, dpi: float | str = "figure") -> Path:
    """Write `fig` to `path` atomically in the format its suffix names, then close it."""
    fmt = image_format(path, option=option)
    try:
        with atomic_file(path) as f:
            fig.savefig(f, format=fmt, dpi=dpi)
    finally:
        pyplot().close(fig)
    return Path(path)
