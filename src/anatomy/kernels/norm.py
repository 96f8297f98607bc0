"""The engine view's RMSNorm: one native operator (kernels/native/norm.cpp) instead of torch's.

    swap_norms(view)     every RMSNorm of the engine's view (not Gemma's unit-offset form) becomes a
                         NativeRMSNorm over the same weight, when the native library is loaded

The arithmetic is the model's (float32 sums and scale, the output in the input's dtype); only the
dispatch is cheaper: a decode step runs two norms a block on one row each, where torch's rms_norm
costs many times this operator (figures: docs/inference.md, "The measured kernel plan").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from anatomy.kernels import native
from anatomy.layers.norm import RMSNorm

DTYPES = (torch.float32, torch.bfloat16)  # what the operator takes; others go to torch's


class NativeRMSNorm(nn.Module):
    def __init__(self, norm: RMSNorm) -> None:
        super().__init__()
        self.weight, self.eps = norm.weight, norm.eps

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype not in DTYPES or x.device.type != "cpu":
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        return torch.ops.anatomy.rms_norm(x, self.weight, self.eps)


def swap_norms(view: nn.Module) -> int:
    """Swap the view's RMSNorm modules for NativeRMSNorm (none without the library); how many."""
    if not native.loaded():
        return 0
    names = [name for name, m in view.named_modules() if isinstance(m, RMSNorm) and not m.unit_offset]
    for name in names:
        view.set_submodule(name, NativeRMSNorm(view.get_submodule(name)))
    return len(names)
