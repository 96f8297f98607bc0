"""GGUF (llama.cpp's format): read metadata, load a model, write one back (docs/gguf.md).

    read_gguf(path) -> GGUFFile            metadata (tokenizer too) and tensor layout, validated
    read_gguf_config(path) -> ModelConfig  the model the metadata describes
    load_gguf(path, dtype=torch.float32)   a ready model: dequantized, Q/K rows back in HF order
    save_gguf(model, path, dtype="f32")    a GGUF file llama.cpp loads (f32 or f16 weights)

Loading checks everything (layout, metadata, each tensor's shape and type) before it dequantizes
anything; the model is built on the meta device and the tensors are assigned to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor, nn

from anatomy import heap
from anatomy.checkpoints.assign import assign_tensors, expected_shapes
from anatomy.checkpoints.gguf_config import (
    ROPE_TENSORS,
    config_from_gguf,
    config_to_gguf,
    gguf_architecture,
    rope_tensors,
)
from anatomy.checkpoints.gguf_dequant import dequantize, supported_types
from anatomy.checkpoints.gguf_names import Part, part_bytes, tensor_parts, to_gguf_rows
from anatomy.checkpoints.gguf_reader import GGUFFile, GGUFTensor, read_gguf
from anatomy.checkpoints.gguf_strings import StringTable
from anatomy.checkpoints.gguf_types import TENSOR_TYPES_BY_NAME, ValueType
from anatomy.checkpoints.gguf_writer import MetadataEntry, TensorEntry, infer_types, write_gguf
from anatomy.config import ModelConfig
from anatomy.errors import InputError
from anatomy.models import build_model
from anatomy.weights.choice import compact_formats, parse_weights
from anatomy.weights.gguf import expert_formats, lossless_format, plain_matrix
from anatomy.weights.modules import float_state_dict

SAVE_DTYPES = {"f32": ("F32", 0), "f16": ("F16", 1)}  # tensor type, general.file_type (ALL_F32, MOSTLY_F16)
TOKENIZER_PREFIX = "tokenizer."
TRIM_EVERY = 64 << 20  # file bytes converted between two trims of the heap (heap.Trimmer)

T = TypeVar("T")


def read_gguf_config(path: str | Path) -> ModelConfig:
    """The ModelConfig described by the metadata of the GGUF file at `path`."""
    return config_from_gguf(read_gguf(path))


def load_gguf(path: str | Path, *, dtype: torch.dtype = torch.float32, weights: str = "f32") -> nn.Module:
    """The model stored in the GGUF file at `path`, in eval mode: its matrices in the formats the
    `weights` choice gives them (weights/choice.py; "auto" keeps the file's blocks where a format
    holds them exactly), every other tensor in `dtype`. (Its tokenizer is
    `anatomy.load_tokenizer(path)`, which also keeps the file's tokenizer metadata for save_gguf.)"""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise InputError(f"dtype={dtype!r} must be a floating-point torch.dtype")
    f = read_gguf(path)
    config = config_from_gguf(f)
    model = build_model(config, device="meta")
    shapes = expected_shapes(model)
    parts_of = tensor_parts(shapes, config, gguf_architecture(f))
    _check_parts(f, parts_of, shapes)
    trimmer = heap.Trimmer(TRIM_EVERY)  # the conversions' freed temporaries go back as the model grows

    def released(name: str, value: T) -> T:
        return _released(f, parts_of[name], value, trimmer)

    compact = compact_formats(
        model, parse_weights(weights), dtype=dtype,
        lossless=lambda name: released(name, _lossless(f, parts_of[name], shapes[name], name)),
        dense=lambda name: released(name, _assemble(f, parts_of[name], shapes[name], torch.float32)))
    trimmer.flush()
    tensors = {name: _assemble(f, parts, shapes[name], dtype) for name, parts in parts_of.items() if name not in compact}
    return assign_tensors(model, _own_small_views(f, tensors), source=f.path, dtype=dtype, compact=compact)


def _lossless(f: GGUFFile, parts: list[Part], shape: torch.Size, name: str):
    """The file's own exact format of one of our matrices (a stacked expert tensor: each expert's), or None."""
    if len(shape) == 3:
        return expert_formats(f, parts, tuple(shape), label=name)
    return lossless_format(f, parts, shape[1], label=name) if plain_matrix(parts) else None


def _released(f: GGUFFile, parts: list[Part], value: T, trimmer: heap.Trimmer) -> T:
    """`value`, made from the bytes of `parts`, after their file pages are dropped from memory: a
    matrix copied into its format would otherwise be held twice until the mapping is closed. The
    trimmer counts the parts' bytes: a conversion frees temporaries of about their size."""
    for p in parts:
        f.release(p.name)
    trimmer.freed(sum(f.tensors[p.name].nbytes for p in parts))
    return value


def _own_small_views(f: GGUFFile, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """The tensors, those that are views of the file's mapping copied when they are a small part of it
    (a quantized file's norms): the mapping is then released with the file, instead of keeping every
    page of it resident for a few small tensors (docs/gguf.md, "Load speed and memory"). A float file whose
    tensors are most of it stays mapped (its pages are the weights)."""
    views = {name: t for name, t in tensors.items() if f.holds(t)}
    size = sum(t.nbytes for t in f.tensors.values())
    if 2 * sum(t.nbytes for t in views.values()) >= size:
        return tensors
    return tensors | {name: t.clone() for name, t in views.items()}


def tokenizer_metadata(f: GGUFFile) -> dict[str, tuple[tuple[ValueType, ...], Any]]:
    """The file's `tokenizer.*` metadata, {key: (value type path, value)}, as save_gguf writes it back; its
    arrays of strings (the tokens, the merges) as StringTables."""
    def kept(types: tuple[ValueType, ...], value: Any) -> Any:
        return StringTable(value) if types == (ValueType.ARRAY, ValueType.STRING) else value

    return {k: (f.value_types[k], kept(f.value_types[k], v)) for k, v in f.metadata.items()
            if k.startswith(TOKENIZER_PREFIX)}


def _check_parts(f: GGUFFile, parts_of: dict[str, list[Part]], shapes: dict[str, torch.Size]) -> None:
    """Every GGUF tensor used once, each of the shape the config implies and a type we can read."""
    wanted = [p.name for parts in parts_of.values() for p in parts]
    missing = [n for n in wanted if n not in f.tensors]
    if missing:
        raise f.fail("tensors", _short(missing), "missing: the model the metadata describes needs them")
    wanted_set = set(wanted) | set(ROPE_TENSORS)  # RoPE's tensors were read with the config
    unexpected = [n for n in f.tensors if n not in wanted_set]
    if unexpected:
        raise f.fail("tensors", _short(unexpected), "unexpected for the model the metadata describes")
    for name, parts in parts_of.items():
        for p in parts:
            _check_tensor(f, f.tensors[p.name], part_shape(p, shapes[name]))


def part_shape(part: Part, shape: torch.Size) -> tuple[int, ...]:
    """The shape (torch order) of the GGUF tensor `part` of one of our tensors of `shape`."""
    if part.experts:
        return (part.experts, part.rows, *shape[2:])
    if part.per_head:
        return (part.per_head, shape[-1], part.rows) if part.transposed else (part.per_head, part.rows, shape[-1])
    return (part.rows, *shape[1:])


def _check_tensor(f: GGUFFile, t: GGUFTensor, shape: tuple[int, ...]) -> None:
    if t.shape != tuple(shape) and not (len(shape) == 2 and shape[0] == 1 and t.shape == tuple(shape[1:])):
        raise f.fail(f"{t.name} shape", list(t.shape),
                     f"the config from the metadata needs {list(shape)} (torch order; GGUF lists dims reversed)")
    if t.type.name not in supported_types():
        raise f.fail(f"{t.name} type", t.type.name, f"unsupported tensor type; supported: {', '.join(supported_types())}")


def _short(names: list[str], n: int = 6) -> str:
    return ", ".join(names[:n]) + (f" ... ({len(names)} in all)" if len(names) > n else "")


def _assemble(f: GGUFFile, parts: list[Part], shape: torch.Size, dtype: torch.dtype) -> Tensor:
    """One of our tensors from its GGUF parts: fused along rows (of each expert, or of each head), rotary
    row order undone, Gemma's 1 + w back to w."""
    if len(parts) == 1 and not parts[0].heads:
        t = f.tensors[parts[0].name]
        x = dequantize(f.raw(t.name), t.type, t.shape).reshape(shape)  # float types stay a view of the file
        return x - parts[0].offset if parts[0].offset else x
    out = torch.empty(shape, dtype=dtype)
    row = 0
    for p in parts:
        t = f.tensors[p.name]
        if p.experts:  # [E, rows, C] fills rows row..row+rows of every expert
            out[:, row:row + p.rows] = dequantize(f.raw(p.name), t.type, t.shape)
        elif p.per_head:  # [H, rows, C] (or [H, C, rows]) fills rows row..row+rows of every head's group
            x = dequantize(f.raw(p.name), t.type, t.shape)
            out.view(p.per_head, -1, shape[-1])[:, row:row + p.rows] = x.transpose(1, 2) if p.transposed else x
        else:
            dequantize(part_bytes(f.raw(p.name), p), t.type, t.shape, out=out[row:row + p.rows])
        row += p.rows
    return out


def save_gguf(model: nn.Module, path: str | Path, *, dtype: str = "f32", tokenizer: Any = None,
              tokenizer_metadata: Mapping[str, Any] | None = None) -> Path:
    """Write `model` (a llama- or gpt2-style DecoderLM) as a GGUF file llama.cpp can run.

    dtype "f32" or "f16" (matrices in f16; norms and biases stay f32, as llama.cpp expects).
    The vocabulary llama.cpp needs comes from `tokenizer` (an anatomy Tokenizer read from a GGUF
    file: its `gguf_metadata`) or from `tokenizer_metadata` (`tokenizer.*` keys, plain values,
    types inferred); with neither, the file has none. Written atomically (temporary file, fsync, rename).
    """
    if dtype not in SAVE_DTYPES:
        raise InputError(f"dtype={dtype!r} is not one of {', '.join(map(repr, SAVE_DTYPES))}")
    config = getattr(model, "config", None)
    if not isinstance(config, ModelConfig):
        raise InputError(f"save_gguf needs an anatomy model (with a ModelConfig), got {type(model).__name__}")
    arch, entries = config_to_gguf(config)
    type_name, file_type = SAVE_DTYPES[dtype]
    metadata = [(key, vtype if isinstance(vtype, tuple) else (vtype,), value) for key, vtype, value in entries]
    metadata += [("general.file_type", (ValueType.UINT32,), file_type)]
    metadata += _tokenizer_entries(tokenizer, tokenizer_metadata)
    metadata += _special_token_entries(config, {key for key, _, _ in metadata})
    shapes = expected_shapes(model)
    parts_of = tensor_parts(shapes, config, arch)
    state = float_state_dict(model)
    tensors = [_entry(state[name], p, row, type_name) for name, parts in parts_of.items() for p, row in _rows(parts)]
    tensors += [TensorEntry(name=name, type=TENSOR_TYPES_BY_NAME["F32"], shape=values.shape, data=lambda v=values: v)
                for name, values in rope_tensors(config).items()]
    return write_gguf(path, metadata=metadata, tensors=tensors)


def _rows(parts: list[Part]) -> list[tuple[Part, int]]:
    """Each part with the first row it fills."""
    starts, row = [], 0
    for p in parts:
        starts.append((p, row))
        row += p.rows
    return starts


def _entry(full: Tensor, part: Part, row: int, type_name: str) -> TensorEntry:
    if full.dim() < 2 or full.shape[0] == 1 or part.name.endswith(".bias"):
        type_name = "F32"  # llama.cpp keeps norms, biases (and the shared-expert gate vector) in f32
    np_dtype = {"F32": "float32", "F16": "float16"}[type_name]
    shape = part_shape(part, full.shape)

    def data() -> Any:
        if part.per_head:
            x = full.view(part.per_head, -1, full.shape[-1])[:, row:row + part.rows]
            x = (x.transpose(1, 2) if part.transposed else x).detach().float().contiguous()
        else:
            x = (full[:, row:row + part.rows] if part.experts else full[row:row + part.rows]).detach().float()
        if part.heads:
            x = to_gguf_rows(x, part.heads)
        if part.offset:
            x = x + part.offset
        return x.numpy().astype(np_dtype, copy=False)

    return TensorEntry(name=part.name, type=TENSOR_TYPES_BY_NAME[type_name], shape=tuple(shape), data=data)


def _tokenizer_entries(tokenizer: Any, given: Mapping[str, Any] | None) -> list[MetadataEntry]:
    if given is not None:
        bad = [k for k in given if not k.startswith(TOKENIZER_PREFIX)]
        if bad:
            raise InputError(f"tokenizer_metadata keys must start with {TOKENIZER_PREFIX!r}: {bad}")
        return [(k, infer_types(v), v) for k, v in given.items()]
    if tokenizer is None:
        return []
    typed = getattr(tokenizer, "gguf_metadata", None)
    if typed is None:
        raise InputError(f"tokenizer from {getattr(tokenizer, 'source', '?')} has no GGUF vocabulary to write "
                         "(only tokenizers read from a .gguf file carry one); pass tokenizer_metadata instead")
    return [(k, types, v) for k, (types, v) in typed.items()]


def _special_token_entries(config: ModelConfig, present: set[str]) -> list[MetadataEntry]:
    """The config's bos/eos/pad ids, where the tokenizer metadata does not already give them."""
    keys = {"bos_token_id": "tokenizer.ggml.bos_token_id", "eos_token_id": "tokenizer.ggml.eos_token_id",
            "pad_token_id": "tokenizer.ggml.padding_token_id"}
    return [(key, (ValueType.UINT32,), getattr(config, field)) for field, key in keys.items()
            if getattr(config, field) is not None and key not in present]


__all__ = ["GGUFFile", "GGUFTensor", "ValueType", "load_gguf", "read_gguf", "read_gguf_config", "save_gguf"]
