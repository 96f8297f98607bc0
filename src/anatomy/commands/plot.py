"""`anatomy plot RUN_DIR [RUN_DIR ...] -o loss.png`: the loss curves of training runs."""

from __future__ import annotations

import argparse
from pathlib import Path

from anatomy.training.plot import plot_losses


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="draw the training and validation loss curves of runs to a PNG")
    p.add_argument("runs", nargs="+", type=Path, help="run directories of `anatomy train` (holding metrics.jsonl)")
    p.add_argument("-o", "--output", type=Path, default=Path("loss.png"), help="PNG file to write")
    p.add_argument("--smooth", type=int, default=20, help="moving-average window over training steps")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    print(plot_losses(args.runs, args.output, smooth=args.smooth))
    return 0
