"""The `anatomy` command. Each subcommand lives in anatomy/commands/<name>.py and provides
`add_parser(subparsers)` and `run(args) -> int`; this file only dispatches and turns the
project's errors into one-line messages with exit code 2 (never a traceback)."""

from __future__ import annotations

import argparse
import importlib
import sys

from anatomy.errors import AnatomyError

COMMANDS = ("generate", "chat", "embed", "inspect", "compare", "train", "plot", "presets")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="anatomy",
        description="Run, inspect and train Transformers: every shape, parameter, FLOP and byte.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        module = _command_module(name)
        if module is not None:
            module.add_parser(sub)
    return parser


def _command_module(name: str):
    try:
        return importlib.import_module(f"anatomy.commands.{name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"anatomy.commands.{name}":
            return None
        raise


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except (AnatomyError, ValueError, FileNotFoundError, UnicodeDecodeError) as exc:
        print(f"anatomy {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
