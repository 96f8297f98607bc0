"""Training checkpoints: everything needed to continue a run to the bit, written atomically.

    <run>/checkpoints/step-000100/   the weights (HF layout; a LoRA run: its PEFT adapter), anatomy_config.json,
                                     the tokenizer, optimizer.safetensors, trainer.json, rng-rank{r}.json
    <run>/checkpoints/latest.json    {"step": 100, "dir": "step-000100"}

Written into a hidden temporary directory, every file fsynced, renamed into place, then latest.json replaced
the same way: a crash leaves the previous checkpoint and pointer intact. No pickle; full tensors by parameter
name, so N ranks write what M ranks read. Details: docs/training.md, "What it does" (checkpoints, resume).
"""

from __future__ import annotations

import base64
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as safetensors_bytes
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from anatomy.checkpoints.assign import tied_aliases
from anatomy.config import ModelConfig
from anatomy.errors import AnatomyError, CheckpointError, ConfigError, InputError
from anatomy.lora.adapter import Adapter, adapter_state, lora_config_of
from anatomy.lora.config import LoraConfig
from anatomy.lora.peft import read_peft, write_peft
from anatomy.text.tokenizer import Tokenizer
from anatomy.training.distributed import Dist, all_reduce_sum, barrier

ADAMW_STATE = ("step", "exp_avg", "exp_avg_sq")
_GATHER = StateDictOptions(full_state_dict=True, cpu_offload=True)
_GATHER_TRAINED = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
_SCATTER = StateDictOptions(full_state_dict=True)
_SCATTER_TRAINED = StateDictOptions(full_state_dict=True, strict=False)  # a LoRA run: the adapter's tensors


def checkpoint_root(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


# -- writing ------------------------------------------------------------------------------------

def save_checkpoint(run_dir: Path, *, wrapped: nn.Module, model: nn.Module, optimizer: torch.optim.Optimizer,
                    trainer: dict[str, Any], tokenizer: Tokenizer, info: Dist, keep: int) -> Path | None:
    """Write checkpoint step-<trainer['step']>; every rank calls this (the gather is collective).
    Returns the directory, or None when the weights are not finite (nothing is then written)."""
    finite = torch.tensor(float(all(torch.isfinite(_local(p)).all() for p in model.parameters())), device=info.device)
    if all_reduce_sum(finite, info).item() < info.world:
        return None
    lora = lora_config_of(model)
    weights = get_model_state_dict(wrapped, options=_GATHER if lora is None else _GATHER_TRAINED)
    optim = get_optimizer_state_dict(wrapped, optimizer, options=_GATHER)
    root = checkpoint_root(run_dir)
    final = root / f"step-{trainer['step']:06d}"
    tmp = root / f".tmp-{final.name}"
    if info.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier(info)
    _write_json(tmp / f"rng-rank{info.rank}.json", rng_state())
    if info.is_main:
        _write_main_files(tmp, model=model, weights=weights, optim=optim, trainer=trainer, tokenizer=tokenizer)
    barrier(info)
    if info.is_main:
        _fsync_dir(tmp)
        _publish(tmp, final)
        _write_json(root / "latest.json", {"step": trainer["step"], "dir": final.name}, atomic=True)
        prune(root, keep=keep)
    barrier(info)
    return final


def _local(p: Tensor) -> Tensor:
    return p.to_local() if hasattr(p, "to_local") else p.detach()


def _write_main_files(tmp: Path, *, model: nn.Module, weights: dict[str, Tensor], optim: dict[str, Any],
                      trainer: dict[str, Any], tokenizer: Tokenizer) -> None:
    lora = lora_config_of(model)
    if lora is None:
        _write_weights(tmp, model, weights)
    else:
        write_peft(tmp, Adapter(config=lora, weights=weights), model.config)
    _write_json(tmp / "anatomy_config.json", model.config.to_dict())
    tokenizer.save(tmp)
    optim_tensors = {f"{name}::{key}": _as_tensor(value).contiguous()
                     for name, state in optim["state"].items() for key, value in state.items()}
    _write_bytes(tmp / "optimizer.safetensors", safetensors_bytes(optim_tensors))
    _write_json(tmp / "trainer.json", {**trainer, "optimizer_groups": optim["param_groups"]})


def _write_weights(tmp: Path, model: nn.Module, weights: dict[str, Tensor]) -> None:
    """HF layout through anatomy.save, from an unsharded copy of the model holding `weights`."""
    from anatomy.checkpoints.loader import save
    from anatomy.models import MaskedLM, build_model

    aliases = tied_aliases(model)
    tensors = {k: v.contiguous() for k, v in weights.items() if k not in aliases}
    with torch.random.fork_rng(devices=[]):  # building draws initial weights: keep the run's RNG stream
        copy = build_model(model.config, head="mlm" if isinstance(model, MaskedLM) else "auto", init=False)
    copy.load_state_dict(tensors, strict=False)  # copies into the (tied) parameters
    try:
        save(copy, tmp)
    except ConfigError:  # no HF class expresses this config (e.g. a Pre-LN BERT): anatomy's names and fields
        _write_bytes(tmp / "model.safetensors", safetensors_bytes(tensors))
        _write_json(tmp / "config.json", model.config.to_dict())


def _as_tensor(value: Any) -> Tensor:
    return value if isinstance(value, Tensor) else torch.tensor(value)


def _publish(tmp: Path, final: Path) -> None:
    """Rename tmp to final; an existing final (the same step saved again) is moved aside first."""
    old = final.with_name(f".old-{final.name}")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def prune(root: Path, *, keep: int) -> None:
    """Keep the newest `keep` checkpoints and the one with the lowest recorded val loss (keep <= 0: all)."""
    steps = sorted(root.glob("step-*"))
    if keep <= 0 or len(steps) <= keep:
        return
    best = min(steps, key=lambda d: _val_loss(d))
    for directory in steps[:-keep]:
        if directory != best or _val_loss(best) == float("inf"):
            shutil.rmtree(directory, ignore_errors=True)


def _val_loss(directory: Path) -> float:
    """The val loss a checkpoint recorded; inf when it has none (or its trainer.json is unreadable)."""
    try:
        trainer = json.loads((directory / "trainer.json").read_text())
    except (OSError, ValueError):
        return float("inf")
    value = trainer.get("val_loss") if isinstance(trainer, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else float("inf")


def _write_bytes(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _write_json(path: Path, value: Any, *, atomic: bool = False) -> None:
    data = json.dumps(value, indent=1).encode()
    if not atomic:
        _write_bytes(path, data)
        return
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    _write_bytes(tmp, data)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- RNG ----------------------------------------------------------------------------------------

def rng_state() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": [version, list(internal), gauss],
             "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
             "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()}
    if torch.cuda.is_available():
        state["cuda"] = base64.b64encode(torch.cuda.get_rng_state().numpy().tobytes()).decode()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(_bytes_tensor(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(_bytes_tensor(state["cuda"]))


def _bytes_tensor(text: str) -> Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


# -- reading ------------------------------------------------------------------------------------

def latest_checkpoint(run_dir: Path) -> Path:
    """The checkpoint latest.json points at (errors name the file and what is wrong)."""
    pointer = checkpoint_root(run_dir) / "latest.json"
    if not pointer.is_file():
        raise CheckpointError(f"--resume: {pointer} does not exist (no checkpoint was written in {run_dir})")
    value = _read_json(pointer)
    if not isinstance(value, dict) or not isinstance(value.get("dir"), str):
        raise CheckpointError(f"{pointer}: key 'dir' is missing or not a string")
    directory = pointer.parent / value["dir"]
    if not directory.is_dir():
        raise CheckpointError(f"{pointer}: points at {directory}, which does not exist")
    return directory


def checkpoint_or_latest(path: Path) -> Path:
    """A checkpoint directory as is; a run directory (one with checkpoints/latest.json): its latest checkpoint."""
    return latest_checkpoint(path) if (checkpoint_root(Path(path)) / "latest.json").is_file() else Path(path)


def read_trainer(directory: Path) -> dict[str, Any]:
    path = directory / "trainer.json"
    trainer = _read_json(path)
    if not isinstance(trainer, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(trainer).__name__}")
    for key, kind in (("step", int), ("tokens", int), ("optimizer_groups", list)):
        if key not in trainer:
            raise CheckpointError(f"{path}: key {key!r} is missing")
        if isinstance(trainer[key], bool) or not isinstance(trainer[key], kind):
            raise CheckpointError(f"{path}: key {key!r} is not a JSON {'integer' if kind is int else 'list'}")
    return trainer


def read_config(directory: Path) -> ModelConfig:
    path = directory / "anatomy_config.json"
    try:
        return ModelConfig.from_dict(_read_json(path))
    except ConfigError as exc:
        raise CheckpointError(f"{path}: not a valid model config ({exc})") from exc


def load_checkpoint(directory: Path, *, wrapped: nn.Module, model: nn.Module, optimizer: torch.optim.Optimizer,
                    info: Dist) -> dict[str, Any]:
    """Check every file and tensor against the model first, then load weights, optimizer state and
    this rank's RNG state. Nothing is written. Returns trainer.json."""
    trainer = read_trainer(directory)
    lora = lora_config_of(model)
    if lora is None:
        expected = {k: tuple(v.shape) for k, v in model.state_dict().items() if k not in tied_aliases(model)}
        weights = _read_weights(directory, expected)
    else:
        expected = {k: tuple(v.shape) for k, v in adapter_state(model).items()}
        weights = _read_adapter(directory, model, lora)
    optim_state = _read_optimizer(directory / "optimizer.safetensors", expected)
    _check_groups(directory / "trainer.json", trainer["optimizer_groups"], optimizer, model)
    rng_path = directory / f"rng-rank{info.rank}.json"
    rng = _read_json(rng_path) if rng_path.is_file() else None
    set_model_state_dict(wrapped, weights, options=_SCATTER if lora is None else _SCATTER_TRAINED)
    optim = {"state": optim_state, "param_groups": trainer["optimizer_groups"]}
    set_optimizer_state_dict(wrapped, optimizer, optim, options=_SCATTER)
    if rng is not None:
        set_rng_state(rng)
    else:  # resumed on more ranks than wrote the checkpoint: a fresh, reproducible stream per rank
        torch.manual_seed(int(trainer.get("seed", 0)) * 1000 + trainer["step"] * 10 + info.rank)
    return trainer


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise CheckpointError(f"{path}: missing") from exc
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not readable JSON ({exc})") from exc


def _open_tensors(path: Path) -> dict[str, Tensor]:
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}
    except FileNotFoundError as exc:
        raise CheckpointError(f"{path}: missing") from exc
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from exc


def _read_weights(directory: Path, expected: dict[str, tuple[int, ...]]) -> dict[str, Tensor]:
    """The weights by anatomy's names (HF layout read by anatomy.load), checked against the model."""
    path = directory / "model.safetensors"
    if "d_model" in _read_json(directory / "config.json"):
        tensors = _open_tensors(path)
    else:
        from anatomy.checkpoints.loader import load

        try:
            loaded = load(directory, dtype=None)
        except (AnatomyError, OSError, ValueError, RuntimeError) as exc:
            raise CheckpointError(f"{path}: cannot be read back ({exc})") from exc
        aliases = tied_aliases(loaded)
        tensors = {k: v for k, v in loaded.state_dict().items() if k not in aliases}
    return _checked(path, tensors, expected)


def _read_adapter(directory: Path, model: nn.Module, lora: LoraConfig) -> dict[str, Tensor]:
    """The LoRA tensors of a LoRA run's checkpoint, its adapter the one this run trains."""
    try:
        adapter = read_peft(directory, model.config)
    except InputError as exc:
        raise CheckpointError(str(exc)) from None
    path = directory / "adapter_config.json"
    for field in ("rank", "alpha", "dropout", "targets", "rslora", "layers", "base_model"):
        have, want = getattr(adapter.config, field), getattr(lora, field)
        if have != want:
            raise CheckpointError(f"{path}: the checkpoint's adapter has {field}={have!r}, this run's {want!r} "
                                  "(resume with the options and --model the run started with)")
    return adapter.weights


def _checked(path: Path, tensors: dict[str, Tensor], expected: dict[str, tuple[int, ...]]) -> dict[str, Tensor]:
    for key, shape in expected.items():
        if key not in tensors:
            raise CheckpointError(f"{path}: key {key!r} is missing")
        if tuple(tensors[key].shape) != shape:
            raise CheckpointError(f"{path}: key {key!r} has shape {tuple(tensors[key].shape)}, the model needs {shape}")
        if not torch.isfinite(tensors[key]).all():
            raise CheckpointError(f"{path}: key {key!r} holds non-finite values")
    extra = sorted(set(tensors) - set(expected))
    if extra:
        raise CheckpointError(f"{path}: key {extra[0]!r} is not a parameter of this model ({len(extra)} unexpected)")
    return tensors


def _read_optimizer(path: Path, expected: dict[str, tuple[int, ...]]) -> dict[str, dict[str, Tensor]]:
    """AdamW's state by parameter name: every parameter it names has a step, exp_avg and exp_avg_sq
    of the parameter's shape."""
    state: dict[str, dict[str, Tensor]] = {}
    for key, value in _open_tensors(path).items():
        name, _, field = key.partition("::")
        if name not in expected:
            raise CheckpointError(f"{path}: key {key!r} names no parameter of this model")
        if field not in ADAMW_STATE:
            raise CheckpointError(f"{path}: key {key!r}: {field!r} is not AdamW state ({', '.join(ADAMW_STATE)})")
        if field.startswith("exp_avg") and tuple(value.shape) != expected[name]:
            raise CheckpointError(f"{path}: key {key!r} has shape {tuple(value.shape)}, the model needs {expected[name]}")
        state.setdefault(name, {})[field] = value
    incomplete = next((name for name, fields in state.items() if len(fields) < len(ADAMW_STATE)), None)
    if incomplete is not None:
        missing = sorted(set(ADAMW_STATE) - set(state[incomplete]))
        raise CheckpointError(f"{path}: key {incomplete + '::' + missing[0]!r} is missing")
    return state


def _check_groups(path: Path, groups: list[Any], optimizer: torch.optim.Optimizer, model: nn.Module) -> None:
    """trainer.json's optimizer groups name the parameters of this optimizer's groups, in order."""
    names = {id(p): name for name, p in model.named_parameters()}
    wanted = [[names[id(p)] for p in group["params"]] for group in optimizer.param_groups]
    got = [group.get("params") if isinstance(group, dict) else None for group in groups]
    if got != wanted:
        raise CheckpointError(f"{path}: key 'optimizer_groups' does not name this model's {len(wanted)} parameter "
                              f"groups ({sum(map(len, wanted))} parameters) as this optimizer holds them")
