"""`anatomy profile --sweep batch=1,2,4,...` and `--sweep context=...`: the decode step measured at
each value, next to its prediction.

Each point is a decode-only profile (measure.py) of B rows at context T: measured, predicted and
pure-roofline tok/s on this machine's measured roofs. A batch sweep gives the measured ridge (where
two lines fitted in log space to the GEMM time per step meet: flat, then through the origin; null
when the time never leaves the flat line) against roofline.decode_compute_bound_batch. A context
sweep shows attention and its KV-cache reads growing with T. docs/profile.md has an example.
"""

from __future__ import annotations

import math
from typing import Any

from torch import nn

from anatomy.errors import InputError

SWEEP_KEYS = ("batch", "context")
SWEEP_PROMPT = 8  # the prompt a decoder's sweep prefills before its decode steps
GEMM_POSITIONS = ("qkv_ffn_gemm", "lm_head")


def parse_sweep(text: str) -> tuple[str, list[int]]:
    """"batch=1,2,4" -> ("batch", [1, 2, 4]); InputError naming the rule otherwise."""
    key, sep, values = text.partition("=")
    if not sep or key not in SWEEP_KEYS:
        raise InputError(f"--sweep {text!r}: write KEY=V1,V2,... with KEY one of {', '.join(SWEEP_KEYS)}")
    try:
        numbers = [int(v) for v in values.split(",") if v.strip()]
    except ValueError:
        raise InputError(f"--sweep {text!r}: the values must be integers separated by commas") from None
    if not numbers or any(n < 1 for n in numbers):
        raise InputError(f"--sweep {text!r}: the values must be positive integers")
    return key, sorted(set(numbers))


def run_sweep(model: nn.Module, key: str, values: list[int], *, options, machine) -> dict[str, Any]:
    """{"rows": the decode step at each value of `key` ("batch" or "context"), the others as in
    `options`; "ridge": for a batch sweep, the measured and predicted ridge}."""
    from anatomy.analysis.profile.measure import measure as profile
    from anatomy.analysis.profile.machine import Machine

    from anatomy import progress

    machine = machine if isinstance(machine, Machine) else Machine(machine)
    points = []
    for value in progress.track(values, f"sweep {key}"):
        report = profile(model, options=sweep_options(model.config, options, key, value), machine=machine)
        points.append(_point(key, report))
    out: dict[str, Any] = {"rows": points}
    if key == "batch":
        out["ridge"] = ridge(model.config, points, machine, report["options"])
    return out


def sweep_options(config, options, key: str, value: int):
    """The options of one sweep point: decode only (the eager step: no production step), `key` set to
    `value`. A decode step attends over all T slots of its run's table wherever the prompt ends, so a
    decoder's point prefills a short prompt (its warm-up) and keeps the main run's T unless T is what is swept."""
    import dataclasses

    short = {"prompt_len": min(options.prompt_len, SWEEP_PROMPT)} if config.is_decoder else {}
    base = dataclasses.replace(options, context=options.context_for(config), phases=("decode",), production=False,
                               **short)
    return dataclasses.replace(base, **{key: value})


def _point(key: str, report: dict[str, Any]) -> dict[str, Any]:
    d = report["phases"]["decode"]
    o = report["options"]
    attention = [r for r in d["ops"] if r["position"] == "rope_attention" and r["bytes"]]
    return {
        "sweep": key, "batch": o["batch"], "context": o["context"],
        "tok_per_s": d["tok_per_s"], "predicted_tok_per_s": d["predicted_tok_per_s"],
        "roofline_tok_per_s": o["batch"] / d["roofline_step_s"] if d["roofline_step_s"] else None,
        "step_s": d["unprofiled_step_s"], "gemm_s": sum(d["positions"][p] for p in GEMM_POSITIONS),
        "attention_s": d["positions"]["rope_attention"], "kv_write_s": d["positions"]["kv_cache"],
        "attention_bytes": sum(r["bytes"] for r in attention),
        "attention_roofline_s": sum(r["roofline_s"] or 0.0 for r in attention),
        "gemm_bound": _majority([r for r in d["ops"] if r["position"] in GEMM_POSITIONS]),
        "weight_bytes": sum(r["kernel_weight_bytes"] or r["weight_bytes"] or 0 for r in d["ops"]),
        "positions": d["positions"],
    }


def _majority(rows: list[dict[str, Any]]) -> str | None:
    time: dict[str, float] = {}
    for r in rows:
        time[r["bound"]] = time.get(r["bound"], 0.0) + r["time_s"]
    return max(time, key=time.get) if time else None


def ridge(config, points: list[dict[str, Any]], machine, options: dict[str, Any]) -> dict[str, Any]:
    """Measured ridge (the fit of the GEMM times) against the predicted one (the roofline's, with the
    weights' real bytes as the first point read them)."""
    from anatomy.analysis import roofline
    from anatomy.analysis.params import parameter_ledger

    dtype = options["compute_dtype"]
    predicted = roofline.decode_compute_bound_batch(
        config, parameter_ledger(config), machine.roofs(dtype), context=options["context"],
        source_len=options["prompt_len"], weight_dtype=dtype, kv_dtype=dtype, compute_dtype=dtype,
        weight_bytes=points[0]["weight_bytes"] or None)
    measured = fit_ridge([p["batch"] for p in points], [p["gemm_s"] for p in points])
    return {"measured_batch": measured, "predicted_batch": predicted,
            "first_compute_bound_batch": next((p["batch"] for p in points if p["gemm_bound"] == "compute"), None)}


def fit_ridge(xs: list[int], ys: list[float]) -> float | None:
    """Where a flat line (the first points) meets a line through the origin (the rest), fitted to
    (x, y) in log space; None when the flat line alone fits best (no ridge inside the range)."""
    if len(xs) < 3:
        return None
    best_err, best = _flat_error(xs, ys), None
    for k in range(1, len(xs) - 1):  # at least one point on each line... and two on the rising one
        flat = math.exp(sum(math.log(y) for y in ys[:k]) / k)
        slope = math.exp(sum(math.log(y / x) for x, y in zip(xs[k:], ys[k:])) / (len(xs) - k))
        err = sum((math.log(y) - math.log(max(flat, slope * x))) ** 2 for x, y in zip(xs, ys))
        if err < best_err:
            best_err, best = err, flat / slope
    return best


def _flat_error(xs: list[int], ys: list[float]) -> float:
    mean = sum(math.log(y) for y in ys) / len(ys)
    return sum((math.log(y) - mean) ** 2 for y in ys)
