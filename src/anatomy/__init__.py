"""anatomy: the Transformer family, runnable on real checkpoints, with every shape, parameter,
FLOP and byte visible.

    anatomy.load(name_or_path)            a model (HF directory, .gguf file or installed name)
    anatomy.save(model, path)             HF layout directory, or .gguf
    anatomy.load_config(name_or_path)     the ModelConfig of a preset, HF config, .gguf or installed name
    anatomy.load_tokenizer(name_or_path)
    anatomy.generate(model, prompt, ...)  / anatomy.stream(...)
    anatomy.embed(model, texts)           sentence embeddings
    anatomy.loaded_models                 the models loaded by name for generate/embed (LRU; .clear())
    anatomy.engine_for(model)             the engine kept for a model: its step API (engine.start, .step, ...)
    anatomy.inspect(model) / compare(...)  the anatomy report; renders as a page in a notebook
    anatomy.attention(model, text, ...)   attention weights per layer and head over the real tokens
    anatomy.profile(model, ...)           the run measured: time per op and per position, against the roofs
    anatomy.apply_lora(model, adapter)    a LoRA adapter (PEFT directory) run unmerged; merge_lora merges it
"""

from __future__ import annotations

import importlib
from typing import Any

from anatomy import moved
from anatomy.config import ModelConfig
from anatomy.errors import AnatomyError, CheckpointError, ConfigError, InputError
from anatomy.models import build_model
from anatomy.presets import get_preset, preset_names

__version__ = "0.1.0"

moved.install()  # old module paths (anatomy.tokenizer, anatomy.inference.planning, ...) for a release

# The heavier entry points are imported on first use, so `import anatomy` stays fast.
_LAZY = {
    "load": "anatomy.checkpoints.loader",
    "save": "anatomy.checkpoints.loader",
    "load_config": "anatomy.checkpoints.loader",
    "load_tokenizer": "anatomy.text.tokenizer",
    "generate": "anatomy.inference.generate",
    "stream": "anatomy.inference.generate",
    "embed": "anatomy.inference.embed",
    "loaded_models": "anatomy.inference.model_cache",
    "engine_for": "anatomy.inference.engine",
    "kept_engines": "anatomy.inference.engine",
    "inspect": "anatomy.analysis.inspection",
    "compare": "anatomy.analysis.inspection",
    "attention": "anatomy.analysis.attention_maps",
    "profile": "anatomy.analysis.profile",
    "apply_lora": "anatomy.lora",
    "merge_lora": "anatomy.lora",
    "load_adapter": "anatomy.lora",
    "save_adapter": "anatomy.lora",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'anatomy' has no attribute {name!r}")


__all__ = [
    "ModelConfig", "AnatomyError", "CheckpointError", "ConfigError", "InputError", "build_model",
    "get_preset", "preset_names", *_LAZY,
]
