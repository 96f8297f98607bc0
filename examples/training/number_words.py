"""A synthetic translation task for the original encoder-decoder Transformer: digits -> English
number words ("40213" -> "forty thousand two hundred thirteen").

    python examples/training/number_words.py make data/numbers.tsv      # 20,000 distinct pairs
    anatomy train --data data/numbers.tsv --model transformer-base ... --out runs/number-words
    python examples/training/number_words.py score runs/number-words data/numbers.tsv   # its latest checkpoint

`anatomy train` holds out the last --val-fraction of the lines (numbers never seen in training);
`score` decodes exactly those with anatomy.generate (greedy, or beam search with --beams) and
prints the exact-match rate.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

ONES = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen " \
       "seventeen eighteen nineteen".split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def words(n: int) -> str:
    """English words of 0 <= n < 1,000,000 (American style, no "and")."""
    if n < 20:
        return ONES[n]
    if n < 100:
        return TENS[n // 10] + ("-" + ONES[n % 10] if n % 10 else "")
    if n < 1000:
        return ONES[n // 100] + " hundred" + (" " + words(n % 100) if n % 100 else "")
    return words(n // 1000) + " thousand" + (" " + words(n % 1000) if n % 1000 else "")


def make(path: Path, *, count: int = 20_000, seed: int = 0) -> None:
    numbers = random.Random(seed).sample(range(100_000), count)  # distinct: held-out lines are unseen
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{n}\t{words(n)}\n" for n in numbers))


def score(checkpoint: Path, data: Path, *, val_fraction: float, beams: int, limit: int) -> float:
    import anatomy
    from anatomy.training.checkpoint import checkpoint_or_latest

    checkpoint = checkpoint_or_latest(checkpoint)
    lines = [line.split("\t") for line in data.read_text().splitlines() if line.strip()]
    held_out = lines[len(lines) - int(len(lines) * val_fraction):][:limit]
    model = anatomy.load(checkpoint)
    tokenizer = anatomy.load_tokenizer(checkpoint)
    results = anatomy.generate(model, [src for src, _ in held_out], tokenizer=tokenizer, max_new_tokens=60,
                               temperature=0.0, num_beams=beams)
    right = sum(r.text.strip() == tgt for r, (_, tgt) in zip(results, held_out))
    for r, (src, tgt) in list(zip(results, held_out))[:5]:
        print(f"{src:>6} -> {r.text.strip()!r}  (expected {tgt!r})")
    print(f"exact match: {right}/{len(held_out)} = {100 * right / len(held_out):.2f}% "
          f"({'greedy' if beams == 1 else f'beam search, {beams} beams'})")
    return right / len(held_out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("make")
    p.add_argument("path", type=Path)
    p = sub.add_parser("score")
    p.add_argument("checkpoint", type=Path, help="a run directory (its latest checkpoint) or a checkpoint")
    p.add_argument("data", type=Path)
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--beams", type=int, default=1)
    p.add_argument("--limit", type=int, default=2000)
    args = parser.parse_args()
    if args.cmd == "make":
        make(args.path)
    else:
        score(args.checkpoint, args.data, val_fraction=args.val_fraction, beams=args.beams, limit=args.limit)


if __name__ == "__main__":
    main()
