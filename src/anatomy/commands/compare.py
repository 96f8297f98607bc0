"""`anatomy compare A B ...`: the headline figures of several models side by side."""

from __future__ import annotations

import argparse
import json
import sys

from anatomy.commands.common import MODEL_FORMS, forms_text
from anatomy.commands.inspect import add_size_options, options_from_args, resolve_config

# (label, path into the report, formatter name)
ROWS = (
    ("architecture", ("model", "architecture"), "str"),
    ("parameters", ("params", "total"), "count"),
    ("per layer", ("params", "per_layer"), "count"),
    ("12*L*D^2", ("params", "approx_12ld2"), "count"),
    ("forward FLOPs [B, S]", ("flops", "forward"), "si"),
    ("forward FLOPs per token", ("flops", "forward_per_token"), "si"),
    ("training FLOPs per token", ("flops", "training_per_token"), "si"),
    ("weights", ("memory", "weights_bytes"), "bytes"),
    ("KV cache per token", ("memory", "kv_cache_bytes_per_token"), "bytes"),
    ("KV cache at (B, T)", ("memory", "kv_cache_bytes"), "bytes"),
    ("prefill bound", ("roofline", "prefill", "bound"), "str"),
    ("prefill tok/s bound", ("roofline", "prefill", "tokens_per_s"), "rate"),
    ("decode bound", ("roofline", "decode", "bound"), "str"),
    ("decode tok/s bound", ("roofline", "decode", "tokens_per_s"), "rate"),
    ("decode compute-bound from batch", ("roofline", "decode_compute_bound_batch"), "str"),
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="several models side by side (parameters, FLOPs, memory, roofline)")
    p.add_argument("models", nargs="+", metavar="MODEL", help=f"each {forms_text(MODEL_FORMS)}")
    add_size_options(p)
    p.add_argument("--json", action="store_true", help="print {model: report-without-trace} as JSON")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    p.add_argument("--html", metavar="FILE.html", help="write the models side by side as one self-contained page")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from anatomy.analysis.hardware import get_hardware
    from anatomy.analysis.tables import TableSpec
    from anatomy.analysis.report import build_report

    configs = [(name, resolve_config(name)) for name in args.models]
    if args.html:
        from anatomy.analysis.page import check_output_path

        check_output_path(args.html)  # before the work: a bad path fails fast
    hardware = get_hardware(args.hardware)
    reports = {}
    for name, config in configs:
        report = build_report(config, name=name, options=options_from_args(args, config), hardware=hardware)
        report.pop("trace")
        reports[name] = report
    if args.html:
        from anatomy.analysis.page import compare_page, write_page

        write_page(compare_page(reports), args.html)
        print(f"wrote {args.html}", file=sys.stderr)
    if args.json:
        print(json.dumps(reports, indent=2))
        return 0
    spec = TableSpec(f"anatomy compare on {hardware.name}", ["", *reports],
                     [[label, *(_format(_get(r, path), kind) for r in reports.values())] for label, path, kind in ROWS])
    _print(spec, markdown=args.markdown)
    return 0


_MISSING = object()


def _get(report: dict, path: tuple[str, ...]):
    for key in path:
        if not isinstance(report, dict) or key not in report:
            return _MISSING
        report = report[key]
    return report


def _format(value, kind: str) -> str:
    from anatomy.analysis import render

    if value is _MISSING:
        return "-"  # not applicable (an encoder has no decode step)
    if value is None:
        return "never"
    formatters = {"count": render.count, "si": lambda v: render.si(v, "FLOP"), "bytes": render.nbytes,
                  "rate": lambda v: f"{v:,.1f}", "str": str}
    return formatters[kind](value)


def _print(spec, *, markdown: bool) -> None:
    if markdown:
        lines = ["| " + " | ".join(spec.columns) + " |", "|" + "---|" * len(spec.columns)]
        lines += ["| " + " | ".join(row) + " |" for row in spec.rows]
        print("\n".join(lines))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=spec.title, title_justify="left")
    for column in spec.columns:
        table.add_column(column)
    for row in spec.rows:
        table.add_row(*row)
    Console(width=None if sys.stdout.isatty() else 200).print(table)
