"""An adapter from either of its files: a PEFT directory (peft.py) or llama.cpp's GGUF file (gguf.py)."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from anatomy.config import ModelConfig
from anatomy.lora.adapter import Adapter
from anatomy.lora.gguf import read_gguf_lora
from anatomy.lora.peft import read_peft


def read_adapter(path: str | Path, model_config: ModelConfig) -> Adapter:
    """The adapter at `path` (a .gguf file: llama.cpp's; else a PEFT directory), checked against the model."""
    path = Path(path)
    if path.suffix.lower() == ".gguf" and not path.is_dir():
        return read_gguf_lora(path, model_config)
    return read_peft(path, model_config)


def load_adapter(path: str | Path, model: nn.Module | ModelConfig) -> Adapter:
    """The adapter at `path` (a PEFT directory or llama.cpp's GGUF file), checked against `model` (or a
    model of that config)."""
    return read_adapter(path, model if isinstance(model, ModelConfig) else model.config)
