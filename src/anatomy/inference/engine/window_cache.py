"""A sliding-window layer's static KV cache: a ring of `window + slack` slots instead of all T_max.

A layer that attends to its last `window` keys never reads a key older than that, so it keeps only
them: slot i of the ring holds the key of the cache slot `held[i]` (-1: none yet). Attention reads the
ring as it is, with the pass's mask (over cache slots 0..T-1) gathered to the ring's slots (`keys_mask`):
a slot holding a key outside the window, after the query, or nothing is masked.

    decode (one token)       written at slot % ring first; the ring is then the window
    a pass of S > 1 tokens   the ring as it was (less what the pass writes again) beside the S new
                             keys (a prefill's first queries need keys a later one would overwrite),
                             then the newest of them written

The `slack` slots beyond the window keep the keys a rewind (speculative decoding's rejected tokens)
may take back: a run rewinds at most `slack` slots (Run.rewind checks it).
"""

from __future__ import annotations

import torch
from torch import Tensor

from anatomy import kv_format
from anatomy.errors import InputError
from anatomy.inference.engine.layer_cache import LayerKVCache
from anatomy.kv_format import Codes

SLACK = 64  # slots a ring keeps beyond its window: the longest rewind it allows


class WindowKVCache(LayerKVCache):
    """The ring of one sliding-window layer (the `LayerCache` protocol of layers/attention.py); max_len
    stays the run's T_max (the slots it may write), `ring` is what is held."""

    def __init__(self, *, window: int, max_len: int, slack: int = SLACK, device: torch.device | str | None = None,
                 **layer) -> None:
        ring = min(max_len, window + slack)
        super().__init__(max_len=ring, device=device, **layer)
        self.max_len, self.ring, self.window, self.slack = max_len, ring, window, slack
        self.register_buffer("held", torch.full((ring,), -1, dtype=torch.long, device=device), persistent=False)
        self.columns: Tensor | None = None  # the cache slots of the keys the last update returned

    def update(self, input_pos: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor | Codes, Tensor | Codes]:
        """input_pos [S]; k, v [B, H_kv, S, d_h] -> the keys and values attention reads: the ring [B, H_kv,
        ring, d_h] (one token), or the ring as it was and the new ones [B, H_kv, ring + S, d_h]."""
        if input_pos.shape[0] == 1:
            where = input_pos % self.ring
            self.held.index_copy_(0, where, input_pos)
            self.columns = self.held
            return super().update(where, k, v)  # written at ring slots `where`: the ring's keys and values
        before = (self._read("k"), self._read("v"), self.held.clone())
        new = self._encoded(k), self._encoded(v)
        keys, values = (_joined(old, fresh) for old, fresh in zip(before[:2], new))
        stale = before[2] >= input_pos[0]  # slots this pass writes again (after a rewind): the old keys are gone
        self.columns = torch.cat([before[2].masked_fill(stale, -1), input_pos])
        kept = input_pos[-self.ring:]
        where = kept % self.ring
        self.held.index_copy_(0, where, kept)
        super().update(where, k[:, :, -self.ring:], v[:, :, -self.ring:])
        return keys, values

    def keys_mask(self, mask: Tensor | None) -> Tensor:
        """The pass's mask [B|1, 1, S, T] over cache slots -> over the keys `update` returned: each key's
        column, masked where the key is none or beyond the mask's T."""
        if mask is None:
            raise InputError("a sliding-window layer's ring cache is read with a mask over the cache slots")
        columns = self.columns
        present = (columns >= 0) & (columns < mask.shape[-1])
        picked = mask.index_select(-1, columns.clamp(0, mask.shape[-1] - 1))
        blocked = torch.zeros((), dtype=torch.bool, device=mask.device) if mask.dtype == torch.bool \
            else torch.tensor(float("-inf"), dtype=mask.dtype, device=mask.device)
        return torch.where(present, picked, blocked)

    def _read(self, which: str) -> Tensor | Codes:
        """The ring's keys or values as they are (`_joined` copies them before the ring is written)."""
        stored = getattr(self, which)
        if self.kind:
            return Codes(stored, getattr(self, f"{which}_scale"), self.lut, self.reader)
        return stored

    def _encoded(self, x: Tensor) -> Tensor | Codes:
        """New keys or values as the ring stores them."""
        if self.kind:
            codes, scale = kv_format.quantize(x, self.kind)
            return Codes(codes, scale, self.lut, self.reader)
        return x.to(self.k.dtype)


def _joined(old: Tensor | Codes, new: Tensor | Codes) -> Tensor | Codes:
    """The ring's keys and the new ones along the slots: [B, H_kv, ring + S, ...]."""
    if isinstance(old, Codes):
        return Codes(torch.cat([old.codes, new.codes], 2), torch.cat([old.scale, new.scale], 2), old.lut, old.reader)
    return torch.cat([old, new], 2)
