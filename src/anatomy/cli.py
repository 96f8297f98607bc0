"""The `anatomy` command. Each subcommand lives in anatomy/commands/<name>.py and provides
`add_parser(subparsers)` and `run(args) -> int`; this file only dispatches and keeps the error
contract (warnings are one line on stderr each):

    bad input (AnatomyError, OSError, a command line argparse rejects)   one line on stderr, exit 2
    a lost rank of a parallel run (ParallelError)                        one line on stderr, exit 1
    Ctrl-C                                                               exit 130
    anything else: a bug in anatomy                    the traceback and a request to report it, exit 1
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
import warnings

from anatomy import __version__
from anatomy.deprecation import AnatomyDeprecationWarning
from anatomy.errors import AnatomyError, ParallelError

# Each command's one-line summary: `anatomy --help` lists them without importing any command, and
# a run imports only the module of the command it runs (training pulls in torch.distributed).
COMMANDS = {
    "generate": "generate text from a prompt (streams to stdout)",
    "chat": "chat with a model interactively (history, /reset, /exit)",
    "perplexity": "perplexity, KL divergence and top-1 agreement against fp32 over a text, through the decode step",
    "embed": "sentence embeddings (all-MiniLM-L6-v2 by default), with --similarity the cosine matrix",
    "inspect": "shapes, parameters, FLOPs, memory, roofline and training time of a model",
    "compare": "several models side by side (parameters, FLOPs, memory, roofline)",
    "attention": "attention weights of a real model over a text: heatmaps per layer and head",
    "profile": "run a model under the profiler: time per op and per position of the decoder's map, against "
               "this machine's roofs",
    "train": "train or fine-tune a model (causal LM, masked LM, seq2seq)",
    "plot": "draw the training and validation loss curves of runs to a PNG",
    "presets": "list the named model configurations with their parameter counts",
    "serve": "serve a model over the OpenAI and Anthropic APIs (continuous batching, paged KV cache)",
    "bench-serve": "load-test an OpenAI-compatible server: throughput, TTFT, TPOT, latency percentiles",
    "doctor": "what this installation runs (torch, native kernels, plans, models) and the command that fixes "
              "what is missing",
}


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors (a missing argument, a bad number) are one line too.
    `commands` maps the top-level parser's command names to their parsers."""

    commands: dict[str, argparse.ArgumentParser] = {}

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the options)\n")


def build_parser(argv: list[str] | None = None) -> Parser:
    """The full parser of the command named in argv; the other commands are listed by summary."""
    parser = Parser(
        prog="anatomy",
        description="Run, inspect and train Transformers: every shape, parameter, FLOP and byte.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    parser.commands = sub.choices
    chosen = _command_of(argv)
    for name, summary in COMMANDS.items():
        if name == chosen:
            importlib.import_module(f"anatomy.commands.{name.replace('-', '_')}").add_parser(sub)
        else:
            sub.add_parser(name, help=summary, add_help=False)
    return parser


def parse(parser: Parser, argv: list[str] | None) -> argparse.Namespace:
    """parse_args, with arguments no option takes reported by the command they were given to."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _command_of(argv: list[str] | None) -> str | None:
    return next((a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("default", AnatomyDeprecationWarning)  # Python hides DeprecationWarnings by default
        warnings.showwarning = _one_line_warning(_command_of(argv))
        try:
            args = parse(build_parser(argv), argv)
        except SystemExit as exc:  # --help, or a command line argparse refused (one line: Parser.error)
            return int(exc.code or 0)
        args.argv = list(sys.argv[1:] if argv is None else argv)  # a parallel run starts its ranks with it
        return _run(args)


def _one_line_warning(command: str | None):
    prefix = f"anatomy {command}" if command in COMMANDS else "anatomy"

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        print(f"{prefix}: warning: {message}", file=sys.stderr, flush=True)

    return show


def _run(args: argparse.Namespace) -> int:
    from anatomy import progress

    try:
        with progress.quieted(getattr(args, "quiet", False)):  # --quiet of the commands with long work
            return int(args.run(args) or 0)
    except ParallelError as exc:
        print(f"anatomy {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except AnatomyError as exc:
        print(f"anatomy {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as exc:
        if exc.filename is None:  # not a path the user named: a bug
            return _bug(args.command)
        print(f"anatomy {args.command}: error: {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except Exception:
        return _bug(args.command)


def _bug(command: str) -> int:
    traceback.print_exc()
    print(f"anatomy {command}: internal error: this is a bug in anatomy, not a problem with your input; please "
          f"report it with the command line and the traceback above (anatomy {__version__})", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
