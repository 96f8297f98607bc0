"""`anatomy profile --model MODEL`: the real engine under torch.profiler, every op put back on its
module, its row of the shape trace and its position of the decoder's map, against this machine's
measured roofs (analysis/profile.py; docs/profile.md)."""

from __future__ import annotations

import argparse
import json
import sys

from anatomy import dtypes
from anatomy.errors import InputError

DEFAULT_MODEL = "smollm2-135m-instruct"


def add_parser(sub: argparse._SubParsersAction) -> None:
    from anatomy.analysis.hardware import hardware_names

    p = sub.add_parser(
        "profile", help="run a model under the profiler: time per op and per position of the decoder's map, "
                        "against this machine's roofs",
        description="Run the real engine (prefill of S tokens, then decode steps at context T) under torch.profiler "
                    "and report, per op and per position of the decoder's map, shapes, FLOPs, bytes, measured time, "
                    "the roofline time on this machine (its roofs measured in the same run) and the verdict: "
                    "compute, bandwidth or overhead.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help="an installed model name, a .gguf file, an HF model directory, or a preset (random weights)")
    p.add_argument("--weights", default="f32", help=f"weights (and activations): {', '.join(dtypes.FLOATS)}")
    p.add_argument("--batch-size", type=int, default=1, help="rows per step B")
    p.add_argument("--prompt-len", type=int, default=128, help="prompt (encoder: sequence; seq2seq: source) length S")
    p.add_argument("--context", type=int, default=None,
                   help="cache slots T every decode step attends over (default S + warm-up + new tokens + 1)")
    p.add_argument("--new-tokens", type=int, default=16, help="decode steps measured")
    p.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="decode at each batch=... or context=... value: measured and predicted tok/s, the ridge "
                        "(repeatable)")
    p.add_argument("--what-if", action="append", default=[], metavar="SWITCH=VALUE",
                   help="the same run with weights=DTYPE, attention=sdpa|eager or batch=N: before/after per "
                        "position (repeatable)")
    p.add_argument("--hardware", default=None, help=f"add the prediction on {', '.join(hardware_names())}")
    p.add_argument("--json", action="store_true", help="print the report as JSON (keys in docs/profile.md)")
    p.add_argument("--markdown", action="store_true", help="print the report as Markdown")
    p.add_argument("--plot", metavar="FILE.png", help="write the positions and the sweeps as a chart")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from anatomy.analysis.hardware import get_hardware, measure_local
    from anatomy.analysis.profile import ProfileOptions, profile
    from anatomy.analysis.profile_sweep import parse_sweep
    from anatomy.analysis.profile_whatif import parse_what_if
    from anatomy.figures import image_format

    weights = dtypes.parse(args.weights, option="--weights").name
    sweeps = [parse_sweep(s) for s in args.sweep]
    what_ifs = [parse_what_if(w) for w in args.what_if]
    if args.plot:
        image_format(args.plot, option="--plot")
    hardware = get_hardware(args.hardware) if args.hardware else None
    options = ProfileOptions(batch=args.batch_size, prompt_len=args.prompt_len, context=args.context,
                             new_tokens=args.new_tokens)
    config = _config(args.model)
    check_all(config, options, sweeps, what_ifs, weights)
    model = load_model(args.model, weights)
    machine = measure_local(compute_dtypes=tuple(dict.fromkeys([weights] + [v for k, v in what_ifs
                                                                           if k == "weights"])))
    report = profile(model, options=options, name=args.model, machine=machine, hardware=hardware)
    report["options"]["weights"] = weights
    report["sweeps"] = [_sweep(model, key, values, options, machine) for key, values in sweeps]
    report["what_if"] = [_what_if(args.model, model, weights, key, value, options, machine, report)
                         for key, value in what_ifs]
    if args.plot:
        from anatomy.analysis.profile_plot import save_profile_plot

        save_profile_plot(report, args.plot)
    _print(report, args)
    return 0


def _config(name: str):
    from anatomy.commands.inspect import resolve_config

    return resolve_config(name)


def check_all(config, options, sweeps, what_ifs, weights: str) -> None:
    """Every run the command will make, checked against the model's context and this machine's memory."""
    import dataclasses

    from anatomy.analysis.profile import check_run

    check_run(config, options, weights)
    for key, values in sweeps:
        for value in values:
            check_run(config, dataclasses.replace(options, **{key: value}), weights, option=f"--sweep {key}={value}")
    for key, value in what_ifs:
        if key == "batch":
            check_run(config, dataclasses.replace(options, batch=int(value)), weights, option=f"--what-if batch={value}")
        elif key == "weights":
            dtypes.parse(value, option="--what-if weights")
        elif key == "attention":
            from anatomy.layers.attention import BACKENDS

            if value not in BACKENDS:
                raise InputError(f"--what-if attention={value}: the backends are {', '.join(BACKENDS)}")


def load_model(name: str, weights: str):
    """A preset is built with random weights; anything else is loaded (anatomy.load)."""
    from anatomy.presets import PRESETS

    if name in PRESETS:
        from anatomy import build_model, get_preset

        return build_model(get_preset(name), dtype=weights).eval()
    import anatomy

    return anatomy.load(name, dtype=weights)


def _sweep(model, key: str, values: list[int], options, machine):
    from anatomy.analysis.profile_sweep import run_sweep

    if model.config.is_encoder:
        raise InputError("--sweep measures decode steps: an encoder has none")
    return run_sweep(model, key, values, options=options, machine=machine)


def _what_if(name: str, model, weights: str, key: str, value: str, options, machine, base):
    import dataclasses

    from anatomy.analysis.profile import profile
    from anatomy.analysis.profile_whatif import compare

    if key == "weights":
        other = load_model(name, dtypes.parse(value, option="--what-if weights").name)
        after = profile(other, options=options, machine=machine)
    elif key == "attention":
        after = profile(model, options=dataclasses.replace(options, attention=value), machine=machine)
    else:
        after = profile(model, options=dataclasses.replace(options, batch=int(value)), machine=machine)
    return compare(f"{key}={value}", base, after)


def _print(report, args) -> None:
    from anatomy.analysis import profile_render

    if args.json:
        print(json.dumps(report, indent=2))
    elif args.markdown:
        print(profile_render.markdown(report))
    else:
        profile_render.print_rich(report, width=None if sys.stdout.isatty() else 220)
