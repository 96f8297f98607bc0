"""What a LoRA adapter is: its rank, alpha, dropout and the projections it adapts, by anatomy's
own names (q, k, v, o of attention; gate, up, down of the FFN).

    W x  ->  W x + scale * B (A x),   A [r, in], B [out, r],   scale = alpha / r  (rsLoRA: alpha / sqrt(r))
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from anatomy.errors import InputError

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
DEFAULT_TARGETS = ("q", "v")  # PEFT's default for LLaMA-style models


@dataclass(frozen=True, kw_only=True)
class LoraConfig:
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = DEFAULT_TARGETS
    rslora: bool = False  # scale alpha / sqrt(rank) (rank-stabilized LoRA)
    layers: tuple[int, ...] | None = None  # the blocks adapted (None: all); PEFT's layers_to_transform
    base_model: str | None = None  # the model the adapter was trained on (PEFT's base_model_name_or_path)

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise InputError(f"LoRA rank {self.rank!r} must be a positive integer")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not 0 < self.alpha < math.inf:
            raise InputError(f"LoRA alpha {self.alpha!r} must be a positive number")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            raise InputError(f"LoRA dropout {self.dropout!r} must be in [0, 1)")
        object.__setattr__(self, "targets", parse_targets(self.targets))

    @property
    def scale(self) -> float:
        return self.alpha / (math.sqrt(self.rank) if self.rslora else self.rank)


def parse_targets(targets: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """"q,v" or ("q", "v") -> ("q", "v") in TARGETS order, each known, at least one ("all": every one)."""
    names = [t.strip() for t in targets.split(",") if t.strip()] if isinstance(targets, str) else list(targets)
    if names == ["all"]:
        return TARGETS
    unknown = [t for t in names if t not in TARGETS]
    if unknown or not names:
        raise InputError(f"LoRA target {unknown[0] if unknown else '(none)'!r} is not one of "
                         f"{', '.join(TARGETS)} (or 'all')")
    return tuple(t for t in TARGETS if t in names)
