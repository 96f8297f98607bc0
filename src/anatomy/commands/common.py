"""What several commands share: the --model option, old option spellings kept for a release,
reading stdin, and the --help formatter that shows defaults (DefaultsHelpFormatter).

    add_model_option(p, forms=("installed", "gguf", "hf"), default="smollm2-135m-instruct")
    add_model_option(p, forms=MODEL_FORMS, old_positional=True)    # also `anatomy inspect MODEL`
    name = model_of(args)                                          # --model, the old MODEL, or the default
    add_old_name(p, "--batch", new="--batch-size", dest="batch_size", type=int)

What each form of a model is, and which hold weights, is decided in anatomy/checkpoints/source.py.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

from anatomy.deprecation import deprecated
from anatomy.errors import InputError


# the ways to name a model, in the order --help lists them
MODEL_FORMS = {
    "preset": "a preset name",
    "config": "an HF config.json or its directory",
    "hf": "an HF model directory",
    "gguf": "a .gguf file",
    "installed": "an installed model name",
}


def add_model_option(p: argparse.ArgumentParser, *, forms, default: str | None = None, note: str = "",
                     old_positional: bool = False) -> None:
    """--model, its help naming the `forms` (keys of MODEL_FORMS) the command takes; with
    `old_positional` also the positional MODEL of an earlier release, hidden and deprecated (read
    the model with model_of(args) then)."""
    text = forms_text(forms)
    if not old_positional:  # "%(default)" in the help: a formatter that shows defaults does not add it again
        shown = " (default: %(default)s)" if default is not None else ""
        p.add_argument("--model", default=default, help=f"{text}{note}{shown}")
        return
    shown = f" (default: {default})" if default is not None else ""
    p.add_argument("--model", default=None, help=f"{text}{note}{shown}")
    p.add_argument("old_model", nargs="?", default=None, metavar="MODEL", help=argparse.SUPPRESS)
    p.set_defaults(default_model=default)


def forms_text(forms) -> str:
    """The forms (keys of MODEL_FORMS) as one phrase: 'a preset name, a .gguf file or an installed model name'."""
    named = [MODEL_FORMS[f] for f in MODEL_FORMS if f in forms]
    return ", ".join(named[:-1]) + f" or {named[-1]}" if len(named) > 1 else named[0]


def model_of(args: argparse.Namespace) -> str:
    """The model of a command with add_model_option(old_positional=True): --model, else the
    deprecated positional MODEL (one warning line), else the default; InputError for two or none."""
    old, given = getattr(args, "old_model", None), args.model
    if old is not None:
        if given is not None:
            raise InputError(f"two models: --model {given} and {old}; give one, as --model")
        deprecated(f"`anatomy {args.command} {old}` is deprecated, use `anatomy {args.command} --model {old}`")
        given = old
    given = given if given is not None else getattr(args, "default_model", None)
    if given is None:
        raise InputError(f"no model to {args.command}: give one with --model (a preset, config.json, .gguf or model name)")
    args.model = given
    return given


class _OldName(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str, *, new: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        deprecated(f"{option_string} is deprecated, use {self.new}")
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


def add_old_name(p: argparse.ArgumentParser, old: str, *, new: str, dest: str,
                 type: Callable[[str], Any] | None = None, flag: bool = False) -> None:
    """Accept `old` as a deprecated spelling of the option `new` (which stores into `dest`); a
    `flag` takes no value and stores True. `old` is hidden from --help; using it warns (cli.py shows
    `anatomy inspect: warning: --batch is deprecated, use --batch-size`)."""
    extra = {"nargs": 0, "const": True} if flag else {"type": type}
    p.add_argument(old, dest=dest, action=_OldName, new=new, default=argparse.SUPPRESS, help=argparse.SUPPRESS,
                   **extra)


def add_quiet_option(p: argparse.ArgumentParser) -> None:
    """--quiet of a command with long work (anatomy/progress.py; cli.py applies it)."""
    p.add_argument("--quiet", action="store_true",
                   help="no progress display on stderr (there is none when stderr is not a terminal either)")


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help with each option's default, except a default of None (the help says what happens then)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.default is None else super()._get_help_string(action)


def add_kv_dtype_option(p: argparse.ArgumentParser) -> None:
    from anatomy import kv_format

    p.add_argument("--kv-dtype", default=None,
                   help=f"what the KV cache holds: {', '.join(kv_format.available())} (int8 and fp8: 8-bit codes with a "
                        "scale per token and head, half of bf16's bytes; default: the dtype the branches compute in)")


def add_backend_option(p: argparse.ArgumentParser) -> None:
    from anatomy.inference.engine.backend import NAMES

    p.add_argument("--backend", choices=NAMES, default=None,
                   help="the operators the engine runs: cpu (the measured kernel plan, native operators, captured "
                        "steps) or torch (torch's own, what a GPU runs); default: the device's")


def add_report_options(p: argparse.ArgumentParser, *, docs: str, plot: str, html: str) -> None:
    """--json, --markdown, --plot FILE.png and --html FILE.html of a command that prints a report."""
    p.add_argument("--json", action="store_true", help=f"print the report as JSON (keys in {docs})")
    p.add_argument("--markdown", action="store_true", help="print the report as Markdown")
    p.add_argument("--plot", metavar="FILE.png", help=f"write {plot}")
    p.add_argument("--html", metavar="FILE.html", help=f"write the report as one self-contained page ({html})")


def print_report(report: dict, args: argparse.Namespace, renderer: Any, *, width: int = 200) -> None:
    """The report on stdout as --json, --markdown or rich tables; `renderer` has markdown(report) and
    print_rich(report, width=...)."""
    import json

    if args.json:
        print(json.dumps(report, indent=2))
    elif args.markdown:
        print(renderer.markdown(report))
    else:
        renderer.print_rich(report, width=None if sys.stdout.isatty() else width)


def read_stdin() -> str:
    """All of stdin as text; bytes that are not UTF-8 are an InputError naming the first one."""
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise not_utf8(exc) from None


def not_utf8(exc: UnicodeDecodeError) -> InputError:
    return InputError(f"stdin is not valid UTF-8: byte 0x{exc.object[exc.start]:02x} at offset {exc.start}")
