"""anatomy: the Transformer family, runnable on real checkpoints, with every shape, parameter,
FLOP and byte visible.

    anatomy.load / save / load_config / load_tokenizer    a model, its config, its tokenizer (name or path)
    anatomy.generate / stream / embed                     text and sentence embeddings (loaded_models: LRU)
    anatomy.engine_for(model)                             the engine kept for a model: its step API
    anatomy.inspect / compare / attention / profile       the anatomy report, attention maps, the measured run
    anatomy.apply_lora(model, adapter)                    a PEFT LoRA adapter run unmerged (merge_lora merges)
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
