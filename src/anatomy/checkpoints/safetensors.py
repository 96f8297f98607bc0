"""Hugging Face checkpoint directories: config.json + model.safetensors (or a sharded
model.safetensors.index.json), read into anatomy's models and written back for HF transformers.

Reading: config.json -> ModelConfig -> the model built on the meta device -> the file's tensors
(views of a memory map, validated first) renamed by the explicit name maps of hf_names.py ->
assign_tensors. Only fused projections (q/k/v, gate/up) are concatenated; nothing else is copied.
gpt-oss's MXFP4 experts are read into compact formats by hf_mxfp4.py.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from anatomy.checkpoints.assign import assign_tensors
from anatomy.checkpoints.hf_config import ARCHITECTURES, LANGUAGE_MODEL_OF, config_from_hf, config_to_hf, layout_of
from anatomy.checkpoints.hf_mxfp4 import packed_experts
from anatomy.checkpoints.hf_names import OPTIONAL_PREFIX, TensorLink, family_of, ignorable, tensor_links
from anatomy.checkpoints.safetensors_format import atomic_file, read_tensors, write_tensors
from anatomy.config import ModelConfig
from anatomy.errors import CheckpointError, ConfigError
from anatomy.models import build_model
from anatomy.weights.choice import compact_formats, install
from anatomy.weights.modules import float_state_dict

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"


# -- reading ---------------------------------------------------------------------------------------
def read_hf_config(path: str | Path) -> ModelConfig:
    """The ModelConfig of an HF directory or of its config.json file."""
    path = Path(path)
    file = path / CONFIG_NAME if path.is_dir() else path
    return _config_of(_read_json(file), file)


def load_hf(path: str | Path, *, dtype: torch.dtype | None = torch.float32, weights: str = "auto") -> nn.Module:
    """The model of an HF checkpoint directory, in eval mode, its weights converted to `dtype`
    (None keeps the file's), its matrices then in the formats of the `weights` choice
    (weights/choice.py; "auto" keeps them dense)."""
    directory = Path(path)
    hf = _read_json(directory / CONFIG_NAME)
    config = _config_of(hf, directory / CONFIG_NAME)
    family = layout_of(hf)
    tensors, files = read_weights(directory)
    if family == "bert" and _find("pooler.dense.weight", tensors, family) is None:
        config = config.replace(pooler=False)  # a BertModel saved without its pooler (add_pooling_layer=False)
    model = build_model(config, head="mlm" if family == "bert-mlm" else "auto", device="meta")
    links = tensor_links(model, family)
    packed, used = packed_experts(hf, links, tensors, files, config_file=directory / CONFIG_NAME)
    ours = _from_hf_names(model, family, [link for link in links if link.ours not in packed],
                          {n: t for n, t in tensors.items() if n not in used}, files)
    if weights != "auto":  # MXFP4 experts kept by "auto" (and "int8", exactly); widened for the others
        ours |= {name: fmt.dequantize(dtype or _float_dtype(ours)) for name, fmt in packed.items()}
    model = assign_tensors(model, ours, source=directory, dtype=dtype, compact=packed if weights == "auto" else None)
    model.hf_layout = LANGUAGE_MODEL_OF.get(family, family)  # save_hf writes it back as the class it came from
    if weights != "auto":
        state = model.state_dict()
        own = next(p.dtype for p in model.parameters() if p.is_floating_point())
        install(model, compact_formats(model, weights, dtype=own, lossless=packed.get,
                                       dense=lambda name: state[name]), dtype=own)
    return model


def _float_dtype(tensors: dict[str, Tensor]) -> torch.dtype:
    """The dtype of a checkpoint's float tensors (what its MXFP4 experts are widened to when it is kept)."""
    return next((t.dtype for t in tensors.values() if t.is_floating_point()), torch.float32)


def _read_json(file: Path) -> Any:
    if not file.is_file():
        raise CheckpointError(f"{file}: no such file (an HF checkpoint directory needs {CONFIG_NAME})")
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CheckpointError(f"{file}: not valid UTF-8 JSON ({e})") from None


def _config_of(hf: Any, file: Path) -> ModelConfig:
    try:
        return config_from_hf(hf)
    except ConfigError as e:
        raise ConfigError(f"{file}: {e}") from None


def read_weights(directory: Path) -> tuple[dict[str, Tensor], dict[str, Path]]:
    """Every tensor of the checkpoint and the file it came from (for messages)."""
    single, index = directory / WEIGHTS_NAME, directory / INDEX_NAME
    if single.is_file():
        tensors = read_tensors(single)
        return tensors, dict.fromkeys(tensors, single)
    if index.is_file():
        return _read_sharded(index)
    raise CheckpointError(f"{directory}: neither {WEIGHTS_NAME} nor {INDEX_NAME} is there")


def _read_sharded(index: Path) -> tuple[dict[str, Tensor], dict[str, Path]]:
    content = _read_json(index)
    weight_map = content.get("weight_map") if isinstance(content, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index}: field weight_map is not a map of tensor names to file names")
    tensors, files = {}, {}
    for shard_name in sorted(set(weight_map.values())):
        shard = index.parent / shard_name
        if Path(shard_name).name != shard_name or shard_name in ("", ".", ".."):
            raise CheckpointError(f"{index}: weight_map names file {shard_name!r}, which is not in this directory")
        if not shard.is_file():
            raise CheckpointError(f"{index}: weight_map names {shard_name!r}, which does not exist")
        in_shard = read_tensors(shard)
        for name in (n for n, f in weight_map.items() if f == shard_name):
            if name not in in_shard:
                raise CheckpointError(f"{index}: weight_map puts tensor {name!r} in {shard_name}, which lacks it")
            tensors[name], files[name] = in_shard[name], shard
    return tensors, files


def _find(name: str, available: dict[str, Tensor], family: str) -> str | None:
    """The file's name for an HF tensor name, allowing the base-model prefix to be absent or present."""
    if name in available:
        return name
    prefix = OPTIONAL_PREFIX.get(family)
    if prefix:
        alias = name[len(prefix):] if name.startswith(prefix) else prefix + name
        if alias in available:
            return alias
    return None


def _from_hf_names(model: nn.Module, family: str, links: list[TensorLink], tensors: dict[str, Tensor],
                   files: dict[str, Path]) -> dict[str, Tensor]:
    found = {h: _find(h, tensors, family) for link in links for h in link.hf}
    missing = sorted(h for h, name in found.items() if name is None)
    skip = ignorable(family, model.config)
    used = set(found.values())
    unexpected = sorted(n for n in tensors if n not in used and not skip.fullmatch(n))
    if missing or unexpected:
        where = ", ".join(sorted({str(f) for f in files.values()})) or "checkpoint"
        parts = [f"missing tensors {_short(missing)}"] if missing else []
        parts += [f"unexpected tensors {_short(unexpected)}"] if unexpected else []
        raise CheckpointError(f"{where}: {'; '.join(parts)} (for HF {ARCHITECTURES[family]})")
    return {link.ours: _join(link, [found[h] for h in link.hf], tensors, files) for link in links}


def _short(names: list[str], n: int = 8) -> str:
    return str(names[:n])[:-1] + (f", ... ({len(names)} in all)]" if len(names) > n else "]")


def _join(link: TensorLink, names: list[str], tensors: dict[str, Tensor], files: dict[str, Path]) -> Tensor:
    parts = []
    for name, hf_shape, our_shape in zip(names, link.hf_shapes, link.part_shapes):
        t = tensors[name]
        if t.shape != hf_shape:
            raise CheckpointError(f"{files[name]}: tensor {name!r} has shape {list(t.shape)}, "
                                  f"the config calls for {list(hf_shape)}")
        if not t.is_floating_point():
            raise CheckpointError(f"{files[name]}: tensor {name!r} has dtype {t.dtype}, not a floating-point dtype")
        parts.append(link.to_ours(t, our_shape))
    joined = parts[0] if len(parts) == 1 else torch.cat(parts)  # fused projections: [q; k; v], [gate; up]
    return joined.reshape(link.shape) if len(link.shape) == 3 else joined  # stacked experts [E, R, C]


# -- writing ---------------------------------------------------------------------------------------
def save_hf(model: nn.Module, path: str | Path, *, dtype: torch.dtype | None = None,
            layout: str | None = None) -> Path:
    """Write `model` as an HF checkpoint directory (config.json + model.safetensors) that HF
    transformers' from_pretrained loads. Each file is replaced atomically; a new directory appears
    only once complete.

    `layout` is the HF model_type to write (e.g. "phi3" for a model with Phi-3's fields); default: the
    one the model was loaded from, else the one its config's fields choose."""
    directory = Path(path)
    family = layout or getattr(model, "hf_layout", None) or family_of(model)
    if family not in ARCHITECTURES:
        raise ConfigError(f"layout={family!r} is not one of {', '.join(ARCHITECTURES)}")
    hf = config_to_hf(model.config, "bert" if family.startswith("bert") else family)
    tensors = _to_hf_names(model, family, dtype)
    hf["architectures"] = [ARCHITECTURES[family]]
    hf["dtype"] = str(next(iter(tensors.values())).dtype).removeprefix("torch.")
    if directory.exists():
        _write_files(directory, hf, tensors)
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}."))
    try:
        _write_files(staging, hf, tensors)
        os.replace(staging, directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return directory


def _write_files(directory: Path, hf: dict[str, Any], tensors: dict[str, Tensor]) -> None:
    write_tensors(directory / WEIGHTS_NAME, tensors, metadata={"format": "pt"})
    with atomic_file(directory / CONFIG_NAME) as f:
        f.write((json.dumps(hf, indent=2, sort_keys=True) + "\n").encode())


def _to_hf_names(model: nn.Module, family: str, dtype: torch.dtype | None) -> dict[str, Tensor]:
    state = float_state_dict(model)
    out = {}
    for link in tensor_links(model, family):
        t = state[link.ours].detach()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        if len(link.hf) == 1:
            out[link.hf[0]] = link.to_hf(t, link.hf_shapes[0])
            continue
        if t.dim() == 3:  # stacked experts [E, R, C]: their rows one after the other
            t = t.reshape(-1, t.shape[-1])
        parts = t.split([s[0] for s in link.part_shapes])
        for name, part, hf_shape in zip(link.hf, parts, link.hf_shapes):
            out[name] = (part.t() if link.transpose else part).reshape(hf_shape)
    if family == "marian" and "final_logits_bias" not in out:  # HF Marian always has the logits bias
        dtype = dtype or model.shared.weight.dtype
        out["final_logits_bias"] = torch.zeros(1, model.config.vocab_size, dtype=dtype)
    return out
