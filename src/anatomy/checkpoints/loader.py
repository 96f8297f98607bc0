"""anatomy.load / anatomy.save / load_config: one entry point for every kind of checkpoint.

    an installed model name ("<model>")                -> registry.resolve -> a path, then:
    a .gguf file                                       -> checkpoints.gguf
    an HF directory (or its config.json / model.safetensors) -> checkpoints.safetensors
    load_config also takes a preset name ("llama-7b") and a config.json (or its directory) without weights.

Which of these a name is, is decided once, in checkpoints/source.py (find_model).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import torch
from torch import nn

from anatomy import dtypes
from anatomy.atomic import write_errors_named
from anatomy.checkpoints.source import as_path, find_model, resolve_path
from anatomy.config import ModelConfig
from anatomy.errors import CheckpointError, InputError
from anatomy.lora.layer import LoRALinear
from anatomy.presets import get_preset

__all__ = ["load", "save", "load_config", "stored_weights", "resolve_path"]
_GGUF_FLOAT_TYPES = {"F32": "f32", "F16": "f16", "BF16": "bf16"}


def load(name_or_path: str | Path, *, weights: str | torch.dtype = "auto",
         dtype: str | torch.dtype | None = "f32") -> nn.Module:
    """The model of a checkpoint (HF directory, .gguf file or installed model name), in eval mode.

    `weights` is the format of its matrices (every linear layer and the token embedding):
    "auto" keeps a GGUF file's quantized blocks where a compact format holds them exactly (the
    model then reads ~5 bits a weight, not 32) and an HF checkpoint's floats; "f32", "f16", "bf16",
    "int8", "int4" convert (see anatomy.weights.choice). Compact weights live in CompactLinear /
    CompactEmbedding modules; the engine runs them through its measured kernel plan.

    `dtype` is "f32", "f16", "bf16" (or a torch dtype) for everything else (norms, biases, the
    activations of model(ids)) and for dense matrices. None keeps the checkpoint's own, in both
    formats: an HF checkpoint's tensors stay as the safetensors hold them; a GGUF file's model gets
    the float type its matrices are stored in (F32, F16 or BF16), f32 when they are quantized."""
    from anatomy import progress
    from anatomy.weights.choice import parse_weights

    source = find_model(name_or_path)
    if source.kind == "config" and not source.with_weights:
        load_config(name_or_path)  # a config that breaks a rule says so before its missing weights do
    path = source.checkpoint("anatomy.load")
    choice = parse_weights(weights)
    wanted = dtypes.torch_dtype(dtype) if dtype is not None else None
    with progress.task(f"reading {path.name}"):
        if path.suffix == ".gguf":
            from anatomy.checkpoints.gguf import load_gguf

            return load_gguf(path, dtype=wanted if wanted is not None else _gguf_file_dtype(path), weights=choice)
        from anatomy.checkpoints.safetensors import load_hf

        return load_hf(_hf_directory(path), dtype=wanted, weights=choice)


def _gguf_file_dtype(path: Path) -> torch.dtype:
    """The float type a GGUF file stores its matrices in; f32 for quantized (or mixed) ones."""
    from anatomy.checkpoints.gguf_reader import read_gguf

    types = {t.type.name for t in read_gguf(path).tensors.values() if len(t.shape) == 2}
    return dtypes.torch_dtype(_GGUF_FLOAT_TYPES.get(types.pop(), "f32") if len(types) == 1 else "f32")


def save(model: nn.Module, path: str | Path, *, dtype: str | torch.dtype | None = None, tokenizer: Any = None) -> Path:
    """Write `model` as a .gguf file (its vocabulary from `tokenizer`, one read from a GGUF file)
    or, for any other path, an HF directory.

    `dtype` converts the weights: "f32", "f16" or "bf16" (or a torch dtype) for an HF directory,
    "f32" or "f16" for GGUF (norms and biases stay f32 there, as llama.cpp expects). None keeps the
    model's own dtype."""
    path = as_path(path)
    if not isinstance(model, nn.Module):
        raise InputError(f"save() writes an anatomy model (from anatomy.load or build_model), got {type(model).__name__}")
    if any(isinstance(m, LoRALinear) for m in model.modules()):
        raise InputError("the model holds LoRA layers: anatomy.save_adapter(model, path) writes the adapter, "
                         "anatomy.merge_lora(model) merges it into the weights to save")
    if path.suffix == ".gguf":
        from anatomy.checkpoints.gguf import SAVE_DTYPES, save_gguf

        gguf_dtype = _gguf_save_dtype(model, dtype, choices=tuple(SAVE_DTYPES))
        with write_errors_named(path):
            save_gguf(model, path, dtype=gguf_dtype, tokenizer=tokenizer)
        return path
    from anatomy.checkpoints.safetensors import save_hf

    torch_dtype = dtypes.torch_dtype(dtype) if dtype is not None else None
    with write_errors_named(path):
        return save_hf(model, path, dtype=torch_dtype)


def _gguf_save_dtype(model: nn.Module, dtype: str | torch.dtype | None, *, choices: tuple[str, ...]) -> str:
    if dtype is not None:
        return dtypes.parse(dtype, choices=choices).name
    own = dtypes.name_of(next(model.parameters()).dtype)
    if own not in choices:
        raise InputError(f"the model's weights are {own}, which a GGUF file is not written in here: "
                         f"pass dtype= one of {', '.join(choices)}")
    return own


def stored_weights(name_or_path: str | Path) -> dict[str, Any] | None:
    """What a checkpoint's tensors occupy, without loading them: {"source", "bytes", "by_format"},
    by_format keyed by GGUF tensor type ("Q4_1", "F32", ...) or safetensors dtype ("f32", ...);
    None for a preset or a config without weights."""
    source = find_model(name_or_path)
    if not source.with_weights:
        return None
    path = source.checkpoint()
    by_format: dict[str, int] = {}
    if path.suffix == ".gguf":
        from anatomy.checkpoints.gguf_reader import read_gguf

        for t in read_gguf(path).tensors.values():
            by_format[t.type.name] = by_format.get(t.type.name, 0) + t.nbytes
    else:
        from anatomy.checkpoints.safetensors import read_weights
        from anatomy.weights.modules import tensor_kind

        for t in read_weights(_hf_directory(path))[0].values():
            by_format[tensor_kind(t)] = by_format.get(tensor_kind(t), 0) + t.nbytes
    return {"source": str(path), "bytes": sum(by_format.values()), "by_format": by_format}


def load_config(name_or_path: str | Path) -> ModelConfig:
    """The ModelConfig of a preset name, an HF config.json (or its directory, weights or none), a
    .gguf file or an installed model name, without reading any weights."""
    source = find_model(name_or_path)
    if source.kind == "preset":
        return get_preset(source.given)
    path = source.path
    if path.suffix == ".gguf":
        from anatomy.checkpoints.gguf import read_gguf_config

        return read_gguf_config(path)
    from anatomy.checkpoints.safetensors import read_hf_config

    return read_hf_config(path if path.suffix == ".json" else _hf_directory(path))


def resolve_config(name: str) -> ModelConfig:
    """load_config; a bare name it does not know that resembles a preset gets the preset suggestion."""
    from anatomy.presets import PRESETS, get_preset

    try:
        return load_config(name)
    except CheckpointError:
        bare = not Path(name).exists() and "/" not in name and not Path(name).suffix
        if bare and difflib.get_close_matches(name, PRESETS, n=1, cutoff=0.6):
            get_preset(name)  # raises, naming the close presets
        raise


def _hf_directory(path: Path) -> Path:
    """The HF checkpoint directory of a path to it or to one of its files."""
    if path.is_dir():
        return path
    if path.suffix in (".json", ".safetensors"):
        return path.parent
    raise CheckpointError(f"{path}: not a checkpoint (expected a .gguf file or an HF directory with config.json)")
