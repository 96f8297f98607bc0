"""The `anatomy` command. Each subcommand lives in anatomy/commands/<name>.py and provides
`add_parser(subparsers)` and `run(args) -> int`; this file only dispatches and keeps the error
contract:

    bad input (an AnatomyError) or a file the OS refuses   one line on stderr, exit 2
    Ctrl-C                                                 exit 130
    anything else: a bug in anatomy                        the traceback and a request to report it, exit 1
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback

from anatomy import __version__
from anatomy.errors import AnatomyError

# Each command's one-line summary: `anatomy --help` lists them without importing any command, and
# a run imports only the module of the command it runs (training pulls in torch.distributed).
COMMANDS = {
    "generate": "generate text from a prompt (streams to stdout)",
    "chat": "chat with a model interactively (history, /reset, /exit)",
    "embed": "sentence embeddings (all-MiniLM-L6-v2 by default), with --similarity the cosine matrix",
    "inspect": "shapes, parameters, FLOPs, memory, roofline and training time of a model",
    "compare": "several models side by side (parameters, FLOPs, memory, roofline)",
    "train": "train or fine-tune a model (causal LM, masked LM, seq2seq)",
    "plot": "draw the training and validation loss curves of runs to a PNG",
    "presets": "list the named model configurations with their parameter counts",
    "serve": "serve a model over the OpenAI API (continuous batching, paged KV cache)",
    "bench-serve": "load-test an OpenAI-compatible server: throughput, TTFT, TPOT, latency percentiles",
}


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The full parser of the command named in argv; the other commands are listed by summary."""
    parser = argparse.ArgumentParser(
        prog="anatomy",
        description="Run, inspect and train Transformers: every shape, parameter, FLOP and byte.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = next((a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")), None)
    for name, summary in COMMANDS.items():
        if name == chosen:
            importlib.import_module(f"anatomy.commands.{name.replace('-', '_')}").add_parser(sub)
        else:
            sub.add_parser(name, help=summary, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser(argv).parse_args(argv)
    try:
        return int(args.run(args) or 0)
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
