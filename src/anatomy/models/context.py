"""The position machinery of a stack: from the positions and slots of queries and keys, the RoPE
angles, the boolean attention masks and the ALiBi bias that every block of one pass shares.

A sliding window is a rule on slots: a query at slot q sees the keys at slots q - window < k <= q.
The sliding-window layers get that mask (`window_mask`) whenever some key of the pass could be
outside the window (more key slots than the window); the other layers get the ordinary one."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from anatomy.config import ModelConfig
from anatomy.layers import Rotary, alibi_bias, alibi_slopes
from anatomy.layers.context import Context


class PositionContext(nn.Module):
    """Holds the position machinery of a stack (RoPE inverse frequencies, ALiBi slopes)."""

    def __init__(self, config: ModelConfig, *, causal: bool) -> None:
        super().__init__()
        self.causal = causal
        self.n_heads, self.alibi = config.n_heads, config.position == "alibi"
        self.window = config.sliding_window if causal else None
        self.rotary = Rotary(config) if config.position == "rope" else None
        self.register_buffer("slopes", None, persistent=False)
        self.init_buffers()

    def init_buffers(self) -> None:
        """(Re)compute the ALiBi slopes [H] on the CPU: also after a build on the meta device."""
        if self.alibi:
            self.slopes = alibi_slopes(self.n_heads)

    def forward(
        self,
        position_ids: Tensor,
        *,
        q_slots: Tensor,
        k_slots: Tensor,
        key_valid: Tensor | None = None,
        explicit: bool = False,
        input_pos: Tensor | None = None,
        memory_mask: Tensor | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> Context:
        """position_ids [B, S]; q_slots [S] and k_slots [S_k] index the sequence (or the KV cache);
        key_valid [B, S_k] marks real (non-padding) keys. `explicit` forces a mask (cache in use).
        input_pos and memory_mask [B, 1, 1, S_m] are passed through to the blocks; the RoPE angles
        come in `dtype`, the dtype of the activations they rotate."""
        rope = self.rotary(position_ids, dtype) if self.rotary is not None else None
        bias = alibi_bias(self.slopes, q_slots, k_slots, causal=self.causal) if self.slopes is not None else None
        windowed = self.window is not None and len(k_slots) > self.window
        mask = window_mask = None
        if key_valid is not None or (explicit and self.causal) or windowed:
            allowed = torch.ones(1, 1, len(q_slots), len(k_slots), dtype=torch.bool, device=k_slots.device)
            if self.causal:
                allowed = allowed & (k_slots[None, :] <= q_slots[:, None])
            if key_valid is not None:
                allowed = allowed & key_valid.bool()[:, None, None, :]
            if key_valid is not None or (explicit and self.causal):
                mask = self._see_self(allowed, q_slots, k_slots)
            if windowed:
                window_mask = self._see_self(allowed & (k_slots[None, :] > q_slots[:, None] - self.window),
                                             q_slots, k_slots)
        return Context(rope=rope, mask=mask, bias=bias, input_pos=input_pos, memory_mask=memory_mask,
                       window_mask=window_mask)

    def _see_self(self, allowed: Tensor, q_slots: Tensor, k_slots: Tensor) -> Tensor:
        """A left-padding query sees only padding: let it see itself, to keep it finite."""
        return allowed | (k_slots[None, :] == q_slots[:, None]) if self.causal else allowed
