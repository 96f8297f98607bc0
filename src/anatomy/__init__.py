"""anatomy: the Transformer family, runnable on real checkpoints, with every shape, parameter,
FLOP and byte visible."""

from anatomy.config import ModelConfig
from anatomy.errors import AnatomyError, CheckpointError, ConfigError, InputError
from anatomy.models import build_model
from anatomy.presets import get_preset, preset_names

__version__ = "0.1.0"

__all__ = [
    "ModelConfig", "AnatomyError", "CheckpointError", "ConfigError", "InputError", "build_model",
    "get_preset", "preset_names",
]
