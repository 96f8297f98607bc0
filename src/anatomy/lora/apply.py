"""Putting an adapter on a model: LoRA layers in (unmerged, the base frozen), taken out, or an
adapter's updates merged into the base weights.

    apply_lora(model, LoraConfig(rank=8, targets=("q", "v")))   fresh pairs to train (B = 0)
    apply_lora(model, "runs/x/adapter")                         an adapter's pairs, run unmerged
    merge_lora(model, "runs/x/adapter")                         W += scale * B @ A, no LoRA layers
    merge_lora(model)                                           the model's own LoRA layers merged and removed
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from anatomy.errors import InputError
from anatomy.lora.adapter import Adapter, load_weights, lora_layers, param_name
from anatomy.lora.config import LoraConfig
from anatomy.lora.layer import LoRALinear
from anatomy.lora.read import read_adapter
from anatomy.lora.sites import Site, sites


def apply_lora(model: nn.Module, adapter: Adapter | LoraConfig | str | Path) -> nn.Module:
    """Wrap each adapted projection of `model` in a LoRALinear (in place) and freeze every other
    parameter. A LoraConfig gives fresh pairs (drawn from torch's RNG); an Adapter or a PEFT
    directory its own, checked against the model. Returns the model."""
    if lora_layers(model):
        raise InputError("the model already holds LoRA layers: merge_lora(model) first, or apply to a fresh model")
    adapter = _adapter(adapter, model)
    config = adapter.config if isinstance(adapter, Adapter) else adapter
    weights = {} if not isinstance(adapter, Adapter) else {  # checked before the model is touched
        param_name(s, part): t for s, a, b in adapter.pairs(model.config) for part, t in (("A", a), ("B", b))}
    chosen = sites(model.config, config)
    for p in model.parameters():
        p.requires_grad_(False)
    device = next(model.parameters()).device
    for module, group in _by_module(chosen).items():
        base = model.get_submodule(module)
        layer = LoRALinear(base, ranges={s.target: (s.start, s.stop) for s in group}, in_features=group[0].in_features,
                           out_features=_out_features(base), rank=config.rank, scale=config.scale,
                           dropout=config.dropout, device=device)
        _replace(model, module, layer)
    model.lora_config = config
    load_weights(model, weights)
    return model


def merge_lora(model: nn.Module, adapter: Adapter | str | Path | None = None) -> nn.Module:
    """Add scale * B @ A into the base weights, in place: `adapter`'s (an Adapter, a PEFT directory or a GGUF file),
    or, with none, those of the model's own LoRA layers, which are then removed. Returns the model."""
    if adapter is None:
        return _merge_own(model)
    if lora_layers(model):
        raise InputError("the model holds LoRA layers: merge_lora(model) merges them; merge another adapter after")
    adapter = _adapter(adapter, model)
    if not isinstance(adapter, Adapter):
        raise InputError(f"merge_lora takes an adapter (a PEFT directory or an Adapter), got {type(adapter).__name__}")
    for site, a, b in adapter.pairs(model.config):
        _add_rows(model.get_submodule(site.module), site.module, site.start,
                  (b.float() @ a.float()) * adapter.config.scale)
    return model


def _merge_own(model: nn.Module) -> nn.Module:
    layers = lora_layers(model)
    if not layers:
        raise InputError("the model holds no LoRA layers: pass the adapter to merge (merge_lora(model, path))")
    for module, layer in layers.items():
        for target, (start, _) in layer.ranges.items():
            _add_rows(layer.base, module, start, layer.delta(target))
        _replace(model, module, layer.base)
    del model.lora_config
    return model


def _add_rows(base: nn.Module, module: str, start: int, delta: Tensor) -> None:
    """base.weight[start : start + rows] += delta, for a float weight."""
    weight = getattr(base, "weight", None)
    if not isinstance(weight, Tensor) or not weight.is_floating_point():
        raise InputError(f"{module}: merge_lora adds to float weights, and this layer is a {type(base).__name__} "
                         "(load the model with weights='f32' to merge, or run the adapter unmerged)")
    with torch.no_grad():
        weight[start:start + delta.shape[0]] += delta.to(weight.device, weight.dtype)


def _adapter(adapter: Adapter | LoraConfig | str | Path, model: nn.Module) -> Adapter | LoraConfig:
    if isinstance(adapter, (str, Path)):
        return read_adapter(adapter, model.config)
    if not isinstance(adapter, (Adapter, LoraConfig)):
        raise InputError(f"an adapter is a PEFT directory, an Adapter or a LoraConfig, got {type(adapter).__name__}")
    return adapter


def _by_module(chosen: list[Site]) -> dict[str, list[Site]]:
    out: dict[str, list[Site]] = {}
    for s in chosen:
        out.setdefault(s.module, []).append(s)
    return out


def _out_features(base: nn.Module) -> int:
    return int(getattr(base, "out_features", None) or base.weight.shape[0])


def _replace(model: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent), name, module)
