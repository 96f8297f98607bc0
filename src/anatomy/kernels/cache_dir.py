"""Where anatomy keeps what it measures and builds per machine (kernel plans, kept decisions, the native
library compiled on first use): $ANATOMY_CACHE_DIR, else $XDG_CACHE_HOME/anatomy (~/.cache/anatomy)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "ANATOMY_CACHE_DIR"


def cache_dir() -> Path:
    """The anatomy cache directory (not created here)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "anatomy"
