"""The engine's device seam: which operators a step runs, chosen once per engine.

    backend = backend_for(device, name)     name None: "cpu" on a CPU, "torch" on any other device

cpu    the measured kernel plan (anatomy's native products where they measure faster), the native
       RMSNorm, cache readers and greedy argmax, and decode steps replayed from captured graphs.
torch  torch's operators only: each linear layer a dense product in the model's dtype, torch's
       RMSNorm, SDPA over the cache (an int8/fp8 cache decoded by torch), torch.compile when asked
       (CUDA graphs on a GPU, gpt-fast's mode="reduce-overhead"). It is what a GPU runs, and it runs
       on a CPU too, where the tests hold it to the cpu backend's answers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from anatomy.errors import InputError
from anatomy.inference.sampling import greedy
from anatomy.kernels import native

NAMES = ("cpu", "torch")


@dataclass(frozen=True)
class Backend:
    """What an engine's step may run. `native`: anatomy's native operators (CPU tensors only) and the
    measured kernel plan; without it every product, norm and attention is torch's own."""

    name: str
    native: bool

    def captures(self, requested: bool, compile: bool) -> bool:
        """Whether decode steps are replayed from captured graphs (the cpu backend's, when not compiled)."""
        return requested and self.native and not compile

    def greedy_choice(self) -> Callable[[Tensor], Tensor]:
        """Greedy decoding's choice for float32 logits [B, V] (each row's largest logit's index, the first
        of equal ones): anatomy::argmax where native operators run (one vector pass for the maximum and
        one for its index; torch's max compares one logit at a time on a CPU), else torch's. Taken once
        per engine, so that a step calls the operator itself."""
        return torch.ops.anatomy.argmax if self.native and native.loaded() else greedy

    def compile_mode(self, device: torch.device) -> str | None:
        """torch.compile's mode for a step on `device`: CUDA graphs on a GPU, the default elsewhere."""
        return "reduce-overhead" if device.type == "cuda" else None


CPU = Backend("cpu", native=True)
TORCH = Backend("torch", native=False)


def backend_for(device: torch.device, name: str | None = None) -> Backend:
    """The backend named (None: the device's own), refused where it cannot run."""
    if name is None:
        return CPU if device.type == "cpu" else TORCH
    if name not in NAMES:
        raise InputError(f"backend {name!r} is not one of {', '.join(NAMES)}")
    if name == "cpu" and device.type != "cpu":
        raise InputError(f"backend 'cpu' runs CPU tensors only; the model is on {device} (use backend 'torch')")
    return CPU if name == "cpu" else TORCH
