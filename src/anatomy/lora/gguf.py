"""llama.cpp's LoRA adapters: the GGUF file its `convert_lora_to_gguf.py` writes, read as an Adapter.

    general.type "adapter", adapter.type "lora", adapter.lora.alpha   the adapter's alpha (scale alpha / r)
    blk.N.attn_q.weight.lora_a [r, K], blk.N.attn_q.weight.lora_b [rows, r]   per adapted projection

The converter reorders q's and k's B rows for llama.cpp's rotary layout, as it does the base's: they
are put back in HF's order. Targets and layers are the projections the file holds; every tensor is
checked against the model as a PEFT directory's are (peft.py).
"""

from __future__ import annotations

import numbers
from pathlib import Path

import torch
from torch import Tensor

from anatomy.checkpoints.gguf_dequant import dequantize
from anatomy.checkpoints.gguf_names import from_gguf_rows, tensor_parts
from anatomy.checkpoints.gguf_reader import GGUFFile, read_gguf
from anatomy.config import ModelConfig
from anatomy.errors import CheckpointError, InputError
from anatomy.lora.adapter import Adapter, check_tensor, param_name
from anatomy.lora.config import LoraConfig
from anatomy.lora.peft import as_product
from anatomy.lora.sites import all_sites, sites


def read_gguf_lora(path: str | Path, model_config: ModelConfig) -> Adapter:
    """The LoRA adapter in llama.cpp's GGUF file `path`, checked against a model of `model_config`."""
    path = Path(path)
    try:
        f = read_gguf(path)
    except CheckpointError as exc:
        raise InputError(str(exc)) from None
    meta = f.metadata
    if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
        raise InputError(f"{path}: not a LoRA adapter (general.type {meta.get('general.type')!r}, adapter.type "
                         f"{meta.get('adapter.type')!r}; convert_lora_to_gguf.py writes 'adapter' and 'lora')")
    alpha = meta.get("adapter.lora.alpha")
    if not isinstance(alpha, numbers.Real) or isinstance(alpha, bool):
        raise InputError(f"{path}: adapter.lora.alpha {alpha!r} is not a number")
    names = _names(model_config, str(meta.get("general.architecture")))
    present = [s for s in all_sites(model_config, hf_names=False)
               if f"{names[s.module, s.target][0]}.lora_a" in f.tensors]
    if not present:
        raise InputError(f"{path}: holds no LoRA tensor of this model's projections (e.g. "
                         f"{next(iter(names.values()))[0]}.lora_a)")
    targets, layers = as_product(path, present, n_layers=model_config.n_layers)
    rank = f.tensors[f"{names[present[0].module, present[0].target][0]}.lora_a"].shape[0]
    try:
        config = LoraConfig(rank=int(rank), alpha=float(alpha), targets=targets, layers=layers)
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from None
    chosen = sites(model_config, config)
    weights = {}
    for s in chosen:
        name, heads = names[s.module, s.target]
        for part, shape in s.shapes(rank).items():
            key = f"{name}.lora_{part.lower()}"
            t = _tensor(f, key, path)
            if part == "B" and heads and t.shape == shape:
                t = from_gguf_rows(t, heads)
            weights[param_name(s, part)] = check_tensor(path, key, t, shape, rank_dim=0 if part == "A" else 1)
    expected = {f"{names[s.module, s.target][0]}.lora_{p}" for s in chosen for p in "ab"}
    extra = sorted(set(f.tensors) - expected)
    if extra:
        raise InputError(f"{path}: tensor {extra[0]!r} is not a LoRA weight of the adapter's projections "
                         f"({len(extra)} unexpected)")
    return Adapter(config=config, weights=weights, source=str(path))


def _names(config: ModelConfig, arch: str) -> dict[tuple[str, str], tuple[str, int]]:
    """(module, target) -> its GGUF tensor (e.g. blk.3.attn_q.weight) and the heads its rows are reordered
    over (0: none)."""
    every = all_sites(config, hf_names=False)
    rows = {s.module: max(t.stop for t in every if t.module == s.module) for s in every}  # the module's output rows
    out = {}
    for s in every:
        weight = f"{s.module}.weight"
        parts = tensor_parts({weight: torch.Size([rows[s.module], s.in_features])}, config, arch)[weight]
        row = 0
        for p in parts:
            if row == s.start:
                out[s.module, s.target] = (p.name, p.heads)
                break
            row += p.rows
    return out


def _tensor(f: GGUFFile, key: str, path: Path) -> Tensor:
    t = f.tensors.get(key)
    if t is None:
        raise InputError(f"{path}: tensor {key!r} is missing")
    try:
        return dequantize(f.raw(key), t.type, t.shape).float().clone()
    except (CheckpointError, ValueError) as exc:
        raise InputError(f"{path}: tensor {key!r}: {exc}") from None
