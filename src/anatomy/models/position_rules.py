"""The position machinery of a stack and the one builder of every pass's PassInputs.

Every pass describes its queries and keys by slots (q_slots, k_slots, positions, key_valid), and
`build_pass_inputs` turns that into the PassInputs its blocks share: a model's own forward, a prefill into
a static cache, a decode step, a span of k tokens (speculative verification), a batch of chunks
over a paged cache. The PassInputs holds the additive mask (and a sliding-window one), the ALiBi bias
and the RoPE angles (from a table made once, `PositionTables`, for the steps of a generation). A full
pass needs no mask when nothing is padded and no cache is read; every other pass gets one.
The fields' shapes: docs/foundation.md, "Models: one Stack, four heads".
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from anatomy.config import ModelConfig
from anatomy.deprecation import renamed_names
from anatomy.layers import Rotary, alibi_bias, alibi_slopes
from anatomy.layers.pass_inputs import PassInputs


class PositionRules(nn.Module):
    """Holds the position machinery of a stack (RoPE inverse frequencies, ALiBi slopes, the window)."""

    def __init__(self, config: ModelConfig, *, causal: bool) -> None:
        super().__init__()
        self.causal = causal
        self.n_heads, self.alibi = config.n_heads, config.position == "alibi"
        self.window = config.sliding_window if causal else None
        self.rotary = Rotary(config) if config.position == "rope" else None
        self.sliding_rotary = Rotary(config, sliding=True) if config.sliding_rope_theta is not None else None
        self.register_buffer("slopes", None, persistent=False)
        self.init_buffers()

    def init_buffers(self) -> None:
        """(Re)compute the ALiBi slopes [H] on the CPU: also after a build on the meta device."""
        if self.alibi:
            self.slopes = alibi_slopes(self.n_heads)

    def forward(self, position_ids: Tensor, *, q_slots: Tensor, k_slots: Tensor, key_valid: Tensor | None = None,
                explicit: bool = False, input_pos: Tensor | None = None, memory_mask: Tensor | None = None,
                dtype: torch.dtype = torch.float32) -> PassInputs:
        """A model's own forward: position_ids [B, S]; q_slots [S] and k_slots [S_k] index the sequence
        (or the KV cache); key_valid [B, S_k] marks real keys; `explicit` (a cache is read) forces a
        mask; input_pos and memory_mask [B, 1, 1, S_m] pass through to the blocks. The angles and
        masks come in `dtype`."""
        rope = self.rotary(position_ids, dtype) if self.rotary is not None else None
        sliding = self.sliding_rotary(position_ids, dtype) if self.sliding_rotary is not None else None
        needs_mask = key_valid is not None or (explicit and self.causal)
        return build_pass_inputs(self, rope=rope, sliding_rope=sliding, q_slots=q_slots, k_slots=k_slots,
                                 key_valid=key_valid, needs_mask=needs_mask, input_pos=input_pos,
                                 memory_mask=memory_mask, dtype=dtype)


def build_pass_inputs(rules: PositionRules, *, rope: tuple[Tensor, Tensor] | None, q_slots: Tensor, k_slots: Tensor,
                      key_valid: Tensor | None = None, needs_mask: bool = True, input_pos: Tensor | None = None,
                      memory_mask: Tensor | None = None, dtype: torch.dtype = torch.float32,
                      sliding_rope: tuple[Tensor, Tensor] | None = None, new_keys_only: bool = False) -> PassInputs:
    """The PassInputs of one pass (the module docstring has the shapes and rules); `new_keys_only`: a
    fresh prompt's pass over a cache (k_slots its own), which needs no mask but a window's."""
    needs_mask = needs_mask and not new_keys_only
    q = q_slots[..., :, None]  # [S, 1] or [B, S, 1]
    k = k_slots  # [T]
    windowed = rules.window is not None and len(k_slots) > rules.window
    mask = window_mask = None
    if needs_mask or windowed:
        if rules.causal:
            allowed = k <= q  # [(B,) S, T]
        else:
            allowed = torch.ones(*q.shape[:-1], len(k), dtype=torch.bool, device=k.device)  # [(B,) S, T]
        if key_valid is not None:
            allowed = allowed & key_valid.bool()[:, None, :]  # [B, S, T]
        if rules.causal:
            allowed = allowed | (k == q)  # a padding query sees itself
        if needs_mask:
            mask = _additive(allowed, dtype)
        if windowed:
            window_mask = _additive(allowed & (k > q - rules.window), dtype)
    bias = None
    if rules.slopes is not None:
        bias = alibi_bias(rules.slopes.to(k.device), q_slots, k_slots, causal=rules.causal)
    return PassInputs(rope=rope, mask=mask, bias=bias, input_pos=input_pos, memory_mask=memory_mask,
                      window_mask=window_mask, sliding_rope=sliding_rope, new_keys_only=new_keys_only)


def _additive(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """bool [(B,) S, T] -> [B|1, 1, S, T]: 0 where allowed, -inf elsewhere."""
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    mask = torch.where(allowed, zero, torch.tensor(float("-inf"), dtype=dtype, device=allowed.device))
    return mask.view(-1, 1, *mask.shape[-2:])


class PositionTables:
    """What the steps over one cache of `length` slots share, made once: the slots 0..length-1 and,
    with RoPE, the angles of positions 0..length-1 [length, 1, d] (a step indexes them; the sliding-window
    layers' own too, where they have a base of their own). A rotary rule whose frequencies depend on how
    far a pass reaches (dynamic NTK, LongRoPE) computes each token's angles from its own reach instead,
    as its own decode step would."""

    def __init__(self, rules: PositionRules, *, length: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu") -> None:
        self.rules, self.dtype, self.device = rules, dtype, torch.device(device)
        self.slots = torch.arange(length, device=self.device)  # [T]
        self.main = _Angles(rules.rotary, self.slots, dtype)
        self.sliding = _Angles(rules.sliding_rotary, self.slots, dtype)

    def build(self, positions: Tensor, *, q_slots: Tensor, keys: int | None = None, key_valid: Tensor | None = None,
              input_pos: Tensor | None = None, new_keys_only: bool = False) -> PassInputs:
        """The PassInputs of queries at `q_slots` ([S], or [B, S] per row) with positions [B, S], over the
        first `keys` slots (default all); key_valid [B, keys] marks the real ones; `new_keys_only`: the
        queries are a fresh prompt's and `keys` is their number (no mask: PassInputs.new_keys_only)."""
        k_slots = self.slots if keys is None else self.slots[:keys]
        return build_pass_inputs(self.rules, rope=self.rope(positions), sliding_rope=self.sliding(positions),
                                 q_slots=q_slots, k_slots=k_slots, key_valid=key_valid, input_pos=input_pos,
                                 dtype=self.dtype, new_keys_only=new_keys_only)

    def rope(self, positions: Tensor) -> tuple[Tensor, Tensor] | None:
        """(cos, sin) [B, S, 1, d] of positions [B, S]; None without RoPE."""
        return self.main(positions)


class _Angles:
    """One rotary rule's angles of positions [B, S]: looked up in a table of `slots`, or computed per token
    for a length-dependent rule; None without the rule."""

    def __init__(self, rotary: Rotary | None, slots: Tensor, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.rotary = rotary if rotary is not None and rotary.length_dependent else None
        self.cos = self.sin = None
        if rotary is not None and self.rotary is None:
            cos, sin = rotary(slots[None], dtype)  # 2 x [1, T, 1, d]
            self.cos, self.sin = cos[0], sin[0]  # [T, 1, d]

    def __call__(self, positions: Tensor) -> tuple[Tensor, Tensor] | None:
        if self.rotary is not None:
            columns = [self.rotary(positions[b:b + 1, i:i + 1], self.dtype)
                       for b in range(positions.shape[0]) for i in range(positions.shape[1])]
            B, S = positions.shape
            cos = torch.cat([c for c, _ in columns]).view(B, S, 1, -1)
            sin = torch.cat([s for _, s in columns]).view(B, S, 1, -1)
            return cos, sin
        if self.cos is None:
            return None
        return self.cos[positions], self.sin[positions]  # [B, S, 1, d]


# old names, from before "context" kept one meaning (the model's length): they work for a release
__getattr__ = renamed_names(__name__, {"PositionContext": "PositionRules", "ContextTables": "PositionTables",
                                       "build_context": "build_pass_inputs"}, globals())
