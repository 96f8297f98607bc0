"""`anatomy embed`: sentence embeddings of texts, and their cosine similarity matrix.

    anatomy embed "A man is eating food." "A man eats bread." --similarity
    printf 'one text per line\\nanother\\n' | anatomy embed --json
"""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table
from torch import Tensor

from anatomy.commands.common import add_model_option, add_quiet_option, read_stdin
from anatomy.errors import InputError
from anatomy.inference.embed import DEFAULT_MODEL

PREVIEW = 3  # numbers shown at each end of a vector


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "embed", help="sentence embeddings (all-MiniLM-L6-v2 by default), with --similarity the cosine matrix",
        description="Embed texts with an encoder: mean pooling over the tokens, L2-normalised. "
                    "With no texts (or '-'), reads one text per line from stdin.")
    p.add_argument("texts", nargs="*", metavar="TEXT", help="texts to embed; '-' or none: read lines from stdin")
    add_model_option(p, forms=("installed", "hf"), default=DEFAULT_MODEL, note=" (an encoder)")
    p.add_argument("--similarity", action="store_true", help="also print the cosine similarity matrix")
    p.add_argument("--json", action="store_true", help="print every vector in full as JSON")
    p.add_argument("--batch-size", type=int, default=32, help="texts per forward pass (default: 32)")
    add_quiet_option(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from anatomy import progress
    from anatomy.inference.embed import embed, load_embedder

    texts = _texts(args.texts)
    with progress.task(f"loading {args.model}"):
        load_embedder(args.model)  # kept by embed() for the call below
    vectors = embed(args.model, texts, batch_size=args.batch_size)  # [N, D]
    similarity = vectors @ vectors.T if args.similarity else None  # [N, N]: rows are unit vectors
    if args.json:
        print(json.dumps(_as_json(args.model, texts, vectors, similarity), ensure_ascii=False))
        return 0
    console = Console(width=None if sys.stdout.isatty() else 120)
    console.print(_vector_table(args.model, texts, vectors))
    if similarity is not None:
        console.print(_similarity_table(texts, similarity))
    return 0


def _texts(given: list[str]) -> list[str]:
    """The command-line texts, or the non-empty lines of stdin for none or '-'."""
    if given and given != ["-"]:
        return given
    texts = [line for line in read_stdin().splitlines() if line.strip()]
    if not texts:
        raise InputError("no texts to embed: give them as arguments or one per line on stdin")
    return texts


def _as_json(model: str, texts: list[str], vectors: Tensor, similarity: Tensor | None) -> dict:
    out = {"model": model, "dimension": vectors.shape[1],
           "embeddings": [{"text": t, "embedding": v} for t, v in zip(texts, vectors.tolist())]}
    if similarity is not None:
        out["similarity"] = similarity.tolist()
    return out


def _vector_table(model: str, texts: list[str], vectors: Tensor) -> Table:
    n, d = vectors.shape
    table = Table(title=f"{n} embedding{'s' * (n != 1)} [{n}, {d}] from {model} (L2-normalised)")
    for column in ("#", "text", "vector"):
        table.add_column(column, justify="right" if column == "#" else "left")
    for i, (text, vector) in enumerate(zip(texts, vectors.tolist())):
        head = ", ".join(f"{x:+.4f}" for x in vector[:PREVIEW])
        tail = ", ".join(f"{x:+.4f}" for x in vector[-PREVIEW:])
        table.add_row(str(i), _short(text), f"[{head}, ..., {tail}]")
    return table


def _similarity_table(texts: list[str], similarity: Tensor) -> Table:
    table = Table(title="cosine similarity")
    table.add_column("#", justify="right")
    table.add_column("text")
    for j in range(len(texts)):
        table.add_column(str(j), justify="right")
    for i, row in enumerate(similarity.tolist()):
        table.add_row(str(i), _short(text=texts[i], width=30), *(f"{x:.3f}" for x in row))
    return table


def _short(text: str, width: int = 40) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 1] + "…"
