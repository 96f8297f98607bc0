"""`anatomy profile --model MODEL`: the real engine under torch.profiler, every op put back on its
module, its row of the shape trace and its position of the decoder's map, against this machine's
measured roofs (analysis/profile/measure.py; docs/profile.md)."""

from __future__ import annotations

import argparse
import sys

from anatomy.commands.common import (
    MODEL_FORMS, DefaultsHelpFormatter, add_kv_dtype_option, add_model_option, add_quiet_option, add_report_options,
    model_of, print_report)
from anatomy.commands.parallel_options import (
    add_parallel_options, check_parallel, launched, layout_of, rank_engine, start_ranks)
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
        formatter_class=DefaultsHelpFormatter)
    add_model_option(p, forms=MODEL_FORMS, default=DEFAULT_MODEL, old_positional=True,
                     note=" (a preset or a config without weights runs on random weights)")
    p.add_argument("--weights", default="auto",
                   help="the format of the matrices, as anatomy.load takes it: auto (a GGUF file's own blocks), "
                        "f32, f16, bf16, int8, int4; the engine picks the activations' dtype with its kernel plan")
    p.add_argument("--batch-size", type=int, default=1, help="rows per step B")
    p.add_argument("--prompt-len", type=int, default=128, help="prompt (encoder: sequence; seq2seq: source) length S")
    p.add_argument("--context", type=int, default=None,
                   help="cache slots T every decode step attends over (default S + warm-up + new tokens + 1)")
    p.add_argument("--new-tokens", type=int, default=16, help="decode steps measured")
    p.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="decode at each batch=... or context=... value: measured and predicted tok/s, the ridge "
                        "(repeatable)")
    p.add_argument("--what-if", action="append", default=[], metavar="SWITCH=VALUE",
                   help="the same run with weights=DTYPE, attention=sdpa|eager, kv_dtype=DTYPE or batch=N: "
                        "before/after per position (repeatable)")
    p.add_argument("--hardware", default=None, help=f"add the prediction on {', '.join(hardware_names())}")
    add_kv_dtype_option(p)
    add_report_options(p, docs="docs/profile.md", plot="the positions and the sweeps as a chart",
                       html="positions, every op on this machine's roofline, sweeps, what-ifs")
    add_quiet_option(p)
    add_parallel_options(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from anatomy.analysis.hardware import get_hardware
    from anatomy.analysis.profile.measure import ProfileOptions
    from anatomy.analysis.profile.sweep import parse_sweep
    from anatomy.analysis.profile.whatif import parse_what_if
    from anatomy.analysis.profile.api import parse_weights, run_session
    from anatomy.figures import image_format

    from anatomy.kv_format import parse_kv_dtype

    model = model_of(args)
    weights = parse_weights(args.weights, option="--weights")
    kv_dtype = parse_kv_dtype(args.kv_dtype, option="--kv-dtype")
    sweeps = [parse_sweep(s) for s in args.sweep]
    what_ifs = [parse_what_if(w) for w in args.what_if]
    if args.plot:
        image_format(args.plot, option="--plot")
    if args.html:
        from anatomy.analysis.page import check_output_path

        check_output_path(args.html)  # before the work: a bad path fails fast
    hardware = get_hardware(args.hardware) if args.hardware else None
    options = ProfileOptions(batch=args.batch_size, prompt_len=args.prompt_len, context=args.context,
                             new_tokens=args.new_tokens, kv_dtype=kv_dtype)
    layout = layout_of(args)
    if layout.world > 1:
        return run_parallel(args, layout, options, weights)
    report = run_session(model, weights=weights, options=options, sweeps=sweeps, what_ifs=what_ifs,
                         hardware=hardware, name=model)
    return show(report, args)


def run_parallel(args: argparse.Namespace, layout, options, weights: str) -> int:
    """Rank 0 profiles its shard while the others follow: the collectives' time at its own position."""
    if not launched():
        refused = [o for o, v in (("--sweep", args.sweep), ("--what-if", args.what_if), ("--hardware", args.hardware))
                   if v]
        if refused:
            raise InputError(f"{refused[0]} does not run with --tensor-parallel-size / --pipeline-parallel-size yet")
        check_parallel(args, layout)
        return start_ranks(args, layout)
    from anatomy.analysis.profile.api import load_model, weights_label
    from anatomy.analysis.profile.measure import measure

    def load():
        import torch

        torch.manual_seed(0)  # a preset's random weights: the same on every rank
        return load_model(args.model, weights)

    with rank_engine(args, layout, load=load) as engine:
        if engine is None:
            return 0
        report = measure(engine.shard, options=options, name=args.model, engine=engine,
                         config=engine.shard.shape_config)
        report["options"]["weights"] = weights_label(engine.shard)
        report["sweep"], report["what_if"] = [], []
        report["parallel"] = {"tensor_parallel": layout.tp, "pipeline_parallel": layout.pp, "profiled_rank": 0}
        return show(report, args)


def show(report: dict, args: argparse.Namespace) -> int:
    """The report printed (and plotted, paged) as the options ask."""
    if args.plot:
        from anatomy.analysis.profile.plot import save_profile_plot

        save_profile_plot(report, args.plot)
    if args.html:
        from anatomy.analysis.page import write_page
        from anatomy.analysis.page.profile import profile_page

        write_page(profile_page(report), args.html)
        print(f"wrote {args.html}", file=sys.stderr)
    from anatomy.analysis.profile import render as profile_render

    print_report(report, args, profile_render, width=220)
    return 0
