"""What a sequence's next token must obey, applied to its logits before sampling.

    logits [R, V] -> + logit_bias (OpenAI's: added to the logits, -100 bans a token, 100 all but forces it)
                  -> stop ids at -inf while fewer than min_tokens were generated (vLLM's min_tokens)
                  -> -inf outside the grammar's allowed tokens (a packed bitmask per constrained row)
                  -> sampling (penalties, temperature, filters: anatomy.inference.sampling)

The log-probabilities a response reports are the model's own distribution, before any of this.
"""

from __future__ import annotations

import sys

import torch
from torch import Tensor

from anatomy.serving.grammar import apply_bitmask
from anatomy.serving.sequence import Sequence


def logit_bias(bias: dict[int, float], device: torch.device | str) -> tuple[Tensor, Tensor] | None:
    """{token id: bias} -> (ids [K], values [K]) as Sequence.bias holds them; None when empty."""
    if not bias:
        return None
    return (torch.tensor(list(bias), dtype=torch.long, device=device),
            torch.tensor(list(bias.values()), dtype=torch.float32, device=device))


def processed(logits: Tensor, seqs: list[Sequence]) -> Tensor:
    """logits [R, V] of seqs (one row each) with every sequence's bias, min_tokens and grammar applied.
    Only rows with something to apply are touched, in a copy: the log-probabilities a response reports
    are the model's own distribution, as vLLM reports them by default."""
    rows = [i for i, s in enumerate(seqs) if s.bias is not None or s.constraint is not None
            or s.generated < s.min_tokens]
    if not rows:
        return logits
    out = logits.clone()
    for i in rows:
        seq = seqs[i]
        if seq.bias is not None:
            ids, values = seq.bias
            out[i, ids] += values.to(out.dtype)
        if seq.generated < seq.min_tokens and seq.stop_ids:
            out[i, list(seq.stop_ids)] = float("-inf")
    constrained = [i for i in rows if seqs[i].constraint is not None]
    if constrained:
        masks = _masks([seqs[i] for i in constrained], logits.shape[-1])
        index = torch.tensor(constrained, device=out.device)
        out[index] = apply_bitmask(out[index], masks)
    return out


def processed_draft(rows: Tensor, seq: Sequence, draft: list[int]) -> Tensor:
    """The logits [k + 1, V] of a verifying row (after its last token and after each of its draft's k
    tokens, which its grammar allows) with what each of those positions must obey: the grammar
    advanced along the draft (and rolled back after: the tokens kept are accepted when emitted),
    min_tokens counted per position."""
    if seq.bias is None and seq.constraint is None and seq.generated >= seq.min_tokens:
        return rows
    out = rows.clone()
    if seq.bias is not None:
        ids, values = seq.bias
        out[:, ids] += values.to(out.dtype)
    for i in range(len(rows)):
        if seq.generated + i < seq.min_tokens and seq.stop_ids:
            out[i, list(seq.stop_ids)] = float("-inf")
    if seq.constraint is not None:
        masks = torch.zeros((len(rows), (rows.shape[-1] + 31) // 32), dtype=torch.int32)
        for i, row in enumerate(masks):
            _fill(seq, row)
            if i < len(draft) and seq.constraint is not None:
                seq.constraint.accept(draft[i])
        if seq.constraint is not None:
            seq.constraint.rollback(len(draft))
        out = apply_bitmask(out, masks)
    return out


def _masks(seqs: list[Sequence], vocab: int) -> Tensor:
    """The packed bitmasks [R, ceil(V / 32)] int32 of the constrained sequences' next tokens."""
    masks = torch.zeros((len(seqs), (vocab + 31) // 32), dtype=torch.int32)
    for row, seq in zip(masks, seqs):
        _fill(seq, row)
    return masks


def _fill(seq: Sequence, row: Tensor) -> None:
    """seq's grammar's bitmask into row. A grammar whose matcher fails (it should not: the tokens it is
    given are the ones it allowed) allows only the stop ids, so that the sequence ends instead of the
    step failing for every sequence in it."""
    try:
        seq.constraint.fill(row)
    except Exception as exc:  # see the module's docstring
        print(f"anatomy serve: a grammar failed; its sequence ends: {exc}", file=sys.stderr, flush=True)
        row.zero_()
        for t in seq.stop_ids:
            row[t // 32] |= _bit(t % 32)
        if not seq.stop_ids:  # nothing ends it (ignore_eos): it goes on unconstrained
            row.fill_(-1)
            seq.constraint = None


def _bit(i: int) -> int:
    """Bit i of an int32 word, as a signed int32 value."""
    return (1 << i) - (1 << 32 if i == 31 else 0)
