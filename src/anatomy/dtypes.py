"""The one vocabulary of number formats: every dtype anatomy names, its torch dtype and its bits.

Names: f32, f16, bf16, int8, int4 (sizes only), fp8_e4m3 and fp8_e5m2 (the KV cache: kv_format.py).
`parse(value, option=..., choices=...)` is the only way a dtype gets in: a canonical name, a
torch.dtype (torch.float16 is "f16"), or an old spelling ("fp32", "float16", "half", ...), which
still works for a release with a DeprecationWarning naming the new one. Anything else, or a dtype
outside `choices`, is an InputError naming the option, the value and the choices.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from anatomy.deprecation import deprecated
from anatomy.errors import InputError


@dataclass(frozen=True)
class DType:
    name: str
    bits: int
    torch: torch.dtype | None  # None: no torch dtype holds it (int4 is packed two to a byte)

    @property
    def is_float(self) -> bool:
        return self.torch is not None and self.torch.is_floating_point

    def nbytes(self, count: int) -> int:
        """Bytes of `count` values (int4: two to a byte; no per-group scales)."""
        return count * self.bits // 8

    def __str__(self) -> str:
        return self.name


F32 = DType("f32", 32, torch.float32)
F16 = DType("f16", 16, torch.float16)
BF16 = DType("bf16", 16, torch.bfloat16)
INT8 = DType("int8", 8, torch.int8)
INT4 = DType("int4", 4, None)
FP8_E4M3 = DType("fp8_e4m3", 8, getattr(torch, "float8_e4m3fn", None))
FP8_E5M2 = DType("fp8_e5m2", 8, getattr(torch, "float8_e5m2", None))

DTYPES = {d.name: d for d in (F32, F16, BF16, INT8, INT4, FP8_E4M3, FP8_E5M2)}
FLOATS = ("f32", "f16", "bf16")  # what a model's weights and activations can be
ALL = tuple(DTYPES)  # what a size can be computed for
KV = ("f32", "f16", "bf16", "int8", "fp8_e4m3", "fp8_e5m2")  # what a KV cache can hold (kv_format.py)
OLD_SPELLINGS = {"fp32": "f32", "float32": "f32", "float": "f32", "fp16": "f16", "float16": "f16", "half": "f16",
                 "bfloat16": "bf16"}


def parse(value: str | torch.dtype | DType, *, option: str = "dtype", choices: Sequence[str] = FLOATS) -> DType:
    """The DType of `value` (see the module docstring); `option` names it in messages: a CLI
    option ("--dtype") or an API argument ("dtype")."""
    dtype = _lookup(value, option)
    if dtype is None or dtype.name not in choices:
        raise InputError(f"{_shown(option, value)} is not one of {', '.join(choices)}")
    return dtype


def torch_dtype(value: str | torch.dtype | DType, *, option: str = "dtype") -> torch.dtype:
    """The torch dtype of a float dtype named any accepted way."""
    return parse(value, option=option, choices=FLOATS).torch


def name_of(dtype: torch.dtype) -> str:
    """The canonical name of a torch dtype anatomy knows ("f32" for torch.float32)."""
    return parse(dtype, choices=ALL).name


def _lookup(value: object, option: str) -> DType | None:
    if isinstance(value, DType):
        return value
    if isinstance(value, torch.dtype):
        return next((d for d in DTYPES.values() if d.torch == value), None)
    if not isinstance(value, str):
        return None
    if value in OLD_SPELLINGS:
        deprecated(f"{_shown(option, value)} is deprecated, use {OLD_SPELLINGS[value]!r}")
        value = OLD_SPELLINGS[value]
    return DTYPES.get(value)


def _shown(option: str, value: object) -> str:
    """How a value is quoted back: `--dtype 'f16'` for a command-line option, `dtype='f16'` for an argument."""
    return f"{option} {value!r}" if option.startswith("-") else f"{option}={value!r}"
