"""The four architectures, built from one config and one set of parts."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from anatomy.config import ModelConfig
from anatomy.models.decoder import DecoderLM
from anatomy.models.encoder import Encoder, MaskedLM
from anatomy.models.init import init_weights
from anatomy.models.seq2seq import EncoderDecoder

HEADS = ("auto", "base", "mlm")


def build_model(config: ModelConfig, *, head: str = "auto", device: str | torch.device | None = None,
                dtype: torch.dtype | None = None, init: bool = True) -> nn.Module:
    """The model class the config's architecture calls for; `head="mlm"` gives an encoder its MLM head.

    On the meta device nothing is allocated or initialised: building any preset is instant.
    """
    if head not in HEADS:
        raise ValueError(f"head={head!r} is not one of {HEADS}")
    device = torch.device(device) if device is not None else None
    meta = device is not None and device.type == "meta"
    with torch.device(device) if device is not None else contextlib.nullcontext(), _meta_normal_skipped(meta):
        model = _model_class(config, head)(config)
    if device is not None and device.type != "meta":
        model = model.to(device)  # computed buffers (RoPE, sinusoids) are made on the CPU
    if dtype is not None:
        model = model.to(dtype)
    if init and (device is None or device.type != "meta"):
        init_weights(model, config)
    return model


@contextlib.contextmanager
def _meta_normal_skipped(active: bool):
    """On the meta device there are no values to initialise, but torch's meta `normal_` imports
    torch._dynamo on first use (~2.5 s): make `nn.init.normal_` a no-op on meta tensors meanwhile."""
    if not active:
        yield
        return
    original = nn.init.normal_

    def normal_(tensor: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return tensor if tensor.is_meta else original(tensor, *args, **kwargs)

    nn.init.normal_ = normal_
    try:
        yield
    finally:
        nn.init.normal_ = original


def _model_class(config: ModelConfig, head: str) -> type[nn.Module]:
    if config.is_decoder:
        return DecoderLM
    if config.is_seq2seq:
        return EncoderDecoder
    return MaskedLM if head == "mlm" else Encoder


__all__ = ["build_model", "DecoderLM", "Encoder", "MaskedLM", "EncoderDecoder", "init_weights"]
