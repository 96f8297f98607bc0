"""`anatomy attention "text"`: run a real model on a text and show its attention weights over the
tokens, per layer and head, as a page (--html), a PNG (--png) or, in the terminal, what each
token attends to most in one layer and head.

    anatomy attention "The cat sat on the mat." --html attention.html
    anatomy attention --model all-minilm-l6-v2 "A man is eating food." --layer 3 --head 5 --png map.png
    anatomy attention --model ./marian-dir "5 17 42" --target "1 9 9"     (ids: a model without a tokenizer)
"""

from __future__ import annotations

import argparse
import sys

from anatomy.analysis.attention_maps import MAX_TOKENS, TARGET_TOKENS
from anatomy.commands.common import add_quiet_option, forms_text
from anatomy.commands.generate import DEFAULT_MODEL
from anatomy.errors import InputError

TOP = 3  # key tokens listed per query token in the terminal


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "attention", help="attention weights of a real model over a text: heatmaps per layer and head",
        description="Run a model on a text and show which token attends to which, per layer and head "
                    "(the weights of the model's eager attention path). `anatomy attention MODEL TEXT` works too.")
    p.add_argument("args", nargs="+", metavar="TEXT", help="the text (token ids separated by spaces for a model "
                   "without a tokenizer); or MODEL TEXT")
    p.add_argument("--model", default=None, help=f"{forms_text(('installed', 'gguf', 'hf'))} (default: {DEFAULT_MODEL})")
    p.add_argument("--layer", type=int, default=None, help="only this layer (0-based; default: all)")
    p.add_argument("--head", type=int, default=None, help="only this head (0-based; default: all)")
    p.add_argument("--target", default=None, help="encoder-decoder: the decoder's input text (default: the "
                   f"model's own greedy output, up to {TARGET_TOKENS} tokens)")
    p.add_argument("--truncate", action="store_true", help="keep the first tokens of a text that is too long "
                   "instead of stopping with an error")
    p.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help=f"the most tokens drawn (default "
                   f"{MAX_TOKENS}; a page stores layers x heads x tokens^2 weights)")
    add_quiet_option(p)
    out = p.add_mutually_exclusive_group()
    out.add_argument("--html", metavar="FILE.html", help="write the maps as one self-contained page")
    out.add_argument("--png", metavar="FILE.png", help="write the grid and the enlarged map as a PNG")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from anatomy.analysis.attention_maps import (attention, check_layer_head, context_limit, fit_tokens,
                                                  load_with_tokenizer, token_ids)
    from anatomy.analysis.page import check_output_path
    from anatomy.checkpoints.loader import load_config
    from anatomy.inference.loading import checkpoint_of

    model_name, text = _model_and_text(args)
    checkpoint_of(model_name, "drawing attention maps")  # a preset or a config without weights: refused before any work
    if args.html:
        check_output_path(args.html, option="--html")
    if args.png:
        check_output_path(args.png, option="--png")
    config = load_config(model_name)  # no weights yet: the cheap checks first
    check_layer_head(config, args.layer, args.head)
    limit, why = context_limit(config, args.max_tokens, option="--max-tokens ")
    model, tokenizer = load_with_tokenizer(model_name)
    ids = token_ids(text, tokenizer, config, what="text")
    fit_tokens(ids, limit, why, truncate=args.truncate, what="text", option="--truncate")
    if args.target is not None:
        if not config.is_seq2seq:
            raise InputError("--target is for an encoder-decoder model; this one is a "
                             f"{config.architecture}")
        start = 0  # a stand-in: the decoder's input is its start token, then the target
        fit_tokens([start, *token_ids(args.target, tokenizer, config, what="target")], limit, why,
                   truncate=args.truncate, what="target", option="--truncate")
    maps = attention(model, text, tokenizer=tokenizer, target=args.target, layer=args.layer, head=args.head,
                     truncate=args.truncate, max_tokens=args.max_tokens, name=model_name)
    if args.html:
        maps.save_html(args.html, option="--html")
        print(f"wrote {args.html}", file=sys.stderr)
    elif args.png:
        maps.save_png(args.png, option="--png")
        print(f"wrote {args.png}", file=sys.stderr)
    else:
        _print(maps)
    return 0


def _model_and_text(args: argparse.Namespace) -> tuple[str, str]:
    if len(args.args) > 2:
        raise InputError(f"expected TEXT or MODEL TEXT, got {len(args.args)} arguments (quote the text)")
    if len(args.args) == 2:
        if args.model is not None:
            raise InputError("the model is given twice: as MODEL and as --model")
        return args.args[0], args.args[1]
    return args.model or DEFAULT_MODEL, args.args[0]


def _print(maps) -> None:
    """For the focused layer and head of each group: each query token's most attended tokens."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 120)
    layer, head = maps.focus
    for g in maps.groups:
        li = g.layers.index(layer) if layer in g.layers else 0
        hi = g.heads.index(head) if head in g.heads else 0
        table = Table(title=f"{maps.model}: {g.name}, layer {g.layers[li]}, head {g.heads[hi]} "
                            f"({len(g.queries)} x {len(g.keys)} tokens)", title_justify="left")
        table.add_column("#", justify="right")
        table.add_column("token")
        table.add_column(f"attends most to (top {TOP})")
        weights = g.weights[li, hi]  # [S_q, S_k]
        for i, token in enumerate(g.queries):
            top = weights[i].topk(min(TOP, weights.shape[1]))
            cells = [f"{_show(g.keys[j])} ({j}) {w:.3f}" for w, j in zip(top.values.tolist(), top.indices.tolist())
                     if w > 0]  # masked (future) keys have weight 0
            table.add_row(str(i), _show(token), ", ".join(cells))
        console.print(table)
    console.print("--html FILE or --png FILE draws every layer and head", style="dim")


def _show(token: str) -> str:
    text = token.replace("\n", "⏎").replace("\t", "⇥")
    return repr(text) if text != text.strip() or not text else text
