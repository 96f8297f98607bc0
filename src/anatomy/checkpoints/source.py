"""What a caller names as "the model", told apart before anything is read: the one place every
command and API call resolves a model name or path.

    find_model("llama-7b")          -> ModelSource(kind="preset"); "dir/config.json" -> kind="config"
    find_model("dir")               -> kind="hf" (or "config" when it holds no weights); "x.gguf" -> "gguf"
    find_model("<model>")           -> an installed checkpoint's kind and path, installed=the name
    source.checkpoint("generation") -> the path anatomy.load reads, or a CheckpointError naming the rule
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from anatomy.errors import CheckpointError, InputError

KINDS = ("preset", "config", "hf", "gguf")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
_PATH_SUFFIXES = (".gguf", ".json", ".safetensors")


@dataclass(frozen=True)
class ModelSource:
    """A model named by the user: `kind` is one of KINDS; `path` the file or directory (None for a
    preset); `installed` the registry name it came from; `with_weights` whether weights are there."""

    given: str
    kind: str
    path: Path | None
    installed: str | None = None
    with_weights: bool = False

    def checkpoint(self, needs: str = "loading a model") -> Path:
        """The .gguf file or the HF directory anatomy.load reads (that of a config.json or
        model.safetensors named in it); CheckpointError for a preset or a config without weights,
        naming it and saying what `needs` (e.g. "generation") takes instead."""
        if self.with_weights and self.path is not None:
            return self.path.parent if self.path.suffix in (".json", ".safetensors") else self.path
        instead = (f"{needs} needs weights: an installed model name ({', '.join(_installed_names())}), a .gguf file "
                   f"or an HF directory with {WEIGHT_FILES[0]}")
        if self.kind == "preset":
            raise CheckpointError(f"{self.given!r} is a preset, a configuration without weights: {instead} "
                                  f"(`anatomy inspect --model {self.given}` shows a preset's anatomy)")
        where = "in it" if self.path.is_dir() else "beside it"
        raise CheckpointError(f"{self.path}: a config without weights (neither {WEIGHT_FILES[0]} nor {WEIGHT_FILES[1]} "
                              f"is there, {where}): {instead}")


def find_model(name_or_path: str | os.PathLike[str]) -> ModelSource:
    """The ModelSource of a preset name, an HF config.json or directory, a .gguf file or an
    installed model name (see the module docstring). A name that is both a preset and an existing
    path is the path; a missing path-like text is an error naming it; other text is looked up among
    the installed models (checkpoints/registry.py)."""
    from anatomy.presets import PRESETS

    given = str(name_or_path)
    if isinstance(name_or_path, str) and given in PRESETS and not Path(given).exists():
        return ModelSource(given, "preset", None)
    path = resolve_path(name_or_path)
    installed = given if not Path(given).expanduser().exists() else None
    if path.suffix == ".gguf":
        return ModelSource(given, "gguf", path, installed, with_weights=True)
    if path.suffix == ".json":
        return ModelSource(given, "config", path, installed, with_weights=has_weights(path.parent))
    if path.is_dir() and (path / "config.json").is_file() and not has_weights(path):
        return ModelSource(given, "config", path, installed)
    return ModelSource(given, "hf", path, installed, with_weights=True)  # the loader names what is missing


def has_weights(folder: Path) -> bool:
    """Does an HF directory hold its weights (one safetensors file or a sharded index)?"""
    return any((folder / name).is_file() for name in WEIGHT_FILES)


def resolve_path(name_or_path: str | os.PathLike[str]) -> Path:
    """An existing path as is; a path-like text that does not exist is an error naming it; any
    other text is looked up among the installed models."""
    path = as_path(name_or_path).expanduser()
    if path.exists():
        return path
    text = str(name_or_path)
    if isinstance(name_or_path, Path) or "/" in text or "\\" in text or path.suffix in _PATH_SUFFIXES:
        raise CheckpointError(f"{text}: no such file or directory")
    from anatomy.checkpoints.registry import resolve

    return resolve(text)


def as_path(name_or_path: object) -> Path:
    """A str or os.PathLike as a Path; anything else is an InputError naming its type."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise InputError(f"expected a model name or a path, got {type(name_or_path).__name__}: {name_or_path!r:.80}")
    return Path(name_or_path)


def _installed_names() -> list[str]:
    from anatomy.checkpoints.registry import names

    return names()
