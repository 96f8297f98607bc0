"""The `weights=` choice of anatomy.load: the format each of a model's matrices is kept in.

"auto" keeps a GGUF file's blocks where a format holds them exactly (other block types as f16) and
an HF file's dtype; "f32", "f16", "bf16" convert every matrix; "int8" and "int4" quantize (blocks
already exact in them are kept). The table: docs/inference.md, "Weights that stay small".

The matrices are the weights of every nn.Linear, the token embedding and a mixture's stacked experts
(one format per expert); norms, biases and position tables stay dense. A matrix whose format would
be a dense tensor of the model's own dtype stays a plain nn.Linear / nn.Embedding / parameter.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from anatomy import dtypes
from anatomy.layers.moe import MoE
from anatomy.weights.formats import FloatWeight, Int4Weight, Int8GroupWeight, Int8Weight, WeightFormat
from anatomy.weights.int6 import Int6Weight
from anatomy.weights.modules import CompactEmbedding, CompactExperts, CompactLinear, StackedFormats

Compact = WeightFormat | StackedFormats  # a matrix's format, or a mixture's experts' formats

CHOICES = ("auto", *dtypes.FLOATS, "int8", "int4")


def parse_weights(value: object, *, option: str = "weights") -> str:
    """The canonical name of a weights choice ("auto", a dtype name or a torch dtype); InputError
    otherwise, naming `option` (an API argument or a CLI option)."""
    if value == "auto":
        return "auto"
    return dtypes.parse(value, option=option, choices=CHOICES[1:]).name


def matrices(model: nn.Module) -> dict[str, nn.Module]:
    """{parameter name: module} of the matrices a weights choice applies to: every nn.Linear's weight
    and the token embedding (a tied head's weight is the embedding's, named once)."""
    token_table = model.token_embedding
    out = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) or module is token_table:
            if not (isinstance(module, nn.Linear) and getattr(model.config, "tie_embeddings", False)
                    and module.weight is token_table.weight):
                out[f"{name}.weight"] = module
    return out


def expert_matrices(model: nn.Module) -> list[str]:
    """The names of the mixtures' stacked expert matrices (`...ffn.gate_up` [E, 2F, D], `...ffn.down`)."""
    return [f"{name}.{which}" for name, module in model.named_modules() if isinstance(module, MoE)
            for which in ("gate_up", "down")]


def compact_formats(model: nn.Module, choice: str, *, dtype: torch.dtype,
                    lossless: Callable[[str], Compact | None],
                    dense: Callable[[str], Tensor]) -> dict[str, Compact]:
    """{matrix name: format} of the model's matrices under `choice` (a mixture's experts: their
    StackedFormats); a matrix left out stays a dense tensor of `dtype`. `lossless(name)` is the
    checkpoint's own exact format of a matrix (GGUF blocks; the experts' StackedFormats) or None;
    `dense(name)` its float values (called only when a matrix is converted)."""
    out: dict[str, Compact] = {}
    for name in matrices(model):
        exact = lossless(name) if choice not in dtypes.FLOATS else None
        fmt = _choose(choice, name=name, table_or_head=_is_table_or_head(name, model), dtype=dtype, lossless=exact,
                      dense=lambda: dense(name))
        if fmt is not None:
            out[name] = fmt
    for name in expert_matrices(model):
        exact = lossless(name) if choice not in dtypes.FLOATS else None
        stacked = _choose_experts(choice, name=name, model=model, dtype=dtype, lossless=exact, dense=lambda: dense(name))
        if stacked is not None:
            out[name] = stacked
    return out


def _choose_experts(choice: str, *, name: str, model: nn.Module, dtype: torch.dtype, lossless: StackedFormats | None,
                    dense: Callable[[], Tensor]) -> StackedFormats | None:
    """Each expert's format as _choose gives a matrix's; None (the stacked tensor stays dense) when
    every expert would be a dense tensor of `dtype`."""
    E = model.get_parameter(name).shape[0]
    values: list[Tensor] = []

    def expert(e: int) -> Tensor:
        if not values:
            values.append(dense())
        return values[0][e]

    fmts = [_choose(choice, name=f"{name}.{e}", table_or_head=False, dtype=dtype,
                    lossless=lossless.formats[e] if lossless is not None else None, dense=lambda e=e: expert(e))
            for e in range(E)]
    if all(fmt is None for fmt in fmts):
        return None
    fmts = [fmt if fmt is not None else FloatWeight.from_float(expert(e), dtype=dtype, label=f"{name}.{e}")
            for e, fmt in enumerate(fmts)]
    return StackedFormats(fmts, label=name)


def _choose(choice: str, *, name: str, table_or_head: bool, dtype: torch.dtype,
            lossless: WeightFormat | None, dense: Callable[[], Tensor]) -> WeightFormat | None:
    if choice == "auto":
        if lossless is not None:
            return None if _is_dense(lossless, dtype) else lossless
        return None if dtype == torch.float16 else FloatWeight.from_float(dense(), dtype=torch.float16, label=name)
    if choice in dtypes.FLOATS:
        target = dtypes.torch_dtype(choice)
        return None if target == dtype else FloatWeight.from_float(dense(), dtype=target, label=name)
    if choice == "int8" or table_or_head:
        kept = isinstance(lossless, (Int8GroupWeight, Int8Weight, Int6Weight))  # exact, at most 8 bits a weight
        return lossless if kept else Int8Weight.from_float(dense(), label=name)
    return lossless if isinstance(lossless, Int4Weight) else Int4Weight.from_float(dense(), label=name)


def install(model: nn.Module, formats: dict[str, Compact], *, dtype: torch.dtype) -> nn.Module:
    """Replace the modules of the matrices in `formats` ({parameter name: format}) by compact ones
    holding them (a mixture's stacked experts by a CompactExperts); a tied head shares its embedding's
    format. Returns the model."""
    holders = _holders(model)
    for name, fmt in formats.items():
        if isinstance(fmt, StackedFormats):
            owner, _, attr = name.rpartition(".")
            moe = model.get_submodule(owner)
            delattr(moe, attr)
            setattr(moe, attr, CompactExperts(fmt))
            continue
        module = model.get_submodule(name.removesuffix(".weight"))
        compact = CompactEmbedding(fmt, dtype=dtype) if isinstance(module, nn.Embedding) else CompactLinear(fmt, module.bias)
        for parent, key in holders.get(id(module), ()):
            parent._modules[key] = compact
    _tie_heads(model)
    return model


def _holders(model: nn.Module) -> dict[int, list[tuple[nn.Module, str]]]:
    """{id(module): every (parent, key) that holds it} (an encoder-decoder's token table is held by the
    model and by both stacks' embeddings), gathered in one walk rather than one per replaced module."""
    out: dict[int, list[tuple[nn.Module, str]]] = {}
    for parent in model.modules():
        for key, child in parent._modules.items():
            if child is not None:
                out.setdefault(id(child), []).append((parent, key))
    return out


def _tie_heads(model: nn.Module) -> None:
    """A tied LM head (or MLM decoder) over a compact token table computes with the same format."""
    table = model.token_embedding
    if not (isinstance(table, CompactEmbedding) and getattr(model.config, "tie_embeddings", False)):
        return
    for head in ("lm_head", "decoder"):
        module = getattr(model, head, None)
        if isinstance(module, nn.Linear):
            setattr(model, head, CompactLinear(table.compact, module.bias))


def _is_dense(fmt: WeightFormat, dtype: torch.dtype) -> bool:
    return isinstance(fmt, FloatWeight) and fmt.weight.dtype == dtype


def _is_table_or_head(name: str, model: nn.Module) -> bool:
    path = name.removesuffix(".weight")
    return model.get_submodule(path) is model.token_embedding or path in ("lm_head", "decoder")
