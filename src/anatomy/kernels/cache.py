"""Where measured kernel plans are kept: one JSON file per key, written atomically.

A plan is only true for the machine and software that measured it, so its key holds the machine
(CPU model, a digest of its flags, logical CPUs, torch's threads and vector capability), the torch
version, the model's identity and weights choice, and everything the measurement depended on
(phases, threshold, kernel names, weight signatures, memory budget). The file name is a digest of
the key and the file repeats the key: a file whose key differs (copied from another machine,
written by another version), that is truncated, corrupt or not a plan reads as absent, and the
plan is measured again and the file rewritten.

    $ANATOMY_CACHE_DIR/plans/<digest>.json      when ANATOMY_CACHE_DIR is set
    $XDG_CACHE_HOME/anatomy/plans/<digest>.json otherwise (XDG_CACHE_HOME defaults to ~/.cache)
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path
from typing import Any

import torch

from anatomy.atomic import atomic_file
from anatomy.kernels import record
from anatomy.kernels.cache_dir import CACHE_ENV, cache_dir  # noqa: F401 (CACHE_ENV: the name tests set)

PLAN_VERSION = 3  # 2: accuracy checked on real activations (kernels/calibration.py); 3: FBGEMM's padded bytes


def machine_key() -> dict[str, Any]:
    """What makes one machine's timings differ from another's."""
    cpu, flags = _cpuinfo()
    return {"cpu": cpu, "flags": hashlib.sha256(flags.encode()).hexdigest()[:16], "logical_cpus": os.cpu_count(),
            "threads": torch.get_num_threads(), "capability": _capability(), "torch": torch.__version__,
            "native": _native_build()}


def _native_build() -> str:
    """Which build of anatomy's own kernels was measured, and the vector code it ran (a digest of their
    sources and e.g. "avx2"; "none" without it): a changed kernel, or another limit, is measured again."""
    from anatomy.kernels import native
    from anatomy.kernels.native.build import library_path

    return f"{library_path().stem}:{native.isa()}" if native.loaded() else "none"


def _cpuinfo() -> tuple[str, str]:
    """(CPU model name, its flags) from /proc/cpuinfo; platform's names where that is unreadable."""
    model, flags = "", ""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            field, _, value = line.partition(":")
            field = field.strip()
            if field == "model name" and not model:
                model = value.strip()
            elif field in ("flags", "Features") and not flags:
                flags = " ".join(sorted(value.split()))
    except OSError:
        pass
    return model or platform.processor() or platform.machine(), flags


def _capability() -> str:
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except AttributeError:
        return "unknown"


def file_identity(path: str | Path) -> str:
    """A model_id for a checkpoint file or directory: its resolved path, size and modification time
    (a rewritten or replaced file gets a new plan; hashing the whole file on every load would cost more)."""
    path = Path(path).resolve()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    stats = [(p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    return f"{path}:{sum(s for s, _ in stats)}:{max((t for _, t in stats), default=0)}"


def plan_path(key: dict[str, Any], directory: Path | None = None) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return (directory or cache_dir()) / "plans" / f"{digest}.json"


def load_entry(path: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """The plan stored at `path` under exactly `key`; None when absent, unreadable or foreign."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("version") != PLAN_VERSION or data.get("key") != key:
        return None
    plan = data.get("plan")
    return plan if isinstance(plan, dict) else None


def save_entry(path: Path, key: dict[str, Any], plan: dict[str, Any]) -> None:
    """Write {version, key, plan} to `path` atomically (directories created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"version": PLAN_VERSION, "key": key, "plan": plan}, indent=1, sort_keys=True)
    with atomic_file(path) as f:
        f.write(text.encode())


def noisy_plans(directory: Path | None = None) -> list[Path]:
    """The kept kernel plans measured while the machine was busy (noise above record.NOISE_LIMIT)."""
    folder = (directory or cache_dir()) / "plans"
    out = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        try:
            plan = json.loads(path.read_text()).get("plan")
        except (OSError, UnicodeDecodeError, ValueError, AttributeError):
            continue
        if isinstance(plan, dict) and isinstance(plan.get("noise"), (int, float)) and plan["noise"] > record.NOISE_LIMIT:
            out.append(path)
    return out
