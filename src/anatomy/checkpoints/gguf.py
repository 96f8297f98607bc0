"""GGUF (llama.cpp's format): read metadata, load a model, write one back.

    read_gguf(path) -> GGUFFile       metadata (tokenizer too) and tensor layout, validated
"""

from __future__ import annotations

from anatomy.checkpoints.gguf_reader import GGUFFile, GGUFTensor, read_gguf
from anatomy.checkpoints.gguf_types import ValueType

__all__ = ["GGUFFile", "GGUFTensor", "ValueType", "read_gguf"]
