"""Sample from a small trained decoder past its context window: at every step the model reads the
last max_seq_len tokens (a sliding window, as nanoGPT's sampler does), so a model with a 64-token
context can write a page. `anatomy generate` stops at the context length instead.

    python examples/training/sample.py runs/shakespeare-char --prompt "ROMEO." --tokens 500
    python examples/training/sample.py runs/shakespeare-char/checkpoints/step-001000 ...   # an earlier checkpoint
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch


@torch.no_grad()
def sample(model: torch.nn.Module, ids: list[int], *, tokens: int, temperature: float, top_k: int,
           generator: torch.Generator) -> list[int]:
    ids = list(ids)
    window = model.config.max_seq_len
    for _ in range(tokens):
        context = torch.tensor([ids[-window:]])  # [1, S <= T]
        logits = model(context, last_only=True)[0, -1] / temperature  # [V]
        if top_k:
            kth = torch.topk(logits, top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        ids.append(int(torch.multinomial(logits.softmax(-1), 1, generator=generator)))
    return ids


def main() -> None:
    import anatomy
    from anatomy.training.checkpoint import checkpoint_or_latest

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path, help="a run directory (its latest checkpoint) or a checkpoint")
    parser.add_argument("--prompt", default="\n")
    parser.add_argument("--tokens", type=int, default=500)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    checkpoint = checkpoint_or_latest(args.checkpoint)
    model = anatomy.load(checkpoint).eval()
    tokenizer = anatomy.load_tokenizer(checkpoint)
    prompt = tokenizer.encode(args.prompt)
    ids = sample(model, prompt, tokens=args.tokens, temperature=args.temperature, top_k=args.top_k,
                 generator=torch.Generator().manual_seed(args.seed))
    print(tokenizer.decode(ids, skip_special_tokens=True))


if __name__ == "__main__":
    main()
