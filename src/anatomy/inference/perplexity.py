"""Perplexity, KL divergence and top-1 agreement of an engine on a text, teacher-forced through the
decode step generation runs, against fp32 inference on the same weights (llama-perplexity's figures).

    q = perplexity(engine, reference, ids)           # the whole text as one sequence
    q = perplexity(engine, reference, ids, ctx=512)  # llama-perplexity's chunks of 512 tokens

A sequence's first tokens are prefilled, as a prompt is; every later token is fed to run.decode in
place of a sampled one. The reference (a DecoderLM, fp32) scores the same positions from one plain
forward. Which positions are scored: docs/inference.md, "Quality".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

from anatomy import progress
from anatomy.errors import InputError
from anatomy.inference.engine import DecoderEngine
from anatomy.inference.sampling import SamplingParams

ROWS = 256  # positions scored at a time: the [ROWS, V] logits of both models, not the whole text's


@dataclass(frozen=True)
class Quality:
    """What `perplexity` measured; nll and kl_divergence in nats per scored position."""

    tokens: int  # positions scored
    chunks: int  # sequences run (1: the whole text)
    ctx: int | None  # the chunk length (None: the whole text)
    nll: float  # mean -log p(next token) of the engine
    reference_nll: float  # the same of the reference
    kl_divergence: float  # mean KL(reference || engine) of the next-token distributions
    top1_agreement: float  # share of positions whose most likely token is the reference's

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll)

    @property
    def reference_perplexity(self) -> float:
        return math.exp(self.reference_nll)

    def as_dict(self) -> dict:
        return asdict(self) | {"perplexity": self.perplexity, "reference_perplexity": self.reference_perplexity}


class Tally:
    """Sums over scored positions of both models' NLL, the KL divergence and top-1 matches."""

    def __init__(self) -> None:
        self.count = self.same = 0
        self.nll = self.reference_nll = self.kl = 0.0

    def add(self, logits: Tensor, reference: Tensor, targets: Tensor) -> None:
        """logits, reference [R, V] (the engine's, the reference's) for targets [R]."""
        got, ref = logits.double().log_softmax(-1), reference.double().log_softmax(-1)  # [R, V]
        rows = torch.arange(len(targets))
        self.nll -= got[rows, targets].sum().item()
        self.reference_nll -= ref[rows, targets].sum().item()
        self.kl += (ref.exp() * (ref - got)).sum().item()
        self.same += (got.argmax(-1) == ref.argmax(-1)).sum().item()
        self.count += len(targets)

    def result(self, *, chunks: int, ctx: int | None) -> Quality:
        n = self.count
        return Quality(tokens=n, chunks=chunks, ctx=ctx, nll=self.nll / n, reference_nll=self.reference_nll / n,
                       kl_divergence=self.kl / n, top1_agreement=self.same / n)


def perplexity(engine: DecoderEngine, reference: nn.Module, ids: list[int], *, ctx: int | None = None,
               bos: int | None = None) -> Quality:
    """The engine's figures on `ids` against `reference` (the fp32 DecoderLM of the same weights).

    ctx None: the whole text as one sequence, ids[0] its prompt: len(ids) - 1 positions scored.
    ctx N: llama-perplexity's chunks: len(ids) // N independent sequences of N tokens (the rest
    dropped), `bos` (where the tokenizer adds one) in each one's first slot; each prefills its first
    N // 2 + 1 tokens and scores the predictions of its tokens N // 2 + 1 .. N - 1, N - 1 - N // 2 a chunk."""
    spans = spans_of(engine.config, ids, ctx)
    tally = Tally()
    with progress.task("perplexity", total=sum(len(s) - p for s, p in spans)) as bar:
        for span, prompt in spans:
            if bos is not None and ctx is not None:
                span = [bos] + span[1:]
            score(engine, reference, span, prompt, tally, bar)
    return tally.result(chunks=len(spans), ctx=ctx)


def spans_of(config, ids: list[int], ctx: int | None) -> list[tuple[list[int], int]]:
    """(the tokens of each sequence, how many of them are its prompt)."""
    if ctx is None:
        if len(ids) < 2:
            raise InputError(f"the text has {len(ids)} token(s): perplexity needs at least 2")
        if len(ids) > config.max_seq_len:
            raise InputError(f"the text has {len(ids)} tokens, more than the model's context of {config.max_seq_len} "
                             "(max_seq_len): score fewer of them, or chunks of at most that many (ctx)")
        return [(ids, 1)]
    if not 3 <= ctx <= config.max_seq_len:
        raise InputError(f"ctx={ctx}: a chunk needs at least 3 tokens (one scored) and at most the model's context "
                         f"of {config.max_seq_len}")
    if len(ids) < ctx:
        raise InputError(f"the text has {len(ids)} tokens, fewer than one chunk of ctx={ctx}")
    return [(ids[i:i + ctx], ctx // 2 + 1) for i in range(0, len(ids) - ctx + 1, ctx)]


@torch.inference_mode()
def score(engine: DecoderEngine, reference: nn.Module, ids: list[int], prompt: int, tally: Tally, bar=None) -> None:
    """One sequence: ids[:prompt] prefilled, ids[prompt:-1] decoded one token a step; the logits of
    positions prompt-1 .. n-2 added to `tally` against ids[prompt:], ROWS at a time."""
    hidden = reference.stack(torch.tensor([ids]))[0]  # [n, D]
    targets = torch.tensor(ids[prompt:])
    run = engine.start([ids[:prompt]], SamplingParams(max_new_tokens=len(ids) - prompt))
    rows = [run.prefill()[0]]  # [V]: position prompt-1
    for i, token in enumerate(ids[prompt:-1], start=1):
        if len(rows) == ROWS:
            _flush(reference, hidden, rows, targets, i - ROWS, prompt, tally, bar)
        rows.append(run.decode(torch.tensor([token], device=engine.device))[0])  # position prompt-1+i
    _flush(reference, hidden, rows, targets, len(targets) - len(rows), prompt, tally, bar)


def _flush(reference: nn.Module, hidden: Tensor, rows: list[Tensor], targets: Tensor, start: int, prompt: int,
           tally: Tally, bar) -> None:
    """Score the engine's logits `rows` of targets[start:start+len(rows)] against the reference's; empty `rows`."""
    at = slice(prompt - 1 + start, prompt - 1 + start + len(rows))  # their positions in the sequence
    tally.add(torch.stack(rows).float().cpu(), reference.logits(hidden[at]).float(), targets[start:start + len(rows)])
    if bar is not None:
        bar.advance(len(rows))
    rows.clear()
