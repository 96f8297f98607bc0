"""`anatomy.profile(model)`: the report of `anatomy profile` as a Python object.

    report = anatomy.profile("smollm2-135m-instruct", sweep=["batch=1,2,4,8"])
    report["phases"]["decode"]["positions"]   # the dict `anatomy profile --json` prints
    print(report.markdown())
    report                                    # in Jupyter: the page (_repr_html_)

Everything one command does, in order: the sizes checked against the model's context and this
machine's memory (before loading anything), the model loaded (a preset gets random weights), the
machine's roofs measured, the profile, the sweeps and the what-ifs.
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
        from anatomy.analysis.profile_render import markdown

        return markdown(self.data)

    def html(self) -> str:
        from anatomy.analysis.page.profile import profile_page

        return profile_page(self.data)

    def __repr__(self) -> str:
        m = self.data["model"]
        decode = self.data["phases"].get("decode") or self.data["phases"]["prefill"]
        return f"<anatomy profile of {m['name']}: {decode['tok_per_s']:,.1f} tok/s measured>"


def profile(model: str | os.PathLike[str] | nn.Module, *, weights: str = "f32", batch_size: int = 1,
            prompt_len: int = 128, context: int | None = None, new_tokens: int = 16,
            sweep: list[str] | tuple[str, ...] = (), what_if: list[str] | tuple[str, ...] = (),
            hardware: str | None = None, name: str | None = None) -> ProfileReport:
    """Profile a model (a loaded model, or a name / .gguf / HF directory / preset loaded at `weights`).
    `sweep`: "batch=1,2,4" or "context=256,512"; `what_if`: "weights=bf16", "attention=eager",
    "batch=8"; `hardware`: a named accelerator whose prediction is added."""
    from anatomy.analysis.hardware import get_hardware
    from anatomy.analysis.profile import ProfileOptions

    weights = dtypes.parse(weights, option="weights").name
    options = ProfileOptions(batch=batch_size, prompt_len=prompt_len, context=context, new_tokens=new_tokens)
    return ProfileReport(run_session(model, weights=weights, options=options, sweeps=[_sweep(s) for s in sweep],
                                     what_ifs=[_what_if(w) for w in what_if],
                                     hardware=get_hardware(hardware) if hardware else None, name=name))


def _sweep(text: str) -> tuple[str, list[int]]:
    from anatomy.analysis.profile_sweep import parse_sweep

    return parse_sweep(text)


def _what_if(text: str) -> tuple[str, str]:
    from anatomy.analysis.profile_whatif import parse_what_if

    return parse_what_if(text)


def run_session(model: str | os.PathLike[str] | nn.Module, *, weights: str, options, sweeps, what_ifs,
                hardware=None, name: str | None = None, machine=None) -> dict[str, Any]:
    """The whole report: checks, load, roofs, profile, sweeps, what-ifs."""
    from anatomy.analysis.hardware import measure_local
    from anatomy.analysis.profile import profile as profile_model

    label = name or (str(model) if not isinstance(model, nn.Module) else type(model).__name__)
    source = _checkpoint_name(model)
    config = _config_of(model)
    check_all(config, options, sweeps, what_ifs, weights, loaded=isinstance(model, nn.Module))
    if not isinstance(model, nn.Module):
        model = load_model(str(model), weights)
    elif not hasattr(model, "config"):
        raise InputError(f"{type(model).__name__} has no anatomy ModelConfig in .config")
    compute = [dtypes.name_of(_float_dtype(model))] + [v for k, v in what_ifs if k == "weights"]
    machine = machine or measure_local(compute_dtypes=tuple(dict.fromkeys(compute)))
    report = profile_model(model, options=options, name=label, machine=machine, hardware=hardware)
    report["options"]["weights"] = compute[0]
    report["sweep"] = []
    for key, values in sweeps:
        result = _run_sweep(model, key, values, options, machine)
        report["sweep"] += result["rows"]
        if "ridge" in result:
            report["ridge"] = result["ridge"]
    report["what_if"] = [_run_what_if(model, source, key, value, options, machine, report) for key, value in what_ifs]
    return report


def _checkpoint_name(model) -> str | None:
    """The name a model is loaded from (not a preset, not a model object), for loading it again."""
    from anatomy.presets import PRESETS

    return None if isinstance(model, nn.Module) or str(model) in PRESETS else str(model)


def _config_of(model):
    if isinstance(model, nn.Module):
        return model.config
    from anatomy.commands.inspect import resolve_config

    return resolve_config(str(model))


def _float_dtype(model: nn.Module):
    from anatomy.analysis.profile import activation_dtype

    return activation_dtype(model)


def check_all(config, options, sweeps, what_ifs, weights: str, *, loaded: bool = False) -> None:
    """Every run the session will make, checked against the model's context and this machine's memory
    (`loaded`: the model is in memory already, its weights are not asked for again)."""
    from anatomy.analysis.profile import check_run, run_bytes
    from anatomy.analysis.profile_sweep import sweep_options

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
            other = dtypes.parse(value, option="--what-if weights").name
            both = run_bytes(config, options, weights)["weights"] + resident
            check_run(config, options, other, option=f"--what-if weights={other}", resident_bytes=both)
        elif key == "attention":
            from anatomy.layers.attention import BACKENDS

            if value not in BACKENDS:
                raise InputError(f"--what-if attention={value}: the backends are {', '.join(BACKENDS)}")
            check_run(config, dataclasses.replace(options, attention=value), weights,
                      option=f"--what-if attention={value}", resident_bytes=resident)


def load_model(name: str, weights: str) -> nn.Module:
    """A preset is built with random weights; anything else is loaded (anatomy.load)."""
    from anatomy.presets import PRESETS

    if name in PRESETS:
        from anatomy import build_model, get_preset

        return build_model(get_preset(name), dtype=weights).eval()
    import anatomy

    return anatomy.load(name, dtype=weights)


def _run_sweep(model: nn.Module, key: str, values: list[int], options, machine) -> dict[str, Any]:
    from anatomy.analysis.profile_sweep import run_sweep

    return run_sweep(model, key, values, options=options, machine=machine)


def _run_what_if(model: nn.Module, source: str | None, key: str, value: str, options, machine,
                 base: dict[str, Any]) -> dict[str, Any]:
    from anatomy.analysis.profile import profile as profile_model
    from anatomy.analysis.profile_whatif import compare

    if key == "weights":
        other = _with_weights(model, source, dtypes.parse(value, option="--what-if weights").name)
        after = profile_model(other, options=options, machine=machine)
    elif key == "attention":
        after = profile_model(model, options=dataclasses.replace(options, attention=value), machine=machine)
    else:
        after = profile_model(model, options=dataclasses.replace(options, batch=int(value)), machine=machine)
    return compare(f"{key}={value}", base, after)


def _with_weights(model: nn.Module, source: str | None, weights: str) -> nn.Module:
    """The model with its weights in another format: loaded again from its checkpoint when it came
    from one, else (a preset's random weights, a model object) a converted copy of the same weights."""
    import copy

    if source is not None:
        return load_model(source, weights)
    return copy.deepcopy(model).to(dtypes.torch_dtype(weights))
