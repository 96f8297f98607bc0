"""What every block of a stack shares for one forward pass, as one typed value.

A stack computes it once per pass (RoPE angles, masks, the ALiBi bias, the cache slots) and
hands the same object to each of its blocks; a block reads the fields its sublayers need.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from anatomy.deprecation import renamed_names


@dataclass(frozen=True)
class PassInputs:
    """The per-pass inputs of every block of a stack (None: not used by this pass).

    rope         (cos, sin), each [B, S, d_h]: the rotary angles of the queries' positions
    sliding_rope the same by the sliding-window layers' own RoPE base (Gemma 3), else None
    mask         bool [B|1, 1, S, S_k]: True where a query may attend to a key
    window_mask  the same for the sliding-window layers (keys within the window only); None when
                 no key of this pass can be outside the window
    bias         [1, H, S, S_k]: ALiBi's additive bias on the scores
    input_pos    [S]: the KV-cache slots the new keys and values are written to
    memory_mask  bool [B, 1, 1, S_m]: the real (non-padding) positions of the encoder output
    router_logits  a list every mixture-of-experts FFN appends its router logits [B*S, E] to
    new_keys_only  the pass's keys are its own tokens, from position 0, nothing padded or cached
                 before (a fresh prompt): attention reads the new keys and values, causally,
                 without a mask (SDPA's is_causal: a flash kernel can run), after writing the cache
    """

    rope: tuple[Tensor, Tensor] | None = None
    mask: Tensor | None = None
    bias: Tensor | None = None
    input_pos: Tensor | None = None
    memory_mask: Tensor | None = None
    window_mask: Tensor | None = None
    router_logits: list[Tensor] | None = None
    sliding_rope: tuple[Tensor, Tensor] | None = None
    new_keys_only: bool = False


# old names, from before "context" kept one meaning (the model's length): they work for a release
__getattr__ = renamed_names(__name__, {"Context": "PassInputs"}, globals())
