"""AdamW with weight decay only on matrices, a linear-warmup + cosine learning-rate schedule, and
gradient clipping.

Weight decay pulls weights towards zero; on biases and norm gains (1-D tensors) that only hurts, so
they go in a group with weight_decay=0 (as in GPT-2/nanoGPT). Embedding tables are matrices and
are decayed. The schedule is a pure function of the step: resuming needs no scheduler object.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """lr(step): linear from 0 to `lr` over `warmup` steps, then cosine down to `min_lr` at `steps`."""

    lr: float
    min_lr: float
    warmup: int
    steps: int

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        span = max(self.steps - self.warmup, 1)
        progress = min((step - self.warmup) / span, 1.0)
        return self.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (self.lr - self.min_lr)

    def to_dict(self) -> dict[str, float | int]:
        return {"lr": self.lr, "min_lr": self.min_lr, "warmup": self.warmup, "steps": self.steps}


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: >= 2-D weights decayed, everything else (biases, norm weights) not."""
    params = [p for p in model.parameters() if p.requires_grad]  # tied weights appear once
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(model: nn.Module, *, lr: float, weight_decay: float, betas: tuple[float, float] = (0.9, 0.95),
                   eps: float = 1e-8) -> torch.optim.AdamW:
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=betas, eps=eps)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def clip_gradients(model: nn.Module, max_norm: float) -> Tensor:
    """Scale the gradients so their global L2 norm is at most max_norm (0: no clipping); returns the
    norm before clipping (NaN/inf when a gradient is not finite). Works on sharded (DTensor) grads."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm
