"""Building what a run trains, and the checks that must pass before its first step: the model
(a preset, a config file, or a checkpoint to fine-tune), the vocabulary and context fit, and
whether a micro-batch fits in memory."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from anatomy import heap
from anatomy.analysis.memory import training_activations, training_state
from anatomy.checkpoints.hf_config import config_from_hf
from anatomy.config import ModelConfig
from anatomy.errors import ConfigError, InputError
from anatomy.lora import LoraConfig, apply_lora
from anatomy.models import build_model
from anatomy.presets import PRESETS, get_preset
from anatomy.text_file import read_text
from anatomy.text.tokenizer import Tokenizer
from anatomy.training.loop import compute_dtype

GiB = 1 << 30


def model_for_training(spec: str, *, overrides: dict[str, Any], tok: Tokenizer, seq_len: int
                       ) -> tuple[ModelConfig, nn.Module]:
    """A fresh model from a preset or config file (vocab, special ids and context set from the
    tokenizer and --seq-len unless overridden), or a loaded checkpoint to fine-tune."""
    from anatomy.checkpoints.source import find_model

    source = find_model(spec)
    if source.kind in ("preset", "config"):  # a config.json trains from scratch even with weights beside it
        config = _fresh_config(spec, source.path, overrides=overrides, tok=tok, seq_len=seq_len)
        return config, build_model(config, head="mlm")
    if overrides:
        raise InputError(f"--model {spec}: a checkpoint keeps its architecture; "
                         f"drop {', '.join('--' + k.replace('_', '-') for k in overrides)}")
    return _loaded(spec)


def model_for_lora(spec: str, lora: LoraConfig, *, weights: str = "f32") -> tuple[ModelConfig, nn.Module]:
    """A checkpoint to fine-tune with LoRA: its weights loaded and frozen, in f32 or (QLoRA) in a
    compact format ("int4", "int8": anatomy.load's weights=), fresh LoRA pairs (B = 0) on the
    targets, the adapter naming the checkpoint as its base model."""
    from anatomy.checkpoints.source import find_model

    source = find_model(spec)
    if source.kind in ("preset", "config"):
        raise InputError(f"--lora trains an adapter over a checkpoint's frozen weights; --model {spec} is a "
                         f"{source.kind} without weights")
    config, model = _loaded(spec, weights=weights)
    base = source.installed or str(Path(source.path).resolve())
    return config, apply_lora(model, replace(lora, base_model=base))


def _fresh_config(spec: str, path: Path | None, *, overrides: dict[str, Any], tok: Tokenizer, seq_len: int
                  ) -> ModelConfig:
    """A preset's or config file's (or config directory's) fields, with the tokenizer's vocabulary and
    special ids and --seq-len as the context unless overridden."""
    if path is not None and path.is_dir():
        path = path / "config.json"
    base = dict(PRESETS[spec]) if path is None else _config_file(path).to_dict()
    defaults = {"vocab_size": tok.vocab_size, "max_seq_len": seq_len, "pad_token_id": tok.pad_id,
                "bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id}
    if base.get("architecture") == "encoder-decoder":
        defaults["decoder_start_token_id"] = tok.bos_id
    values = {**defaults, **overrides}
    return get_preset(spec, **values) if path is None else ModelConfig.from_dict({**base, **values})


def _config_file(path: Path) -> ModelConfig:
    try:
        values = json.loads(read_text(path, label="--model"))
    except json.JSONDecodeError as exc:
        raise InputError(f"--model {path}: not readable JSON ({exc})") from None
    if not isinstance(values, dict):
        raise InputError(f"--model {path}: expected a JSON object")
    return ModelConfig.from_dict(values) if "d_model" in values else config_from_hf(values)


def _loaded(spec: str, *, weights: str = "f32") -> tuple[ModelConfig, nn.Module]:
    """A checkpoint to fine-tune, every matrix dequantized to f32: training updates dense weights (a
    GGUF file's quantized blocks, which anatomy.load keeps by default, have none to update); a
    frozen base (QLoRA) may keep compact ones."""
    from anatomy.checkpoints.loader import load

    model = load(spec, weights=weights, dtype="f32")
    return model.config, model


def check_fit(config: ModelConfig, tok: Tokenizer, *, seq_len: int) -> None:
    if tok.vocab_size > config.vocab_size:
        raise ConfigError(f"the tokenizer {tok.source!r} has {tok.vocab_size} tokens, more than the model's "
                          f"vocab_size={config.vocab_size}: token ids past the embedding table cannot be trained")
    if seq_len > config.max_seq_len and config.position in ("learned", "sinusoidal"):
        raise ConfigError(f"--seq-len {seq_len} is past the model's max_seq_len={config.max_seq_len} "
                          f"(position={config.position!r} has a table of max_seq_len entries)")


def check_batch(batch_size: int, *, world: int, accum: int) -> None:
    if batch_size <= 0 or accum <= 0:
        raise InputError(f"--batch-size {batch_size} and --accum {accum} must be positive")
    if batch_size % (world * accum):
        raise InputError(f"--batch-size {batch_size} is not divisible by world size {world} x --accum {accum}: "
                         "every rank and micro-step needs the same number of rows")


def estimated_bytes(model: nn.Module, config: ModelConfig, *, rows: int, seq_len: int, world: int, sharded: bool,
                    device: torch.device, activation_checkpointing: bool) -> tuple[float, float]:
    """(activations of one micro-batch, weights + gradients + AdamW state) in bytes, as
    analysis.memory measures and counts them for this run: activations in the compute dtype (f32
    on the CPU, bf16 under autocast on a GPU), every block's or only the checkpointed ones';
    the state of f32 parameters (autocast leaves them f32), sharded over the ranks by FSDP; a frozen
    parameter (LoRA's base) only its weights."""
    activations = training_activations(config, batch=rows, seq=seq_len, dtype=compute_dtype(device),
                                       backend="sdpa", head="mlm")
    trained = training_state(sum(p.numel() for p in model.parameters() if p.requires_grad), dtype="f32").total
    frozen = sum(p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad)  # LoRA's base
    state = trained + frozen
    saved = activations.checkpointed if activation_checkpointing else activations.total
    return float(saved), state / (world if sharded else 1)


def available_bytes(device: torch.device, *, local_ranks: int) -> float:
    if device.type == "cuda":
        return float(torch.cuda.mem_get_info(device)[0])
    free = heap.available()
    return free / local_ranks if free is not None else float("inf")


def check_memory(activations: float, state: float, available: float, *, rows: int, accum: int) -> None:
    """A micro-batch that cannot fit fails now, with the accumulation that would make it fit."""
    if activations + state <= available:
        return
    fits = next((k for k in range(2, rows + 1) if rows % k == 0 and activations / k + state <= available), None)
    hint = (f"use --accum {accum * fits} ({rows // fits} rows per micro-step)" if fits
            else "use a smaller --seq-len or model (even one row per micro-step does not fit)")
    raise InputError(f"a micro-batch of {rows} rows needs about {activations / GiB:.1f} GiB of activations plus "
                     f"{state / GiB:.1f} GiB of weights, gradients and AdamW state; {available / GiB:.1f} GiB is "
                     f"available: {hint}")
