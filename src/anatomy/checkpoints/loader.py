"""anatomy.load / anatomy.save / load_config: one entry point for every kind of checkpoint.

    an installed model name ("smollm2-135m-instruct")  -> registry.resolve -> a path, then:
    a .gguf file                                       -> checkpoints.gguf
    an HF directory (or its config.json / model.safetensors) -> checkpoints.safetensors
    load_config also takes a preset name ("llama-7b").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from anatomy.config import ModelConfig
from anatomy.errors import CheckpointError, InputError
from anatomy.presets import PRESETS, get_preset

_GGUF_DTYPES = {None: "f32", torch.float32: "f32", torch.float16: "f16", "f32": "f32", "f16": "f16"}
_PATH_SUFFIXES = (".gguf", ".json", ".safetensors")


def load(name_or_path: str | Path, *, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The model of a checkpoint (HF directory, .gguf file or installed model name), in eval mode."""
    path = resolve_path(name_or_path)
    if path.suffix == ".gguf":
        from anatomy.checkpoints.gguf import load_gguf

        return load_gguf(path, dtype=dtype)
    from anatomy.checkpoints.safetensors import load_hf

    return load_hf(_hf_directory(path), dtype=dtype)


def save(model: nn.Module, path: str | Path, *, dtype: torch.dtype | str | None = None, tokenizer: Any = None) -> Path:
    """Write `model` as a .gguf file (f32 or f16; `tokenizer` read from a GGUF file gives it its
    vocabulary) or, for any other path, an HF directory."""
    path = Path(path)
    if path.suffix == ".gguf":
        if dtype not in _GGUF_DTYPES:
            raise InputError(f"dtype={dtype!r} cannot be written to GGUF (choose torch.float32 or torch.float16)")
        from anatomy.checkpoints.gguf import save_gguf

        save_gguf(model, path, dtype=_GGUF_DTYPES[dtype], tokenizer=tokenizer)
        return path
    if isinstance(dtype, str):
        raise InputError(f"dtype={dtype!r}: an HF directory takes a torch dtype (e.g. torch.float16)")
    from anatomy.checkpoints.safetensors import save_hf

    return save_hf(model, path, dtype=dtype)


def load_config(name_or_path: str | Path) -> ModelConfig:
    """The ModelConfig of a preset name, an HF config.json (or its directory), a .gguf file or an
    installed model name, without loading any weights."""
    if isinstance(name_or_path, str) and name_or_path in PRESETS and not Path(name_or_path).exists():
        return get_preset(name_or_path)
    path = resolve_path(name_or_path)
    if path.suffix == ".gguf":
        from anatomy.checkpoints.gguf import read_gguf_config

        return read_gguf_config(path)
    from anatomy.checkpoints.safetensors import read_hf_config

    return read_hf_config(path if path.suffix == ".json" else _hf_directory(path))


def resolve_path(name_or_path: str | Path) -> Path:
    """An existing path as is; a path-like string that does not exist is an error naming it; any
    other string is looked up among the installed models."""
    path = Path(name_or_path).expanduser()
    if path.exists():
        return path
    text = str(name_or_path)
    if isinstance(name_or_path, Path) or "/" in text or "\\" in text or path.suffix in _PATH_SUFFIXES:
        raise CheckpointError(f"{text}: no such file or directory")
    from anatomy.checkpoints.registry import resolve

    return resolve(text)


def _hf_directory(path: Path) -> Path:
    """The HF checkpoint directory of a path to it or to one of its files."""
    if path.is_dir():
        return path
    if path.suffix in (".json", ".safetensors"):
        return path.parent
    raise CheckpointError(f"{path}: not a checkpoint (expected a .gguf file or an HF directory with config.json)")
