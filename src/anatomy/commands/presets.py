"""`anatomy presets`: the named configurations and their exact parameter counts."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.table import Table

from anatomy.analysis.params import parameter_ledger
from anatomy.models import build_model
from anatomy.presets import get_preset, preset_names


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("presets", help="list the named model configurations with their parameter counts")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    table = Table(title="anatomy presets (parameters counted on the meta device)")
    for column in ("preset", "architecture", "L", "D", "H", "H_kv", "F", "V", "norm", "ffn", "position", "parameters"):
        table.add_column(column, justify="right" if column in "L D H H_kv F V parameters" else "left")
    for name in preset_names():
        c = get_preset(name)
        n = sum(p.numel() for p in build_model(c, device="meta").parameters())
        layers = f"{c.n_layers}+{c.n_decoder_layers}" if c.is_seq2seq else str(c.n_layers)
        ffn = f"{c.ffn}, {c.n_experts_per_token} of {c.n_experts} experts" if c.n_experts else c.ffn
        count = f"{n:,} ({parameter_ledger(c).active:,} active)" if c.n_experts else f"{n:,}"
        table.add_row(name, c.architecture, layers, str(c.d_model), str(c.n_heads), str(c.n_kv_heads),
                      str(c.d_ff), str(c.vocab_size), f"{c.norm_position}-{c.norm}", ffn, c.position, count)
    Console(width=None if sys.stdout.isatty() else 200).print(table)
    return 0
