"""An adapter: its LoraConfig and its tensors, checked against a model's config; and the LoRA
layers and parameters a model holds.

An adapter's tensors are named as the model's LoRA parameters: `<module>.lora_A.<target>`, e.g.
`stack.blocks.3.attn.qkv.lora_A.q` [r, K] and `...lora_B.q` [rows, r].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from anatomy.config import ModelConfig
from anatomy.errors import InputError
from anatomy.lora.config import LoraConfig
from anatomy.lora.layer import LoRALinear
from anatomy.lora.sites import Site, sites


@dataclass(frozen=True)
class Adapter:
    config: LoraConfig
    weights: dict[str, Tensor]  # by parameter name (param_name)
    source: str = field(default="", compare=False)  # the file it was read from, for errors

    def pairs(self, model_config: ModelConfig) -> list[tuple[Site, Tensor, Tensor]]:
        """(site, A, B) of every site of this adapter on a model of `model_config`, each checked."""
        where = self.source or "the adapter"
        out = []
        for s in sites(model_config, self.config):
            a, b = (self.weights.get(param_name(s, part)) for part in "AB")
            if a is None or b is None:
                raise InputError(f"{where}: tensor {param_name(s, 'A' if a is None else 'B')!r} is missing")
            shapes = s.shapes(self.config.rank)
            out.append((s, check_tensor(where, param_name(s, "A"), a, shapes["A"], rank_dim=0),
                        check_tensor(where, param_name(s, "B"), b, shapes["B"], rank_dim=1)))
        return out


def param_name(site: Site, part: str) -> str:
    return f"{site.module}.lora_{part}.{site.target}"


def check_tensor(path: str | Path, key: str, t: Tensor, shape: tuple[int, int], *, rank_dim: int) -> Tensor:
    """t, checked: a float tensor of `shape` (its rank, the adapter's, on rank_dim) with finite values."""
    if not t.is_floating_point():
        raise InputError(f"{path}: tensor {key!r} is {t.dtype}, not a float tensor")
    if t.dim() == 2 and t.shape[rank_dim] != shape[rank_dim] and t.shape[1 - rank_dim] == shape[1 - rank_dim]:
        raise InputError(f"{path}: tensor {key!r} has rank {t.shape[rank_dim]}, the adapter's r is {shape[rank_dim]}")
    if tuple(t.shape) != shape:
        raise InputError(f"{path}: tensor {key!r} has shape {tuple(t.shape)}, the model needs {shape}")
    if not t.isfinite().all():
        raise InputError(f"{path}: tensor {key!r} holds non-finite values")
    return t


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def lora_config_of(model: nn.Module) -> LoraConfig | None:
    """The LoraConfig of the layers apply_lora put in (None: the model has none)."""
    return getattr(model, "lora_config", None) if lora_layers(model) else None


def load_weights(model: nn.Module, weights: dict[str, Tensor]) -> None:
    """Copy an adapter's tensors into the model's LoRA parameters (names and shapes as adapter_state gives)."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, t in weights.items():
            params[name].copy_(t)


def adapter_state(model: nn.Module) -> dict[str, Tensor]:
    """The model's LoRA parameters by name (what an adapter file holds)."""
    return {f"{prefix}.{name}": p for prefix, layer in lora_layers(model).items()
            for name, p in layer.named_parameters() if name.startswith("lora_")}


def adapter_of(model: nn.Module) -> Adapter:
    config = lora_config_of(model)
    if config is None:
        raise InputError("the model holds no LoRA layers (apply_lora puts them in)")
    return Adapter(config=config, weights={k: v.detach() for k, v in adapter_state(model).items()})
