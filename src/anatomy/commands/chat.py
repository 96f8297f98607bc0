"""`anatomy chat`: an interactive conversation with a chat model.

Each turn re-renders the whole history through the model's chat template and streams the reply.
Commands: /reset forgets the history, /exit (or Ctrl-D) leaves; Ctrl-C stops a reply being
generated (what was shown stays in the history) and returns to the prompt.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from anatomy.commands.generate import (
    add_model_options, add_sampling_options, check_options, load, print_stats, start)
from anatomy.commands.common import DefaultsHelpFormatter, not_utf8
from anatomy.commands.speculative_options import (
    add_speculative_options, check_speculative_options, speculative_options)
from anatomy.errors import InputError

HELP = "commands: /reset forgets the conversation, /exit leaves (or Ctrl-D); Ctrl-C stops a reply"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="chat with a model interactively (history, /reset, /exit)",
                       description="An interactive chat. " + HELP + ".",
                       formatter_class=DefaultsHelpFormatter)
    p.add_argument("--system", default=None, help="a system message that starts every conversation")
    add_model_options(p)
    add_sampling_options(p, max_new_tokens=512)
    add_speculative_options(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    check_options(args)
    check_speculative_options(args)
    model, tokenizer = load(args)
    if tokenizer.chat_template is None:
        raise InputError(f"{args.model} has no chat template: use `anatomy generate --raw` for plain text")
    speculative = speculative_options(args, tokenizer)  # a draft is loaded once, for every reply
    interactive = sys.stdin.isatty()
    if interactive:
        print(f"anatomy chat with {args.model}. {HELP}.", file=sys.stderr)
    history: list[dict[str, str]] = []
    while (line := _read(interactive)) is not None:
        text = line.strip()
        if text in ("/exit", "/quit"):
            break
        if text == "/reset":
            history.clear()
            print("[conversation reset]", file=sys.stderr)
        elif text.startswith("/"):
            print(f"unknown command {text!r}; {HELP}", file=sys.stderr)
        elif text:
            history.append({"role": "user", "content": text})
            reply = _reply(model, tokenizer, history, args, speculative)
            if reply is None:
                history.pop()
            else:
                history.append({"role": "assistant", "content": reply})
    return 0


def _read(interactive: bool) -> str | None:
    """The next line of input; None at end of input. Ctrl-C at the prompt gives an empty line."""
    try:
        return input("> " if interactive else "")
    except EOFError:
        return None
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return ""
    except UnicodeDecodeError as exc:
        raise not_utf8(exc) from None


def _reply(model, tokenizer, history: list[dict[str, str]], args: argparse.Namespace,
           speculative: dict | None = None) -> str | None:
    """Stream the assistant's answer to the conversation so far; Ctrl-C cuts it short. None when
    the conversation cannot be answered (it no longer fits the context)."""
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + history
    shown = []
    try:
        with _ctrl_c() as pressed:
            gen = start(model, tokenizer, messages, args, speculative)
            for _, delta in gen.deltas():
                shown.append(delta)
                sys.stdout.write(delta)
                sys.stdout.flush()
                if pressed.is_set():  # its KeyboardInterrupt was raised where something swallowed it
                    raise KeyboardInterrupt
    except KeyboardInterrupt:
        print(" [stopped]", file=sys.stderr, flush=True)
        return "".join(shown)
    except InputError as exc:  # e.g. the conversation outgrew the context: say so, keep chatting
        print(f"anatomy chat: error: {exc} (/reset starts over)", file=sys.stderr)
        return None
    sys.stdout.write("\n")
    sys.stdout.flush()
    if args.stats:
        print_stats(gen)
    return "".join(shown)


@contextmanager
def _ctrl_c() -> Iterator[threading.Event]:
    """While a reply streams: Ctrl-C raises KeyboardInterrupt as always, and also sets the event the
    reply checks after each token, so that a KeyboardInterrupt raised inside code that swallows it
    still stops the reply at its next token. (About one reply in 50 in the tests went on after its
    Ctrl-C; which code lost the interrupt was not found.)"""
    pressed = threading.Event()
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        yield pressed  # signals go to the main thread only; an ignored Ctrl-C stays ignored
        return

    def handler(signum, frame):
        pressed.set()
        signal.default_int_handler(signum, frame)

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, previous)
