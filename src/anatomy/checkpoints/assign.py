"""Put named tensors into a model built on the meta device, checking names and shapes first.

Every loader (HF safetensors, GGUF, training checkpoints) ends here: it maps file names to the
model's parameter names, then calls assign_tensors. Nothing is copied: the model's parameters
become the given tensors (mmapped or freshly dequantized).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from anatomy.errors import CheckpointError
from anatomy.weights.choice import install
from anatomy.weights.formats import WeightFormat
from anatomy.weights.modules import compact_modules, dense_name, inside_compact


def expected_shapes(model: nn.Module) -> dict[str, torch.Size]:
    """The model's own parameter and persistent-buffer names and shapes (tied weights once), a
    compact weight under the dense name and shape it stands for (`lm_head.weight` [V, D])."""
    aliases = tied_aliases(model)
    compact = compact_modules(model)
    shapes = {name: t.shape for name, t in model.state_dict(keep_vars=True).items()
              if name not in aliases and not inside_compact(name, compact)}
    seen: set[int] = set()
    for name, module in compact.items():
        if id(module.compact) not in seen:
            seen.add(id(module.compact))
            shapes[dense_name(name, module)] = torch.Size(module.compact.shape)
    return shapes


def assign_tensors(model: nn.Module, tensors: dict[str, Tensor], *, source: str | Path,
                   dtype: torch.dtype | None = None, compact: dict[str, WeightFormat] | None = None) -> nn.Module:
    """Assign `tensors` (model names) to `model`, and install the weights of `compact` ({name:
    WeightFormat}) in compact modules; raise CheckpointError listing what is missing, unexpected,
    or of the wrong shape. Tied weights are given once, under the name that owns them."""
    compact = compact or {}
    expected = expected_shapes(model)
    given = {**{k: v.shape for k, v in tensors.items()}, **{k: torch.Size(f.shape) for k, f in compact.items()}}
    missing = sorted(set(expected) - set(given))
    unexpected = sorted(set(given) - set(expected)) + sorted(set(tensors) & set(compact))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing tensors {missing}")
        if unexpected:
            parts.append(f"unexpected tensors {unexpected}")
        raise CheckpointError(f"{source}: {'; '.join(parts)}")
    for name, shape in given.items():
        if shape != expected[name]:
            raise CheckpointError(
                f"{source}: tensor {name!r} has shape {list(shape)}, the model expects {list(expected[name])}")
    if dtype is not None:
        tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()}
    model.load_state_dict(tensors, strict=False, assign=True)
    _retie(model)
    if compact:
        install(model, compact, dtype=dtype or _activation_dtype(model))
    _materialize_buffers(model)
    return model.eval()


def _activation_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of the model's dense float tensors (its norms, say): what its activations are."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point() and not p.is_meta), torch.float32)


def tied_aliases(model: nn.Module) -> dict[str, str]:
    """{alias: owner} for every parameter registered under a second name (a tied LM head): the
    owner is the name it appears under first, the one checkpoints store."""
    first: dict[int, str] = {}
    aliases = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            aliases[name] = first[id(p)]
        else:
            first[id(p)] = name
    return aliases


def _retie(model: nn.Module) -> None:
    """load_state_dict(assign=True) replaces parameters, which breaks weight tying: tie again."""
    config = getattr(model, "config", None)
    if config is None or not config.tie_embeddings:
        return
    for head in ("lm_head", "decoder"):
        module = getattr(model, head, None)
        if isinstance(module, nn.Linear):
            module.weight = model.token_embedding.weight


def _materialize_buffers(model: nn.Module) -> None:
    """Non-persistent buffers (RoPE frequencies, sinusoid tables, ALiBi slopes) are computed, not
    loaded: a model built on the meta device gets them computed now, on the CPU."""
    for module in model.modules():
        if hasattr(module, "init_buffers"):
            module.init_buffers()
