"""A layout built from its weight's rows a piece at a time, each piece's stored rows given back once it
is packed: an engine that takes its model's weights never holds a weight twice, not even while it packs
the largest (a tied LM head). Only for forms whose layout keeps the rows in order (Form.piece_rows)."""

from __future__ import annotations

import torch

from anatomy import heap
from anatomy.kernels.candidates import Form, Prepared
from anatomy.weights.formats import WeightFormat

PIECE_BYTES = 8 << 20  # stored bytes packed at a time


def build_consuming(form: Form, fmt: WeightFormat) -> Prepared:
    """`form.build(fmt)`, built from pieces of fmt's rows; fmt's stored rows are discarded as they are
    packed, so the caller must release fmt (WeightFormat.release) before anything reads it again."""
    unit, N = form.piece_rows, fmt.shape[0]
    rows = max(unit, PIECE_BYTES * N // max(fmt.nbytes, 1) // unit * unit)
    out: Prepared | None = None
    try:
        for start in range(0, N, rows):
            stop = min(N, start + rows)
            part = form.build(fmt.take_rows(torch.arange(start, stop)))
            if out is None:
                out = tuple(p.new_empty((N // unit, *p.shape[1:])) for p in part)
            for whole, p in zip(out, part):
                whole[start // unit:stop // unit].copy_(p)
            discard_rows(fmt, start, stop)
    except BaseException:  # rows are gone: fmt reads as given back (an InputError), never as zeros
        fmt.release()
        raise
    return out


def discard_rows(fmt: WeightFormat, start: int, stop: int) -> int:
    """Give back the pages of rows [start, stop) of each stored tensor laid out by rows; -> bytes."""
    N, freed = fmt.shape[0], 0
    for t in fmt.buffers():
        if t.dim() and t.shape[0] == N and t.is_contiguous() and t.device.type == "cpu":
            row = t.nbytes // N
            freed += heap.discard(t.data_ptr() + start * row, (stop - start) * row)
    return freed
