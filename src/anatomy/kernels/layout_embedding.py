"""A tied token table read from the LM head's layout, so that an engine that took the model's weights
holds the matrix once (the head's layout) instead of twice (that and the table's format).

    LayoutEmbedding(form.rows(layout), shape, dtype)   rows of W for the ids, exact (Form.rows)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn


class LayoutEmbedding(nn.Module):
    """A token table [V, D] whose rows a layout gives: a lookup reads only the rows of the ids, in `dtype`."""

    def __init__(self, rows: Callable[[Tensor], Tensor], shape: tuple[int, int], *,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = shape
        self._rows, self.dtype = rows, dtype  # rows: bound to the head's own tensors

    def forward(self, ids: Tensor) -> Tensor:
        return self._rows(ids.reshape(-1)).view(*ids.shape, self.embedding_dim).to(self.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, dtype={self.dtype}, read from the LM head's layout"
