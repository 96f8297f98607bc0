"""A GGUF file's matrices as weight formats, under the model's own parameter names.

    formats = matrix_formats(read_gguf(path))
    formats["...blocks.0.attn.qkv.weight"]  -> Int4Weight int4[960,576]g32 (q, k, v fused, rotary rows in HF order)
    formats["...embed.tokens.weight"]       -> Int8GroupWeight int8g[49152,576]g32 (also the LM head when tied)

The same mapping as checkpoints.gguf's loader (tensor_plan: which GGUF tensors fill which rows),
except that the blocks are kept, not dequantized: rows are whole blocks, so fusing and the
rotary row reordering move raw bytes. Only 2-D tensors are returned; norms and biases are not
weights of a linear layer. A type without a lossless compact format raises InputError (see
formats.format_from_gguf).
"""

from __future__ import annotations

import numpy as np
import torch

from anatomy.checkpoints.assign import expected_shapes
from anatomy.checkpoints.gguf_config import config_from_gguf, gguf_architecture
from anatomy.checkpoints.gguf_names import Part, from_gguf_rows, tensor_plan
from anatomy.checkpoints.gguf_reader import GGUFFile
from anatomy.errors import CheckpointError
from anatomy.inference.formats import WeightFormat, format_from_gguf
from anatomy.models import build_model


def matrix_formats(f: GGUFFile) -> dict[str, WeightFormat]:
    """{model parameter name: format} for every 2-D tensor of the model the file describes."""
    config = config_from_gguf(f)
    shapes = expected_shapes(build_model(config, device="meta"))
    plan = tensor_plan(shapes, config, gguf_architecture(f))
    out = {}
    for name, parts in plan.items():
        if len(shapes[name]) != 2 or any(getattr(p, "experts", 0) or getattr(p, "offset", 0.0) for p in parts):
            continue  # norms, biases, stacked experts, values stored with an offset: not a plain linear weight
        fmts = [_part_format(f, p, shapes[name][1]) for p in parts]
        out[name] = fmts[0] if len(fmts) == 1 else WeightFormat.cat_rows(fmts, label=name)
    return out


def named(formats: dict[str, WeightFormat], suffix: str) -> str:
    """The one name in `formats` ending with `suffix` (e.g. "blocks.0.attn.qkv.weight"), whatever prefix
    the model puts before its parameter names."""
    found = [n for n in formats if n == suffix or n.endswith("." + suffix)]
    if len(found) != 1:
        raise KeyError(f"{len(found)} weights end with {suffix!r}")
    return found[0]


def _part_format(f: GGUFFile, part: Part, K: int) -> WeightFormat:
    t = f.tensors[part.name]
    if t.shape != (part.rows, K):
        raise CheckpointError(f"{f.path}: {part.name} has shape {list(t.shape)}, the model needs {[part.rows, K]}")
    return format_from_gguf(_rows_in_hf_order(f, part), t.type, t.shape, label=part.name)


def _rows_in_hf_order(f: GGUFFile, part: Part) -> np.ndarray:
    """The part's raw bytes, its rows back in HF's rotary order when llama.cpp reordered them."""
    raw = f.raw(part.name)
    if not part.heads:
        return raw
    rows = raw.reshape(part.rows, -1)  # [rows, bytes per row]: a row is whole blocks
    order = from_gguf_rows(torch.arange(part.rows), part.heads).numpy()
    return rows[order].reshape(-1)
