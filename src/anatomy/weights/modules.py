"""Modules that hold a weight in a compact format (formats.WeightFormat) where a model has an
nn.Linear or a token nn.Embedding.

    CompactLinear(fmt, bias)   y = x @ W^T + b, W = fmt.dequantize(x.dtype)         (the reference product)
    CompactEmbedding(fmt)      rows of W for the ids, dequantized (only the rows read)
    CompactExperts(stacked)    a mixture's stacked gate_up / down [E, N, K]: experts[e] a CompactLinear
                               (so the kernel plan runs each expert as any compact linear layer)
    SplitLinear(layers)        the layers' outputs side by side: an engine's own form of a CompactLinear
                               over a SplitRowsWeight (split_linears), each part a layer of its own

A tied model's LM head and token table hold the same format object, as nn.Linear and nn.Embedding
share one Parameter. Parameter names: a CompactLinear at `lm_head` stores `lm_head.compact.codes`,
`lm_head.compact.scale`, ...; `float_state_dict` gives the float `lm_head.weight` the file formats
and the name maps know (a CompactExperts at `...ffn.gate_up`: `...ffn.gate_up.experts.3.compact.codes`,
given back as the stacked `...ffn.gate_up`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from anatomy.weights.formats import WeightFormat
from anatomy.weights.split import SplitRowsWeight


class CompactLinear(nn.Module):
    """A linear layer whose weight [N, K] is a WeightFormat. forward is exact, not fast: it
    dequantizes the whole weight each call (generation goes through the engine's planned kernels)."""

    def __init__(self, fmt: WeightFormat, bias: Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = fmt.shape
        self.compact = fmt
        self.bias = nn.Parameter(bias.detach(), requires_grad=False) if bias is not None else None

    def forward(self, x: Tensor) -> Tensor:
        bias = self.bias.to(x.dtype) if self.bias is not None else None
        if torch.is_grad_enabled() and x.requires_grad:  # training through frozen compact weights (QLoRA)
            return _FrozenLinear.apply(x, self.compact, bias)
        return F.linear(x, self.compact.dequantize(x.dtype), bias)  # [..., K] -> [..., N]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class _FrozenLinear(torch.autograd.Function):
    """x @ W^T + b whose backward dequantizes W again rather than keeping the float W from the
    forward: the gradient of x alone (W is frozen), at the memory of the compact format (QLoRA)."""

    @staticmethod
    def forward(ctx, x: Tensor, fmt: WeightFormat, bias: Tensor | None) -> Tensor:
        ctx.fmt = fmt
        return F.linear(x, fmt.dequantize(x.dtype), bias)  # [..., K] -> [..., N]

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        return grad @ ctx.fmt.dequantize(grad.dtype), None, None  # [..., N] -> [..., K]


class SplitLinear(nn.Module):
    """y = [layers[0](x), layers[1](x), ...] along the last dim: a linear layer whose weight's row runs
    are layers of their own (an engine plans each as any linear layer)."""

    def __init__(self, layers: list[nn.Module], *, in_features: int) -> None:
        super().__init__()
        self.parts = nn.ModuleList(layers)
        self.in_features = in_features
        self.out_features = sum(layer.out_features for layer in layers)

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([layer(x) for layer in self.parts], dim=-1)  # [..., K] -> [..., N]


def split_linears(model: nn.Module) -> int:
    """Each CompactLinear of `model` over a SplitRowsWeight becomes a SplitLinear of one CompactLinear
    per part (its bias cut along), in place; how many."""
    found = [(name, m) for name, m in model.named_modules() if isinstance(m, CompactLinear)
             and isinstance(m.compact, SplitRowsWeight)]
    for name, m in found:
        layers = [CompactLinear(part, None if m.bias is None else m.bias[start:stop])
                  for part, (start, stop) in zip(m.compact.parts, m.compact.bounds)]
        model.set_submodule(name, SplitLinear(layers, in_features=m.in_features))
    return len(found)


class StackedFormats:
    """E formats of one shape [N, K] standing for a stacked tensor [E, N, K] (a mixture's experts)."""

    def __init__(self, formats: list[WeightFormat], *, label: str = "experts") -> None:
        if not formats or len({fmt.shape for fmt in formats}) != 1:
            raise ValueError(f"{label}: the experts' formats must be one or more of one shape")
        self.formats, self.label = list(formats), label
        self.shape = (len(formats), *formats[0].shape)

    @property
    def name(self) -> str:
        """The formats' name ("int4"), or their names joined ("int4+int8g") where experts differ."""
        return "+".join(sorted({fmt.name for fmt in self.formats}))

    @property
    def nbytes(self) -> int:
        return sum(fmt.nbytes for fmt in self.formats)

    def buffers(self) -> Iterator[Tensor]:
        for fmt in self.formats:
            yield from fmt.buffers()

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """The stacked tensor [E, N, K] the formats stand for."""
        return torch.stack([fmt.dequantize(dtype) for fmt in self.formats])


class CompactExperts(nn.Module):
    """A mixture's stacked matrix as one CompactLinear per expert: experts[e](x) = x @ W_e^T."""

    def __init__(self, stacked: StackedFormats) -> None:
        super().__init__()
        self.experts = nn.ModuleList(CompactLinear(fmt) for fmt in stacked.formats)
        self.compact = stacked  # a plain attribute: the formats are registered once, under `experts`
        self.shape = stacked.shape

    def __getitem__(self, e: int) -> nn.Module:
        return self.experts[e]

    def __len__(self) -> int:
        return len(self.experts)

    def extra_repr(self) -> str:
        return f"experts={self.shape[0]}, shape={list(self.shape[1:])}, format={self.compact.name}"


class CompactEmbedding(nn.Module):
    """A token table [V, D] kept as a WeightFormat: a lookup dequantizes the rows it reads, in `dtype`."""

    def __init__(self, fmt: WeightFormat, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = fmt.shape
        self.compact = fmt
        self.dtype = dtype

    def forward(self, ids: Tensor) -> Tensor:
        return self.compact.rows(ids).to(self.dtype)  # [B, S] -> [B, S, D]

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, dtype={self.dtype}"


def compact_modules(model: nn.Module) -> dict[str, CompactLinear | CompactEmbedding | CompactExperts]:
    """The model's compact modules by name (a CompactExperts once, not its experts' CompactLinears)."""
    out: dict[str, nn.Module] = {}
    for name, m in model.named_modules():
        if isinstance(m, (CompactLinear, CompactEmbedding, CompactExperts)) and not inside_compact(name + ".", out):
            out[name] = m
    return out


def dense_name(name: str, module: nn.Module) -> str:
    """The name a dense model gives the tensor compact module `name` holds: `lm_head.weight`, or a
    mixture's stacked `...ffn.gate_up`."""
    return name if isinstance(module, CompactExperts) else f"{name}.weight"


def weights_held(model: nn.Module) -> bool:
    """Do the model's compact formats still hold their tensors (no engine took them: take_weights)?"""
    return not any(isinstance(m, WeightFormat) and m.released for m in model.modules())


def float_state_dict(model: nn.Module, dtype: torch.dtype | None = None) -> dict[str, Tensor]:
    """The model's tensors by the names a dense model of the same config has: each compact weight
    dequantized under `<module>.weight` (in `dtype`, default float32), a tied one once, under its
    first name; every other tensor as it is."""
    compact = compact_modules(model)
    state = {k: v for k, v in model.state_dict().items() if not inside_compact(k, compact)}
    seen: set[int] = set()
    for name, module in compact.items():
        if id(module.compact) in seen:
            continue
        seen.add(id(module.compact))
        state[dense_name(name, module)] = module.compact.dequantize(dtype or torch.float32)
    return state


def inside_compact(key: str, modules: dict[str, nn.Module]) -> bool:
    """Is state-dict entry `key` a stored part of one of the compact `modules` ({name: module})?"""
    return any(key.startswith(f"{name}.experts." if isinstance(m, CompactExperts) else f"{name}.compact.")
               for name, m in modules.items())


def stored_bytes(model: nn.Module) -> int:
    """Bytes the model's saved tensors (parameters, persistent buffers) occupy, each storage counted
    once (a tied table and head, views); computed buffers such as RoPE's frequencies are not counted."""
    storages = {}
    for t in model.state_dict(keep_vars=True).values():
        if not t.is_meta:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


def stored_by_format(model: nn.Module) -> dict[str, int]:
    """Bytes of the model's saved tensors as held, by format: compact weights by their format's name
    ("int4", "int8g", ...), every other tensor by its dtype ("f32", ...); shared storage once."""
    fmts = {id(m.compact): m.compact for m in compact_modules(model).values()}
    out: Counter[str] = Counter()
    for fmt in fmts.values():
        for part in fmt.parts if isinstance(fmt, SplitRowsWeight) else (fmt,):
            out[part.name] += part.nbytes
    held = {id(b) for fmt in fmts.values() for b in fmt.buffers()}
    seen: set[int] = set()
    for t in model.state_dict(keep_vars=True).values():
        ptr = t.untyped_storage().data_ptr()
        if id(t) not in held and not t.is_meta and ptr not in seen:
            seen.add(ptr)
            out[tensor_kind(t)] += t.nbytes
    return dict(out)


def tensor_kind(t: Tensor) -> str:
    """A tensor's dtype by anatomy's name ("f32", "f16", "bf16"), other dtypes by torch's ("int64")."""
    return {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}.get(t.dtype, str(t.dtype)[6:])
