"""The shape trace: every op of one block (and the embedding and head ends), recorded by running
the real model on the meta device (docs/anatomy.md, "Shape trace").

The model is built with one block per stack; a `TorchFunctionMode` sees each torch call the modules
make with its real arguments, and forward hooks say which module is running. Meta tensors carry
shapes but no data, so any preset runs in milliseconds; attention runs with the eager backend so
the score matrix appears as the op it is. Each row has the op's shapes, its FLOPs (FlopCounterMode)
and the bytes it moves: inputs read plus output written, zero for views.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from anatomy.config import ModelConfig

_SKIPPED_MODULES = re.compile(r"(^|\.)position_rules(\.|$)")  # a stack's position machinery: index setup, not the model


@dataclass(frozen=True)
class TraceRow:
    phase: str
    module: str
    op: str
    inputs: list[list[int]]
    output: list[int]
    flops: int
    bytes: int
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def trace(config: ModelConfig, *, phase: str, batch: int, seq: int, context: int, dtype: str = "f32",
          head: str = "auto", attention: str = "eager", layer: int | None = None) -> list[TraceRow]:
    """The rows of one prefill ([B, S]) or decode step ([B, 1] against T = context positions).
    An encoder-only model has no decode step: its decode trace is empty. `attention` "sdpa" records
    the fused kernel as the one op it is (what the engine runs; `anatomy profile` matches it);
    `layer` picks the block shown (default: the first mixture layer, else the first windowed one)."""
    from anatomy.models import build_model

    if phase == "decode" and config.is_encoder:
        return []
    # one block per stack: the trace shows one (of a stack with mixture-of-experts layers, a mixture
    # layer; of one with sliding windows, a windowed layer), the others are the same module again
    shown = _shown_layer(config) if layer is None else layer
    config = config.with_layers([shown]).replace(n_decoder_layers=min(config.n_decoder_layers, 1))
    model = build_model(config, device="meta", dtype=dtype, head=head, attention=attention).to("meta").eval()
    run = _prefill(model, config, batch, seq) if phase == "prefill" else _decode(model, config, batch, seq, context)
    recorder = _Recorder(phase, model, config)
    with recorder:
        run()
    return recorder.rows


def _shown_layer(config: ModelConfig) -> int:
    """The block the trace shows: the first mixture layer, else the first windowed one, else 0."""
    layers = range(config.n_layers)
    moe = [i for i in layers if config.layer_is_moe(i)]
    windowed = [i for i in layers if config.layer_window(i)]
    return (moe or windowed or [0])[0]


def _prefill(model: nn.Module, config: ModelConfig, batch: int, seq: int):
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")  # [B, S]
    if config.is_encoder:
        return lambda: model(ids)
    if config.is_seq2seq:
        return lambda: model(ids, ids)
    cache = _cache(config, batch, seq, model)
    pos = torch.arange(seq, device="meta")
    return lambda: model(ids, cache=cache, input_pos=pos, last_only=True)


def _decode(model: nn.Module, config: ModelConfig, batch: int, seq: int, context: int):
    ids = torch.zeros(batch, 1, dtype=torch.long, device="meta")  # [B, 1]
    cache = _cache(config, batch, context, model)
    pos = torch.tensor([context - 1], device="meta")
    if config.is_seq2seq:
        memory_kv = model.memory_kv(torch.zeros(batch, seq, config.d_model, device="meta",
                                                dtype=next(model.parameters()).dtype))
        return lambda: model.decode(ids, memory_kv=memory_kv, cache=cache, input_pos=pos, last_only=True)
    return lambda: model(ids, cache=cache, input_pos=pos, last_only=True)


def _cache(config: ModelConfig, batch: int, max_len: int, model: nn.Module):
    from anatomy.inference.engine.kv_cache import KVCache

    return KVCache(config, batch=batch, max_len=max_len, dtype=next(model.parameters()).dtype, device="meta")


class _Recorder(TorchFunctionMode):
    """Records torch calls made while a kept module (embedding, block 0, norms, heads) runs."""

    def __init__(self, phase: str, model: nn.Module, config: ModelConfig) -> None:
        super().__init__()
        self.phase, self.config, self.rows, self.stack = phase, config, [], [""]
        self.matmuls: dict[str, int] = {}  # per attention module: odd calls are q k^T, even ones weights @ v
        for name, module in model.named_modules():
            if name:
                module.register_forward_pre_hook(lambda *_, name=name: self.stack.append(name))
                module.register_forward_hook(lambda *_: self.stack.pop() and None)  # None: keep the output

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        module = self.stack[-1]
        if _SKIPPED_MODULES.search(module) or getattr(func, "__name__", "") == "__get__":
            return func(*args, **kwargs)
        counter = FlopCounterMode(display=False)
        with counter:
            out = func(*args, **kwargs)
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, Tensor)]
        outputs = [t for t in tree_leaves(out) if isinstance(t, Tensor)]
        name = getattr(func, "__name__", str(func))
        if outputs and self._keep(name, module, inputs, outputs):
            self.rows.append(self._row(name, module, inputs, outputs, counter.get_total_flops()))
        return out

    @staticmethod
    def _keep(name: str, module: str, inputs: list[Tensor], outputs: list[Tensor]) -> bool:
        if not _in_place(name) and any(o is i for o in outputs for i in inputs):
            return False  # a no-op (e.g. .to() of a tensor already in that dtype)
        if module:
            return True
        return any(t.is_floating_point() for t in inputs)  # the model's own top level: skip index setup

    def _row(self, name: str, module: str, inputs: list[Tensor], outputs: list[Tensor], flops: int) -> TraceRow:
        moved = _bytes_moved(name, inputs, outputs)
        note = f"{len(outputs)} outputs: " + ", ".join(str(list(o.shape)) for o in outputs) if len(outputs) > 1 else ""
        if not note and name in ("matmul", "__matmul__") and module.endswith("attn"):
            self.matmuls[module] = self.matmuls.get(module, 0) + 1
            note = _attention_note(self.matmuls[module] % 2 == 1, outputs[0], self.config)
        return TraceRow(self.phase, module or "(model)", name, [list(t.shape) for t in inputs],
                        list(outputs[0].shape), flops, moved, note)


def _in_place(name: str) -> bool:
    return name.endswith("_") and not name.startswith("__")


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def _bytes_moved(name: str, inputs: list[Tensor], outputs: list[Tensor]) -> int:
    """Inputs read + outputs written; 0 for a view; a lookup reads only the rows it returns."""
    if _in_place(name):  # the other inputs are written into the first
        return 2 * sum(_nbytes(t) for t in inputs[1:] if t.is_floating_point())
    storages = {t.untyped_storage()._cdata for t in inputs}
    if all(o.untyped_storage()._cdata in storages for o in outputs):
        return 0  # a view of an input: no data moves
    indices = [t for t in inputs if not t.is_floating_point()]
    if name in ("embedding", "__getitem__") and indices:  # a lookup: ids read, rows read, output written
        return sum(_nbytes(t) for t in indices) + 2 * _nbytes(outputs[0])
    unique = {id(t): t for t in inputs}
    return sum(_nbytes(t) for t in unique.values()) + sum(_nbytes(o) for o in outputs)


def _attention_note(scores: bool, out: Tensor, config: ModelConfig) -> str:
    rep = config.n_heads // config.n_kv_heads
    what = "scores q k^T" if scores else "weights @ v"
    if rep == 1:
        return what
    B, _, rows, last = out.shape
    logical = [B, config.n_heads, rows // rep, last]
    return f"{what}; GQA: {rep} query heads per kv head folded into rows, logical {logical}"
