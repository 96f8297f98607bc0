"""What several commands share: old option spellings kept for a release, reading stdin, and the
--help formatter of `anatomy generate` and `anatomy chat` (DefaultsHelpFormatter).

    add_old_name(p, "--batch", new="--batch-size", dest="batch_size", type=int)

An old name is hidden from --help; using it stores into the new option and warns (cli.py shows
the warning as `anatomy inspect: warning: --batch is deprecated, use --batch-size`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

from anatomy.deprecation import deprecated
from anatomy.errors import InputError


class _OldName(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str, *, new: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        deprecated(f"{option_string} is deprecated, use {self.new}")
        setattr(namespace, self.dest, values)


def add_old_name(p: argparse.ArgumentParser, old: str, *, new: str, dest: str,
                 type: Callable[[str], Any] | None = None) -> None:
    """Accept `old` as a deprecated spelling of the option `new` (which stores into `dest`)."""
    p.add_argument(old, dest=dest, type=type, action=_OldName, new=new, default=argparse.SUPPRESS,
                   help=argparse.SUPPRESS)


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help with each option's default, except a default of None (the help says what happens then)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.default is None else super()._get_help_string(action)


def read_stdin() -> str:
    """All of stdin as text; bytes that are not UTF-8 are an InputError naming the first one."""
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise not_utf8(exc) from None


def not_utf8(exc: UnicodeDecodeError) -> InputError:
    return InputError(f"stdin is not valid UTF-8: byte 0x{exc.object[exc.start]:02x} at offset {exc.start}")
