"""What-if rows: one switch of the engine flipped, the same steps measured again, and the change at
each position of the map, so that a user sees where an optimization acts and by how much.

    weights=bf16       the weights (and activations) loaded in another format
    attention=eager    the attention backend of the engine's view (the score matrix as a tensor)
    kv_dtype=int8      what the engine's KV cache holds (int8, fp8_e4m3, fp8_e5m2, bf16, ...)
    batch=8            more rows per step

Step times are the eager steps' unprofiled ones, the positions' the profiled ones (docs/profile.md).
"""

from __future__ import annotations

from typing import Any

from anatomy.errors import InputError

SWITCHES = ("weights", "attention", "kv_dtype", "batch")


def parse_what_if(text: str) -> tuple[str, str]:
    """"weights=bf16" -> ("weights", "bf16"); InputError naming the rule otherwise."""
    key, sep, value = text.partition("=")
    if not sep or key not in SWITCHES or not value:
        raise InputError(f"--what-if {text!r}: write SWITCH=VALUE with SWITCH one of {', '.join(SWITCHES)}")
    if key == "batch" and (not value.isdigit() or int(value) < 1):
        raise InputError(f"--what-if {text!r}: batch must be a positive integer")
    if key == "kv_dtype":
        from anatomy.kv_format import parse_kv_dtype

        value = parse_kv_dtype(value, option="--what-if kv_dtype")
    return key, value


def compare(switch: str, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The before/after of every phase both reports have."""
    phases = {}
    for phase, b in before["phases"].items():
        a = after["phases"].get(phase)
        if a is None:
            continue
        phases[phase] = {
            "before_step_s": b["unprofiled_step_s"], "after_step_s": a["unprofiled_step_s"],
            "before_tok_per_s": b["eager_tok_per_s"], "after_tok_per_s": a["eager_tok_per_s"],
            "positions": {k: [b["positions"].get(k, 0.0), a["positions"].get(k, 0.0)]
                          for k in {**b["positions"], **a["positions"]}},
        }
    return {"switch": switch, "phases": phases}
