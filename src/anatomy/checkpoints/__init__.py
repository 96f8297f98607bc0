"""Checkpoints: HF layout (config.json + safetensors) and GGUF, read and written; named models."""

from anatomy.errors import CheckpointError

__all__ = ["CheckpointError"]
