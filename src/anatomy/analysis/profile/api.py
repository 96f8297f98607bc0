"""`anatomy.profile(model)`: the report of `anatomy profile` as a Python object.

    report = anatomy.profile("<model>", sweep=["batch=1,2,4,8"])
    report["phases"]["decode"]["positions"]   # the dict `anatomy profile --json` prints
    print(report.markdown())

Everything one command does, in order (docs/profile.md, "What it does"): the sizes checked before
anything loads, the model loaded, the machine's roofs measured, the profile, sweeps and what-ifs.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from torch import nn

from anatomy import dtypes
from anatomy.analysis.inspection import Report
from anatomy.errors import InputError


class ProfileReport(Report):
    """The profile report: a read-only mapping of the --json keys, with its renderings."""

    def markdown(self) -> str:
        from anatomy.analysis.profile.render import markdown

        return markdown(self.data)

    def html(self) -> str:
        from anatomy.analysis.page.profile import profile_page

        return profile_page(self.data)

    def __repr__(self) -> str:
        m = self.data["model"]
        decode = self.data["phases"].get("decode") or self.data["phases"]["prefill"]
        return f"<anatomy profile of {m['name']}: {decode['tok_per_s']:,.1f} tok/s measured>"


def profile(model: str | os.PathLike[str] | nn.Module, *, weights: str = "auto", batch_size: int = 1,
            prompt_len: int = 128, context: int | None = None, new_tokens: int = 16,
            sweep: str | list[str] | tuple[str, ...] = (), what_if: str | list[str] | tuple[str, ...] = (),
            hardware: str | None = None, name: str | None = None, kv_dtype: str | None = None) -> ProfileReport:
    """Profile a model (a loaded model, or a name / .gguf / HF directory / preset loaded at `weights`,
    as anatomy.load takes it). `sweep`: "batch=1,2,4" or "context=256,512" (one or a list);
    `what_if`: "weights=bf16", "attention=eager", "kv_dtype=int8", "batch=8" (one or a list); `hardware`: a
    named accelerator whose prediction is added; `kv_dtype`: what the engine's KV cache holds."""
    from anatomy.analysis.hardware import get_hardware
    from anatomy.analysis.profile.measure import ProfileOptions

    weights = parse_weights(weights)
    sweeps = [_sweep(s) for s in ([sweep] if isinstance(sweep, str) else sweep)]
    what_ifs = [_what_if(w) for w in ([what_if] if isinstance(what_if, str) else what_if)]
    from anatomy.kv_format import parse_kv_dtype

    options = ProfileOptions(batch=batch_size, prompt_len=prompt_len, context=context, new_tokens=new_tokens,
                             kv_dtype=parse_kv_dtype(kv_dtype))
    return ProfileReport(run_session(model, weights=weights, options=options, sweeps=sweeps, what_ifs=what_ifs,
                                     hardware=get_hardware(hardware) if hardware else None, name=name))


def _sweep(text: str) -> tuple[str, list[int]]:
    from anatomy.analysis.profile.sweep import parse_sweep

    return parse_sweep(text)


def _what_if(text: str) -> tuple[str, str]:
    from anatomy.analysis.profile.whatif import parse_what_if

    return parse_what_if(text)


def run_session(model: str | os.PathLike[str] | nn.Module, *, weights: str, options, sweeps, what_ifs,
                hardware=None, name: str | None = None, machine=None) -> dict[str, Any]:
    """The whole report: checks, load, roofs, profile, sweeps, what-ifs (with progress on a terminal)."""
    from anatomy import progress
    from anatomy.analysis.profile.measure import measure as profile_model
    from anatomy.analysis.profile.machine import Machine

    label = name or (str(model) if not isinstance(model, nn.Module) else type(model).__name__)
    source = _checkpoint_name(model)
    config = _config_of(model)
    check_all(config, options, sweeps, what_ifs, weights, loaded=isinstance(model, nn.Module))
    with progress.task(f"profiling {label}", total=2 + len(sweeps) + len(what_ifs)) as bar:
        if not isinstance(model, nn.Module):
            model = load_model(str(model), weights)
        bar.advance()
        machine = machine if isinstance(machine, Machine) else Machine(machine)
        report = profile_model(model, options=options, name=label, machine=machine, hardware=hardware)
        report["options"]["weights"] = weights_label(model)
        report["sweep"], report["what_if"] = [], []
        bar.advance()
        for key, values in sweeps:
            result = _run_sweep(model, key, values, options, machine)
            report["sweep"] += result["rows"]
            if "ridge" in result:
                report["ridge"] = result["ridge"]
            bar.advance()
        for key, value in what_ifs:
            report["what_if"].append(_run_what_if(model, source, key, value, options, machine, report))
            bar.advance()
    return report


def parse_weights(value: str, *, option: str = "weights") -> str:
    """A `weights=` choice of anatomy.load (auto, f32, f16, bf16, int8, int4); InputError naming `option`."""
    from anatomy.weights.choice import CHOICES

    if value == "auto":
        return value
    return dtypes.parse(value, option=option, choices=CHOICES[1:]).name


def _checkpoint_name(model) -> str | None:
    """The name a model is loaded from (not a preset or config without weights, not a model object),
    for loading it again."""
    from anatomy.checkpoints.source import find_model

    return None if isinstance(model, nn.Module) or not find_model(model).with_weights else str(model)


def _config_of(model):
    from anatomy.config import ModelConfig

    if isinstance(model, nn.Module):
        if not isinstance(getattr(model, "config", None), ModelConfig):
            raise InputError(f"{type(model).__name__} has no anatomy ModelConfig in .config: profile takes a model "
                             "anatomy built or loaded, or a name, path or preset")
        return model.config
    from anatomy.checkpoints.loader import resolve_config

    return resolve_config(str(model))


def weights_label(model: nn.Module) -> str:
    """The formats a model's matrices are held in, e.g. "int4+int8g" or "f32"."""
    from anatomy.weights.modules import compact_modules

    names = {m.compact.name for m in compact_modules(model).values()}
    dense = {dtypes.name_of(m.weight.dtype) for m in model.modules()
             if isinstance(m, (nn.Linear, nn.Embedding)) and m.weight.is_floating_point()}
    return "+".join(sorted(names | dense))


def check_all(config, options, sweeps, what_ifs, weights: str, *, loaded: bool = False) -> None:
    """Every run the session will make, checked against the model's context and this machine's memory
    (`loaded`: the model is in memory already, its weights are not asked for again)."""
    from anatomy.analysis.profile.checks import check_run, run_bytes
    from anatomy.analysis.profile.sweep import sweep_options

    resident = -run_bytes(config, options, weights)["weights"] if loaded else 0
    check_run(config, options, weights, resident_bytes=resident)
    for key, values in sweeps:
        if config.is_encoder:
            raise InputError(f"--sweep {key}=...: a sweep measures decode steps, and an encoder has none")
        for value in values:
            check_run(config, sweep_options(config, options, key, value), weights,
                      option=f"--sweep {key}={value}", resident_bytes=resident)
    for key, value in what_ifs:
        if key == "batch":
            check_run(config, dataclasses.replace(options, batch=int(value)), weights,
                      option=f"--what-if batch={value}", resident_bytes=resident)
        elif key == "weights":
            other = parse_weights(value, option="--what-if weights")
            both = run_bytes(config, options, weights)["weights"] + resident
            check_run(config, options, other, option=f"--what-if weights={other}", resident_bytes=both)
        elif key == "attention":
            from anatomy.layers.attention import BACKENDS

            if value not in BACKENDS:
                raise InputError(f"--what-if attention={value}: the backends are {', '.join(BACKENDS)}")
            check_run(config, dataclasses.replace(options, attention=value), weights,
                      option=f"--what-if attention={value}", resident_bytes=resident)


def load_model(name: str, weights: str) -> nn.Module:
    """A preset or a config without weights is built with random weights (f32 for "auto"), converted
    to the `weights` choice; a checkpoint is loaded: anatomy.load(name, weights=...)."""
    import anatomy
    from anatomy.checkpoints.source import find_model

    if find_model(name).with_weights:
        return anatomy.load(name, weights=weights)
    return converted(anatomy.build_model(anatomy.load_config(name)).eval(), weights)


def converted(model: nn.Module, weights: str) -> nn.Module:
    """An f32 model's matrices in the `weights` choice: a float dtype, or int8/int4 compact formats
    (anatomy.weights.choice, as anatomy.load converts a checkpoint); "auto" leaves them."""
    import torch

    from anatomy.weights.choice import compact_formats, install

    if weights in dtypes.FLOATS:
        return model.to(dtypes.torch_dtype(weights))
    if weights == "auto":
        return model
    formats = compact_formats(model, weights, dtype=torch.float32, lossless=lambda _: None,
                              dense=lambda n: model.get_parameter(n).detach())
    return install(model, formats, dtype=torch.float32)


def _run_sweep(model: nn.Module, key: str, values: list[int], options, machine) -> dict[str, Any]:
    from anatomy.analysis.profile.sweep import run_sweep

    return run_sweep(model, key, values, options=options, machine=machine)


def _run_what_if(model: nn.Module, source: str | None, key: str, value: str, options, machine,
                 base: dict[str, Any]) -> dict[str, Any]:
    from anatomy.analysis.profile.measure import measure as profile_model
    from anatomy.analysis.profile.whatif import compare

    options = dataclasses.replace(options, production=False)  # a what-if compares eager steps
    if key == "weights":
        other = _with_weights(model, source, parse_weights(value, option="--what-if weights"))
        after = profile_model(other, options=options, machine=machine)
    elif key in ("attention", "kv_dtype"):
        after = profile_model(model, options=dataclasses.replace(options, **{key: value}), machine=machine)
    else:
        after = profile_model(model, options=dataclasses.replace(options, batch=int(value)), machine=machine)
    return compare(f"{key}={value}", base, after)


def _with_weights(model: nn.Module, source: str | None, weights: str) -> nn.Module:
    """The model with its weights in another format: loaded again from its checkpoint when it came
    from one, else (a preset's random weights, a model object) a converted copy of the same weights."""
    import copy

    from anatomy.weights.modules import compact_modules

    if source is not None:
        return load_model(source, weights)
    if compact_modules(model):
        raise InputError("--what-if weights=...: a model object with compact weights can only be converted "
                         "by loading it again: profile it by name")
    return converted(copy.deepcopy(model).float(), weights)
