"""`anatomy perplexity --file TEXT`: how well the decode step `anatomy generate` runs predicts a text.

    anatomy perplexity --file tests/data/english.txt               # the whole text, one sequence
    anatomy perplexity --file wiki.test.raw --ctx 512 --json       # llama-perplexity's chunks

Perplexity, the mean KL divergence from fp32 inference on the same file's dequantized weights and
the share of positions whose most likely token is fp32's, each token fed through the engine's
decode step (anatomy/inference/perplexity.py says which positions each mode scores).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from anatomy import dtypes
from anatomy.commands.common import DefaultsHelpFormatter, add_kv_dtype_option, add_model_option, add_quiet_option
from anatomy.commands.generate import DEFAULT_MODEL, WEIGHTS_HELP
from anatomy.errors import InputError
from anatomy.kv_format import parse_kv_dtype


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "perplexity", help="perplexity, KL divergence and top-1 agreement against fp32 over a text",
        description="Feed a text token by token through the decode step `anatomy generate` runs and report its "
                    "perplexity, the mean KL divergence from fp32 inference on the same file's dequantized weights, "
                    "and the share of positions whose most likely token is fp32's.",
        formatter_class=DefaultsHelpFormatter)
    p.add_argument("--file", required=True, metavar="TEXT", help="the text to score (UTF-8)")
    p.add_argument("--ctx", type=int, default=None, metavar="N",
                   help="score as llama-perplexity -c N does: independent chunks of N tokens, the predictions of "
                        "each one's second half (default: the whole text as one sequence, every prediction)")
    p.add_argument("--max-tokens", type=int, default=None, metavar="N", help="score only the text's first N tokens")
    p.add_argument("--json", action="store_true",
                   help="print the figures as JSON (perplexity, kl_divergence, top1_agreement, ...)")
    add_model_option(p, forms=("installed", "gguf", "hf"), default=DEFAULT_MODEL)
    p.add_argument("--weights", default="auto", help=WEIGHTS_HELP)
    p.add_argument("--dtype", default="f32", help=f"dtype of the model's other tensors: {', '.join(dtypes.FLOATS)}")
    add_kv_dtype_option(p)
    add_quiet_option(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from anatomy import progress
    from anatomy.inference.loading import load_named
    from anatomy.inference.perplexity import perplexity

    check_options(args)
    text = read_text(Path(args.file))
    with progress.task(f"loading {args.model}"):
        named = load_named(args.model, args.dtype, args.weights)
        reference = load_named(args.model, "f32", "f32").model  # the same model when that is what was asked for
        engine = named.engine(kv_dtype=args.kv_dtype)
    ids, bos = tokens_of(named.tokenizer, text, args.max_tokens)
    quality = perplexity(engine, reference, ids, ctx=args.ctx, bos=bos)
    report = {"model": args.model, "weights": args.weights, "file": args.file} | quality.as_dict()
    print(json.dumps(report, indent=2) if args.json else summary(report))
    return 0


def check_options(args: argparse.Namespace) -> None:
    if args.max_tokens is not None and args.max_tokens < 2:
        raise InputError(f"--max-tokens={args.max_tokens}: scoring needs at least 2 tokens")
    if args.ctx is not None and args.ctx < 3:
        raise InputError(f"--ctx={args.ctx}: a chunk needs at least 3 tokens (its second half scored)")
    args.dtype = dtypes.parse(args.dtype, option="--dtype").name
    args.kv_dtype = parse_kv_dtype(args.kv_dtype, option="--kv-dtype")


def read_text(path: Path) -> str:
    if not path.is_file():
        raise InputError(f"--file {path}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"--file {path} is not UTF-8: byte 0x{exc.object[exc.start]:02x} at offset {exc.start}") \
            from None
    if not text.strip():
        raise InputError(f"--file {path} is empty: no text to score")
    return text


def tokens_of(tokenizer, text: str, max_tokens: int | None) -> tuple[list[int], int | None]:
    """(the text's ids, up to max_tokens; the BOS id where the tokenizer puts one first, else None)."""
    ids = tokenizer.encode(text)
    plain = tokenizer.encode(text, add_special_tokens=False)
    bos = ids[0] if len(ids) > len(plain) and ids[0] == tokenizer.bos_id else None
    return ids[:max_tokens] if max_tokens is not None else ids, bos


def summary(r: dict) -> str:
    scored = "the whole text" if r["ctx"] is None else \
        f"{r['chunks']} chunks of {r['ctx']} tokens, each one's second half"
    return "\n".join([
        f"{r['model']} (weights {r['weights']}) on {r['file']}: {r['tokens']:,} predictions scored ({scored})",
        f"perplexity       {r['perplexity']:.4f}  (fp32 on the same weights: {r['reference_perplexity']:.4f})",
        f"KL divergence    {r['kl_divergence']:.6f}  (mean KL(fp32 || this) in nats)",
        f"top-1 agreement  {r['top1_agreement']:.2%}  (positions whose most likely token is fp32's)",
    ])
