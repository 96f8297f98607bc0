"""The modules a pipeline stage has where it does not hold a part of the whole model.

    stage 0            embeddings -> its blocks -> StageOutput (sends x [B, S, D] to stage 1)
    stage s            StageInput (receives x from stage s - 1) -> its blocks -> StageOutput
    last stage         StageInput -> its blocks -> final norm -> LM head (sends the logits to rank 0)
    rank 0's LM head   ReceivedLogits: the logits [..., V] from the last stage

Every stage runs the same Stack.run, so the blocks, the position context (each stage builds its own
from the positions every rank is given) and the stage's KV cache are the model's code.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from anatomy.parallel.collectives import recv, send

LOGITS_TO_RANK_0 = "lm_head -> rank 0"  # the name of the last stage's logits sent to the driver


def boundary(stage: int) -> str:
    """The name of the hidden states sent from `stage` to the next (both ends record it so)."""
    return f"stage {stage} -> {stage + 1}"


class StageInput(nn.Module):
    """The hidden states [B, S, D] of the previous stage, received from global rank `src`."""

    communicates = True

    def __init__(self, *, src: int, d_model: int, dtype: torch.dtype, where: str) -> None:
        super().__init__()
        self.src, self.d_model, self._dtype, self.where = src, d_model, dtype, where

    @property
    def dtype(self) -> torch.dtype:
        """The residual stream's dtype (what Embeddings.dtype would be)."""
        return self._dtype

    def forward(self, input_ids: Tensor, position_ids: Tensor | None = None,
                token_type_ids: Tensor | None = None) -> Tensor:
        B, S = input_ids.shape
        return recv((B, S, self.d_model), self._dtype, self.src, where=self.where, device=input_ids.device)


class StageOutput(nn.Module):
    """Where a non-last stage's final norm would be: its hidden states [B, S, D] go on to global rank `dst`."""

    communicates = True

    def __init__(self, *, dst: int, where: str) -> None:
        super().__init__()
        self.dst, self.where = dst, where

    def forward(self, x: Tensor) -> Tensor:
        send(x, self.dst, where=self.where)
        return x


class ReceivedLogits(nn.Module):
    """Rank 0's LM head when the head is on the last stage: its logits [..., V] received from global rank `src`."""

    communicates = True

    def __init__(self, *, src: int, vocab_size: int, dtype: torch.dtype, where: str = LOGITS_TO_RANK_0) -> None:
        super().__init__()
        self.src, self.vocab_size, self.dtype, self.where = src, vocab_size, dtype, where

    def forward(self, hidden: Tensor) -> Tensor:
        return recv((*hidden.shape[:-1], self.vocab_size), self.dtype, self.src, where=self.where,
                    device=hidden.device)


class NoHead(nn.Module):
    """The head of a rank whose logits nobody reads (a middle stage, a tensor-parallel follower of stage 0)."""

    def forward(self, hidden: Tensor) -> Tensor:
        return hidden
