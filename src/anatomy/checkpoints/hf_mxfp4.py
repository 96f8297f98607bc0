"""An HF checkpoint's MXFP4 experts (openai/gpt-oss-20b, -120b), kept compact, never widened to float.

Such a checkpoint (config.json: `"quantization_config": {"quant_method": "mxfp4"}`) stores each layer's
`mlp.experts.gate_up_proj_blocks` [E, 2F, D/32, 16] (uint8: value 2j of a block in the low nibble of
byte j, 2j + 1 in the high one) with `gate_up_proj_scales` [E, 2F, D/32] (e8m0, bias 127), and
`down_proj_blocks` / `_scales` [E, D, F/32, 16] / [E, D, F/32]. Each expert is repacked into GGUF's
MXFP4 blocks (the scale byte, then byte j holding values j and j + 16; gate rows before up rows) and
read into the format a GGUF file's MXFP4 experts get (weights/gguf_blocks.format_from_gguf).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from anatomy.checkpoints.gguf_types import TENSOR_TYPES_BY_NAME
from anatomy.checkpoints.hf_names import TensorLink
from anatomy.errors import CheckpointError
from anatomy.weights.gguf_blocks import format_from_gguf
from anatomy.weights.modules import StackedFormats

MXFP4 = TENSOR_TYPES_BY_NAME["MXFP4"]
SUFFIXES = ("_blocks", "_scales")


def packed_experts(hf: dict[str, Any], links: list[TensorLink], tensors: dict[str, Tensor],
                   files: dict[str, Path], *, config_file: Path) -> tuple[dict[str, StackedFormats], set[str]]:
    """({our stacked expert name: each expert's format}, the HF tensor names they were read from) for
    the checkpoint's MXFP4 experts; ({}, set()) when it stores none."""
    out, used = {}, set()
    for link in links:
        if len(link.shape) != 3 or len(link.hf) != 1:
            continue
        blocks, scales = (link.hf[0] + s for s in SUFFIXES)
        if blocks not in tensors and scales not in tensors:
            continue
        for name, other in ((blocks, scales), (scales, blocks)):
            if name not in tensors:
                raise CheckpointError(f"{files[other]}: tensor {other!r} has no {name!r} beside it")
        _check_method(hf, blocks, config_file)
        out[link.ours] = _stacked(link, tensors[blocks], tensors[scales], files[blocks], blocks)
        used |= {blocks, scales}
    return out, used


def _check_method(hf: dict[str, Any], tensor: str, config_file: Path) -> None:
    quant = hf.get("quantization_config")
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    if method != "mxfp4":
        raise CheckpointError(f"{config_file}: quantization_config.quant_method is {method!r}, but tensor "
                              f"{tensor!r} is stored as MXFP4 blocks (only quant_method 'mxfp4' is read)")


def _stacked(link: TensorLink, blocks: Tensor, scales: Tensor, file: Path, name: str) -> StackedFormats:
    """The experts [E, N, K] of `link` from their HF blocks [E, N, K/32, 16] and scales [E, N, K/32]."""
    E, N, K = link.shape
    want = (E, N, K // 32)
    for t, shape, what in ((blocks, (*want, 16), name), (scales, want, name.replace("_blocks", "_scales"))):
        if K % 32 or tuple(t.shape) != shape or t.dtype.itemsize != 1 or t.is_floating_point():
            raise CheckpointError(f"{file}: tensor {what!r} is {t.dtype} {list(t.shape)}, the config calls for "
                                  f"uint8 {list(shape)} (MXFP4 of experts [E, N, K] = "
                                  f"{[E, N, K]}, K a multiple of 32)")
    b, s = blocks.numpy().view(np.uint8), scales.numpy().view(np.uint8)
    rows = np.r_[0:N:2, 1:N:2] if link.interleaved else slice(None)  # gate (even) rows, then up (odd) rows
    return StackedFormats([format_from_gguf(gguf_blocks(b[e][rows], s[e][rows]).reshape(-1), MXFP4, (N, K),
                                            label=f"{link.ours}.{e}") for e in range(E)], label=link.ours)


def gguf_blocks(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """HF MXFP4 blocks [..., 16] and e8m0 scales [...] -> GGUF MXFP4 blocks [..., 17] (the same levels and
    scale byte; GGUF's byte j holds values j and j + 16 where HF's holds 2j and 2j + 1)."""
    values = np.stack([blocks & 0x0F, blocks >> 4], axis=-1).reshape(*blocks.shape[:-1], 32)
    out = np.empty((*blocks.shape[:-1], 17), dtype=np.uint8)
    out[..., 0] = scales
    out[..., 1:] = values[..., :16] | (values[..., 16:] << 4)
    return out
