"""`anatomy inspect --model MODEL`: the diagram, parameter ledger, shape trace, FLOPs, memory, roofline
and training time of a preset, an HF config.json (or its directory), a .gguf file or a named model."""

from __future__ import annotations

import argparse
import difflib
import json
import math
import sys
from pathlib import Path

from anatomy import dtypes
from anatomy.commands.common import add_old_name
from anatomy.config import ModelConfig
from anatomy.deprecation import deprecated
from anatomy.errors import CheckpointError, InputError
from anatomy.figures import image_format


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="shapes, parameters, FLOPs, memory, roofline and training time of a model")
    p.add_argument("--model", default=None,
                   help="preset name, HF config.json or its directory, .gguf file, or installed model name")
    p.add_argument("old_model", nargs="?", default=None, metavar="MODEL", help=argparse.SUPPRESS)
    add_size_options(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON (keys in docs/anatomy.md)")
    p.add_argument("--markdown", action="store_true", help="print the report as Markdown")
    p.add_argument("--plot", metavar="FILE.png", help="write the parameter breakdown and roofline chart")
    p.add_argument("--mermaid", action="store_true", help="print only the block as a Mermaid flowchart")
    p.add_argument("--html", metavar="FILE.html", help="write the report as one self-contained page (diagram, "
                   "ledger, shape trace, FLOPs, memory, roofline)")
    p.set_defaults(run=run)


def add_size_options(p: argparse.ArgumentParser) -> None:
    """The options `inspect` and `compare` share."""
    from anatomy.analysis.hardware import hardware_names

    p.add_argument("--batch-size", type=int, default=1, help="batch size B (default 1)")
    p.add_argument("--seq-len", type=int, default=None, help="prefill/training length S (default min(512, max_seq_len))")
    add_old_name(p, "--batch", new="--batch-size", dest="batch_size", type=int)
    add_old_name(p, "--seq", new="--seq-len", dest="seq_len", type=int)
    p.add_argument("--context", type=int, default=None, help="decode context T (default max_seq_len)")
    p.add_argument("--dtype", default="bf16", help=f"weight dtype: {', '.join(dtypes.ALL)} (default bf16)")
    p.add_argument("--kv-dtype", default=None, help="KV cache dtype (default: the compute dtype)")
    p.add_argument("--hardware", default="h100-sxm", help=f"{', '.join(hardware_names())} (default h100-sxm)")
    p.add_argument("--tokens", type=float, default=None, help="training tokens, e.g. 1e12 (adds a training estimate)")
    p.add_argument("--gpus", type=int, default=1, help="GPUs for the training estimate (default 1)")
    p.add_argument("--mfu", type=float, default=0.4, help="model FLOPs utilisation in (0, 1] (default 0.4)")


def model_of(args: argparse.Namespace) -> str:
    """--model, or the deprecated positional MODEL."""
    if args.old_model is not None:
        if args.model is not None:
            raise InputError(f"two models: --model {args.model} and {args.old_model}; give one, as --model")
        deprecated(f"`anatomy inspect {args.old_model}` is deprecated, use `anatomy inspect --model {args.old_model}`")
        return args.old_model
    if args.model is None:
        raise InputError("no model to inspect: give one with --model (a preset, config.json, .gguf or model name)")
    return args.model


def resolve_config(name: str) -> ModelConfig:
    """load_config; a bare name it does not know that resembles a preset gets the preset suggestion."""
    from anatomy.checkpoints.loader import load_config
    from anatomy.presets import PRESETS, get_preset

    try:
        return load_config(name)
    except CheckpointError:
        bare = not Path(name).exists() and "/" not in name and not Path(name).suffix
        if bare and difflib.get_close_matches(name, PRESETS, n=1, cutoff=0.6):
            get_preset(name)  # raises, naming the close presets
        raise


def options_from_args(args: argparse.Namespace, config: ModelConfig):
    from anatomy.analysis.report import Options

    seq = args.seq_len if args.seq_len is not None else min(512, config.max_seq_len)
    context = args.context if args.context is not None else config.max_seq_len
    for name, value in (("--batch-size", args.batch_size), ("--seq-len", seq), ("--context", context),
                        ("--gpus", args.gpus)):
        if value <= 0:
            raise InputError(f"{name} {value} must be a positive integer")
    if args.tokens is not None and not 0 < args.tokens < math.inf:
        raise InputError(f"--tokens {args.tokens:g} must be a positive number")
    if not 0 < args.mfu <= 1:
        raise InputError(f"--mfu {args.mfu:g} is outside (0, 1]")
    if config.position in ("learned", "sinusoidal"):
        checked = (("--seq-len", seq),) if config.is_encoder else (("--seq-len", seq), ("--context", context))
        for name, value in checked:  # an encoder does not decode: its --context is unused
            if value > config.max_seq_len:
                raise InputError(f"{name} {value} exceeds max_seq_len={config.max_seq_len} "
                                 f"(position={config.position!r} has a table of max_seq_len entries)")
    dtype = dtypes.parse(args.dtype, option="--dtype", choices=dtypes.ALL).name
    kv_dtype = dtypes.parse(args.kv_dtype, option="--kv-dtype", choices=dtypes.ALL).name if args.kv_dtype else None
    return Options(batch=args.batch_size, seq=seq, context=context, dtype=dtype, kv_dtype=kv_dtype,
                   tokens=args.tokens, gpus=args.gpus, mfu=args.mfu)


def run(args: argparse.Namespace) -> int:
    from anatomy.analysis import diagram, render
    from anatomy.analysis.hardware import get_hardware
    from anatomy.analysis.plot import save_plot
    from anatomy.analysis.report import build_report

    name = model_of(args)
    if args.plot:
        image_format(args.plot, option="--plot")  # before any work
    config = resolve_config(name)
    options = options_from_args(args, config)
    if args.html:
        from anatomy.analysis.page import check_output_path

        check_output_path(args.html)  # before the work: a bad path fails fast
    if args.mermaid:
        print(diagram.mermaid(diagram.describe(config)))
        return 0
    report = build_report(config, name=name, options=options, hardware=get_hardware(args.hardware),
                          stored=_stored(name))
    if args.plot:
        save_plot(report, args.plot)
    if args.html:
        from anatomy.analysis.page import inspect_page, write_page

        write_page(inspect_page(report), args.html)
        print(f"wrote {args.html}", file=sys.stderr)
    if args.json:
        print(json.dumps(report, indent=2))
    elif args.markdown:
        print(render.markdown(report))
    else:
        render.print_rich(report, width=None if sys.stdout.isatty() else 200)
    return 0


def _stored(name: str) -> dict | None:
    """The real bytes of a checkpoint's tensors (by GGUF type or dtype); None for a preset."""
    from anatomy.checkpoints.loader import stored_weights
    from anatomy.presets import PRESETS

    return None if name in PRESETS and not Path(name).exists() else stored_weights(name)
