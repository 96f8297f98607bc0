"""The four architectures, built from one config and one set of parts."""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from anatomy.config import ModelConfig
from anatomy.dtypes import torch_dtype
from anatomy.errors import InputError
from anatomy.layers.attention import check_backend
from anatomy.models.classifier import SequenceClassifier
from anatomy.models.decoder import DecoderLM
from anatomy.models.encoder import Encoder, MaskedLM
from anatomy.models.init import init_weights
from anatomy.models.seq2seq import EncoderDecoder
from anatomy.models.stack import Stack

HEADS = ("auto", "base", "mlm")


def build_model(config: ModelConfig, *, head: str = "auto", device: str | torch.device | None = None,
                dtype: torch.dtype | str | None = None, init: bool = True, attention: str = "sdpa") -> nn.Module:
    """The model class the config's architecture calls for; `head="mlm"` gives an encoder its MLM head.

    `dtype` is "f32", "f16", "bf16" or a torch dtype (None: torch's default, f32).
    `attention` is the attention backend: "sdpa" (fused kernels) or "eager" (scores as a tensor).
    On the meta device nothing is allocated or initialised: building any preset is instant.
    """
    if not isinstance(config, ModelConfig):
        raise InputError(f"build_model takes a ModelConfig (anatomy.get_preset(name) gives one), "
                         f"got {type(config).__name__}: {config!r:.80}")
    if head not in HEADS:
        raise InputError(f"head={head!r} is not one of {', '.join(map(repr, HEADS))}")
    check_backend(attention)
    dtype = torch_dtype(dtype) if dtype is not None else None
    device = _device(device) if device is not None else None
    meta = device is not None and device.type == "meta"
    with torch.device(device) if device is not None else contextlib.nullcontext(), \
            _SkipInitOnMeta() if meta else contextlib.nullcontext():
        model = _model_class(config, head)(config, backend=attention)
    if device is not None and not meta:
        model = model.to(device)  # computed buffers (RoPE, sinusoids) are made on the CPU
    if dtype is not None:
        model = model.to(dtype)
    if init and not meta:
        init_weights(model, config)
    return model


def _device(device: str | torch.device) -> torch.device:
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InputError(f"device={device!r} is not a torch device ({exc})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"device={str(device)!r}: this torch has no CUDA device (torch.cuda.is_available() is False)")
    return device


def set_activation_checkpointing(model: nn.Module, enabled: bool = True) -> None:
    """Recompute each block's activations in the backward pass instead of storing them (every Stack
    of the model; parameter names and results unchanged)."""
    for module in model.modules():
        if isinstance(module, Stack):
            module.activation_checkpointing = enabled


class _SkipInitOnMeta(TorchFunctionMode):
    """The layers' constructors initialise their weights (nn.init); on the meta device there are no
    values to fill, and torch's meta kernels for the random fills import torch._dynamo on first use
    (seconds, once per process). Skip those calls while building. A mode is local to this thread,
    unlike a patch of nn.init."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        target = args[0] if args else kwargs.get("tensor")
        if getattr(func, "__module__", None) == "torch.nn.init" and isinstance(target, torch.Tensor) and target.is_meta:
            return target
        return func(*args, **kwargs)


def _model_class(config: ModelConfig, head: str) -> type[nn.Module]:
    if config.is_decoder:
        return DecoderLM
    if config.is_seq2seq:
        return EncoderDecoder
    if head == "mlm":
        return MaskedLM
    return SequenceClassifier if config.n_labels and head == "auto" else Encoder


__all__ = ["build_model", "set_activation_checkpointing", "DecoderLM", "Encoder", "MaskedLM", "SequenceClassifier",
           "EncoderDecoder", "Stack", "init_weights"]
