"""HF PEFT's adapter directory, read and written: what `PeftModel.from_pretrained` loads unchanged.

    adapter_config.json          {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", ...],
                                  "base_model_name_or_path": ..., ...}
    adapter_model.safetensors    base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight [r, K]
                                 base_model.model.model.layers.3.self_attn.q_proj.lora_B.weight [rows, r]

Reading checks every field and tensor against the model's config (the first problem is one
InputError naming the file and the field or tensor); PEFT options anatomy does not run are refused.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from anatomy.atomic import atomic_file, write_errors_named
from anatomy.checkpoints.safetensors_format import read_tensors, write_tensors
from anatomy.config import ModelConfig
from anatomy.errors import CheckpointError, InputError
from anatomy.lora.adapter import Adapter, adapter_of, check_tensor, param_name
from anatomy.lora.config import LoraConfig, TARGETS
from anatomy.lora.sites import Site, all_sites, sites

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PREFIX = "base_model.model."
# PEFT options that change the adapter's product; anatomy refuses an adapter that sets one
UNSUPPORTED = ("use_dora", "lora_bias", "rank_pattern", "alpha_pattern", "modules_to_save", "target_parameters",
               "exclude_modules", "layer_replication", "trainable_token_indices", "use_qalora", "use_bdlora",
               "alora_invocation_tokens")


def peft_key(site: Site, part: str) -> str:
    return f"{PREFIX}{site.hf_module}.lora_{part}.weight"


def save_adapter(model_or_adapter: nn.Module | Adapter, path: str | Path, *,
                 model_config: ModelConfig | None = None) -> Path:
    """Write a model's LoRA layers (or an Adapter, with its model's config) as a PEFT directory."""
    if isinstance(model_or_adapter, Adapter):
        if model_config is None:
            raise InputError("save_adapter(adapter, path) needs model_config= (the base model's config)")
        return write_peft(path, model_or_adapter, model_config)
    return write_peft(path, adapter_of(model_or_adapter), model_or_adapter.config)


# -- writing ------------------------------------------------------------------------------------

def write_peft(directory: str | Path, adapter: Adapter, model_config: ModelConfig) -> Path:
    """adapter_config.json + adapter_model.safetensors in `directory` (made if missing)."""
    directory = Path(directory)
    with write_errors_named(directory):
        directory.mkdir(parents=True, exist_ok=True)
    pairs = adapter.pairs(model_config)
    chosen = [s for s, _, _ in pairs]
    tensors = {peft_key(s, part): t.detach().contiguous().cpu()
               for s, a, b in pairs for part, t in (("A", a), ("B", b))}
    write_tensors(directory / WEIGHTS_FILE, tensors, metadata={"format": "pt"})
    with atomic_file(directory / CONFIG_FILE) as f:
        f.write(json.dumps(peft_config(adapter.config, chosen), indent=2).encode())
    return directory


def peft_config(config: LoraConfig, chosen: list[Site]) -> dict[str, Any]:
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": config.base_model,
        "r": config.rank, "lora_alpha": config.alpha, "lora_dropout": config.dropout, "use_rslora": config.rslora,
        "target_modules": sorted({s.hf_module.rpartition(".")[2] for s in chosen}),
        "layers_to_transform": list(config.layers) if config.layers is not None else None,
        "bias": "none", "fan_in_fan_out": False, "init_lora_weights": True, "inference_mode": True,
        "modules_to_save": None, "rank_pattern": {}, "alpha_pattern": {}, "use_dora": False,
    }


# -- reading ------------------------------------------------------------------------------------

def read_peft(directory: str | Path, model_config: ModelConfig) -> Adapter:
    """The adapter in a PEFT directory, checked against a model of `model_config`."""
    directory = Path(directory)
    if not directory.is_dir():
        raise InputError(f"{directory}: not a directory (a PEFT adapter is a directory holding {CONFIG_FILE} "
                         f"and {WEIGHTS_FILE})")
    config_path = directory / CONFIG_FILE
    config = lora_config(config_path, _read_json(config_path), model_config)
    weights_path = directory / WEIGHTS_FILE
    tensors = _read_weights(weights_path)
    return Adapter(config=config, weights=_checked(weights_path, tensors, sites(model_config, config), config.rank),
                   source=str(weights_path))


def lora_config(path: Path, raw: Any, model_config: ModelConfig) -> LoraConfig:
    """adapter_config.json's fields as a LoraConfig, the target modules matched as PEFT matches them."""
    if not isinstance(raw, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    if raw.get("peft_type") != "LORA":
        raise InputError(f"{path}: peft_type {raw.get('peft_type')!r} is not 'LORA'")
    used = next((k for k in UNSUPPORTED if raw.get(k)), None)
    if used is not None or raw.get("bias", "none") != "none":
        key = used or "bias"
        raise InputError(f"{path}: {key}={raw[key]!r} is set; anatomy runs plain LoRA adapters without it")
    targets, layers = _targets(path, raw.get("target_modules"), _layers(path, raw.get("layers_to_transform")),
                               model_config)
    try:
        return LoraConfig(rank=raw.get("r", 8), alpha=raw.get("lora_alpha", 8), dropout=raw.get("lora_dropout", 0.0),
                          targets=targets, rslora=bool(raw.get("use_rslora", False)), layers=layers,
                          base_model=raw.get("base_model_name_or_path"))
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from None


def _layers(path: Path, value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    values = [value] if isinstance(value, int) else value
    if not isinstance(values, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in values):
        raise InputError(f"{path}: layers_to_transform {value!r} is not a layer index or a list of them")
    return tuple(sorted(set(values)))


def _targets(path: Path, value: Any, layers: tuple[int, ...] | None, model_config: ModelConfig
             ) -> tuple[tuple[str, ...], tuple[int, ...] | None]:
    """(targets, layers) of the modules target_modules names (PEFT's rule: a list entry is a full
    name or a name's last parts, a string a regex of the full name)."""
    every = all_sites(model_config)
    candidates = [s for s in every if s.hf_module is not None and (layers is None or s.layer in layers)]
    if isinstance(value, str):
        matched = [s for s in candidates if re.fullmatch(value, s.hf_module)]
        if not matched:
            raise InputError(f"{path}: target_modules {value!r} matches no projection of this model")
    elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        matched = []
        for name in value:
            hits = [s for s in candidates if s.hf_module == name or s.hf_module.endswith("." + name)]
            if not hits:
                raise InputError(f"{path}: target module {name!r} is not a projection of this model "
                                 f"(it has {', '.join(sorted({s.hf_module.rpartition('.')[2] for s in candidates}))})")
            matched += hits
    else:
        raise InputError(f"{path}: target_modules {value!r} is not a list of module names or a regex")
    return as_product(path, matched, n_layers=1 + max(s.layer for s in every))


def as_product(path: Path, matched: list[Site], n_layers: int) -> tuple[tuple[str, ...], tuple[int, ...] | None]:
    """The matched sites as targets x layers (anatomy's adapters are that product)."""
    targets = tuple(t for t in TARGETS if any(s.target == t for s in matched))
    layers = tuple(sorted({s.layer for s in matched}))
    if len({(s.target, s.layer) for s in matched}) != len(targets) * len(layers):
        raise InputError(f"{path}: target_modules adapts different projections in different layers; anatomy's "
                         "adapters adapt the same projections in every layer they adapt")
    return targets, layers if len(layers) < n_layers else None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: missing (a PEFT adapter directory holds {CONFIG_FILE})") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: not readable JSON ({exc})") from None


def _read_weights(path: Path) -> dict[str, Tensor]:
    if not path.is_file():
        bin_file = path.with_name("adapter_model.bin")
        hint = f" ({bin_file.name} is a pickle, which anatomy does not read: save it as safetensors)" \
            if bin_file.exists() else ""
        raise InputError(f"{path}: missing{hint}")
    try:
        return read_tensors(path)
    except CheckpointError as exc:
        raise InputError(str(exc)) from None


def _checked(path: Path, tensors: dict[str, Tensor], chosen: list[Site], rank: int) -> dict[str, Tensor]:
    """The adapter's tensors by anatomy's names; every one present, of the rank and shape, finite,
    and none left over."""
    out = {}
    for site in chosen:
        for part, shape in site.shapes(rank).items():
            key = peft_key(site, part)
            if key not in tensors:
                raise InputError(f"{path}: tensor {key!r} is missing")
            out[param_name(site, part)] = check_tensor(path, key, tensors[key], shape, rank_dim=0 if part == "A" else 1)
    expected = {peft_key(s, part) for s in chosen for part in "AB"}
    extra = sorted(set(tensors) - expected)
    if extra:
        raise InputError(f"{path}: tensor {extra[0]!r} is not a LoRA weight of the adapter's target modules "
                         f"({len(extra)} unexpected)")
    return out
