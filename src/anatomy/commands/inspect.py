"""`anatomy inspect MODEL`: the diagram, parameter ledger, shape trace, FLOPs, memory, roofline
and training time of a preset, an HF config.json (or its directory), a .gguf file or a named model."""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path

from anatomy.config import ModelConfig
from anatomy.errors import CheckpointError, InputError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="shapes, parameters, FLOPs, memory, roofline and training time of a model")
    p.add_argument("model", help="preset name, HF config.json or its directory, .gguf file, or installed model name")
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
    from anatomy.analysis.memory import DTYPE_BITS

    p.add_argument("--batch", type=int, default=1, help="batch size B (default 1)")
    p.add_argument("--seq", type=int, default=None, help="prefill/training length S (default min(512, max_seq_len))")
    p.add_argument("--context", type=int, default=None, help="decode context T (default max_seq_len)")
    p.add_argument("--dtype", default="bf16", help=f"weight dtype: {', '.join(DTYPE_BITS)} (default bf16)")
    p.add_argument("--kv-dtype", default=None, help="KV cache dtype (default: the compute dtype)")
    p.add_argument("--hardware", default="h100-sxm", help=f"{', '.join(hardware_names())} (default h100-sxm)")
    p.add_argument("--tokens", type=float, default=None, help="training tokens, e.g. 1e12 (adds a training estimate)")
    p.add_argument("--gpus", type=int, default=1, help="GPUs for the training estimate (default 1)")
    p.add_argument("--mfu", type=float, default=0.4, help="model FLOPs utilisation in (0, 1] (default 0.4)")


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
    from anatomy.analysis.memory import check_dtype
    from anatomy.analysis.report import Options

    seq = args.seq if args.seq is not None else min(512, config.max_seq_len)
    context = args.context if args.context is not None else config.max_seq_len
    for name, value in (("--batch", args.batch), ("--seq", seq), ("--context", context), ("--gpus", args.gpus)):
        if value <= 0:
            raise InputError(f"{name} {value} must be a positive integer")
    if args.tokens is not None and not args.tokens > 0:
        raise InputError(f"--tokens {args.tokens:g} must be positive")
    if not 0 < args.mfu <= 1:
        raise InputError(f"--mfu {args.mfu:g} is outside (0, 1]")
    if config.position in ("learned", "sinusoidal"):
        checked = (("--seq", seq),) if config.is_encoder else (("--seq", seq), ("--context", context))
        for name, value in checked:  # an encoder does not decode: its --context is unused
            if value > config.max_seq_len:
                raise InputError(f"{name} {value} exceeds max_seq_len={config.max_seq_len} "
                                 f"(position={config.position!r} has a table of max_seq_len entries)")
    check_dtype(args.dtype)
    if args.kv_dtype is not None:
        check_dtype(args.kv_dtype, option="--kv-dtype")
    return Options(batch=args.batch, seq=seq, context=context, dtype=args.dtype, kv_dtype=args.kv_dtype,
                   tokens=args.tokens, gpus=args.gpus, mfu=args.mfu)


def run(args: argparse.Namespace) -> int:
    from anatomy.analysis import diagram, render
    from anatomy.analysis.hardware import get_hardware
    from anatomy.analysis.plot import save_plot
    from anatomy.analysis.report import build_report

    config = resolve_config(args.model)
    options = options_from_args(args, config)
    if args.html:
        from anatomy.analysis.page import check_output_path

        check_output_path(args.html)  # before the work: a bad path fails fast
    if args.mermaid:
        print(diagram.mermaid(diagram.describe(config)))
        return 0
    report = build_report(config, name=args.model, options=options, hardware=get_hardware(args.hardware))
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
