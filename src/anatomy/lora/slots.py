"""AdapterSlots: the adapters an engine serves at once, by name, in up to max_loras slots.

    slots = AdapterSlots(view, max_loras=4, max_rank=16)          every adaptable projection -> BatchedLoRA
    ref = slots.load("sql", "adapters/sql")    read, checked (rank, every tensor), put in a free slot
    slots.hold(ref, seq)                       seq runs with it (its slot is not reused while seq runs)
    with slots.rows([1, 0, 2]):                a step whose rows run slot 1, none (the base), slot 2
    slots.unload("sql")                        the name goes at once; the slot is reused once no sequence holds it
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch
from torch import Tensor, nn

from anatomy.errors import InputError
from anatomy.lora.adapter import Adapter
from anatomy.lora.batched import BatchedLoRA, Pair
from anatomy.lora.read import read_adapter
from anatomy.lora.sites import all_sites


@dataclass(frozen=True)
class AdapterRef:
    """A loaded adapter: its name, slot, the file it came from, and `salt`, a digest of its weights
    (what the prefix cache keys its blocks by, so no block is shared across adapters)."""

    name: str
    slot: int
    path: str
    salt: bytes
    rank: int


class StepRows(threading.local):
    """What the layers read during one step: (slot, row indices [n], factor) per adapter and scale in it,
    and the batch;
    per thread, so that a pass of another thread on the same engine (an embedding) runs the base."""

    groups: list[tuple[int, Tensor, float]] | None = None
    batch: int = 0


class AdapterSlots:
    """Up to `max_loras` adapters of rank at most `max_rank` on `model` (an engine's view, changed in place),
    their pairs held in `dtype` on `device`. Loading and unloading happen on other threads than the steps:
    each layer's table is replaced whole, and a slot gets a name only once every layer holds its pairs."""

    def __init__(self, model: nn.Module, *, max_loras: int, max_rank: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> None:
        if max_loras < 1 or max_rank < 1:
            raise InputError(f"--max-loras {max_loras} and --max-lora-rank {max_rank} must be >= 1")
        self.config, self.max_loras, self.max_rank = model.config, max_loras, max_rank
        self.dtype, self.device = dtype, torch.device(device)  # the residual stream's: the pairs are kept in it
        self.step = StepRows()
        self.layers: dict[str, BatchedLoRA] = {}
        for module in dict.fromkeys(s.module for s in all_sites(model.config, hf_names=False)):
            parent, _, name = module.rpartition(".")
            self.layers[module] = BatchedLoRA(model.get_submodule(module), self.step)
            setattr(model.get_submodule(parent), name, self.layers[module])
        self._lock = threading.Lock()
        self._named: dict[str, AdapterRef] = {}
        self._users = {slot: weakref.WeakSet() for slot in range(1, max_loras + 1)}

    # -- from any thread ----------------------------------------------------------------------------

    def read(self, path: str | Path) -> Adapter:
        """The adapter at `path` (a PEFT directory or llama.cpp's GGUF file), checked against the model and
        max_rank (one InputError naming the problem)."""
        adapter = read_adapter(path, self.config)
        if adapter.config.rank > self.max_rank:
            raise InputError(f"{path}: the adapter's rank r={adapter.config.rank} is more than the server's "
                             f"--max-lora-rank {self.max_rank}")
        return adapter

    def load(self, name: str, path: str | Path) -> AdapterRef:
        """Read the adapter at `path` and serve it as `name` in a free slot."""
        if not isinstance(name, str) or not name.strip():
            raise InputError(f"an adapter's name must be a non-empty string, got {name!r}")
        adapter = self.read(path)
        pairs = adapter.pairs(self.config)
        salt = _digest(adapter)
        with self._lock:
            if name in self._named:
                raise InputError(f"the adapter {name!r} is already loaded (from {self._named[name].path})")
            slot = self._free_slot()
            for module, layer in self.layers.items():
                mine = tuple(Pair(s.start, s.stop, self._on_device(a), self._on_device(b), adapter.config.scale)
                             for s, a, b in pairs if s.module == module)
                kept = {k: v for k, v in layer.adapters.items() if k != slot}  # a reused slot's old pairs go
                layer.adapters = {**kept, slot: mine} if mine else kept
            ref = self._named[name] = AdapterRef(name, slot, str(path), salt, adapter.config.rank)
        return ref

    def unload(self, name: str) -> bool:
        """Stop serving `name` (False: no such adapter); sequences running with it finish with it."""
        with self._lock:
            return self._named.pop(name, None) is not None

    def get(self, name: str) -> AdapterRef | None:
        return self._named.get(name)

    def loaded(self) -> list[AdapterRef]:
        return list(self._named.values())

    def hold(self, ref: AdapterRef, holder) -> None:
        """`holder` (with a `finished` property) runs with `ref`: its slot is kept until holder is finished."""
        with self._lock:
            if self._named.get(ref.name) is not ref:
                raise InputError(f"the adapter {ref.name!r} was unloaded")
            self._users[ref.slot].add(holder)

    def _free_slot(self) -> int:
        named = {ref.slot for ref in self._named.values()}
        for slot, users in self._users.items():
            if slot not in named and all(u.finished for u in list(users)):
                users.clear()
                return slot
        raise InputError(f"all {self.max_loras} adapter slots (--max-loras) are in use: unload an adapter first")

    def _on_device(self, t: Tensor) -> Tensor:
        return t.detach().to(self.device, self.dtype).contiguous()

    # -- the loop's thread --------------------------------------------------------------------------

    @contextmanager
    def rows(self, slots: list[int], scales: list[float] | None = None) -> Iterator[None]:
        """During the block: row i of the step runs the adapter in slot slots[i] (0: none), its update
        times scales[i] (default 1)."""
        scales = scales or [1.0] * len(slots)
        groups: dict[tuple[int, float], list[int]] = {}
        for i, key in enumerate(zip(slots, scales)):
            if key[0]:
                groups.setdefault(key, []).append(i)
        self.step.groups = [(slot, torch.tensor(rows, device=self.device), factor)
                            for (slot, factor), rows in groups.items()]
        self.step.batch = len(slots)
        try:
            yield
        finally:
            self.step.groups, self.step.batch = None, 0


def _digest(adapter: Adapter) -> bytes:
    """A digest of the adapter's scale and tensors (by name)."""
    h = hashlib.blake2b(repr(adapter.config.scale).encode(), digest_size=16)
    for name in sorted(adapter.weights):
        t = adapter.weights[name].detach().float().cpu().contiguous()
        h.update(name.encode())
        h.update(t.numpy().tobytes())
    return h.digest()
