"""Full KV blocks kept beyond the pool: host memory, then a directory that outlives the process.

    evicted from the pool   -> host memory (LRU, `host_bytes`) -> past it, a file in `directory`
    the server stops        -> every cached block of the pool and of host memory written to files
    a prompt is admitted    -> the blocks after its cached prefix found here are copied into its
                               fresh blocks instead of being computed

A block's key covers the server's identity (model, weights, dtypes, block size), and a file is read
only if all its checks pass (docs/serving.md, "A prefix cache that outlives the pool").
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import Tensor

MAGIC = b"anatomy-kv-block-1\n"
HEADER = len(MAGIC) + 16 + 16 + 8 + 16  # magic, identity, key, payload length, payload checksum


def identity(engine, block_size: int) -> bytes:
    """What a block's keys and values depend on besides its tokens: the config, the weights (a strided
    sample of each tensor), the dtypes and the block size."""
    digest = hashlib.blake2b(MAGIC, digest_size=16)
    digest.update(repr(engine.config).encode())
    digest.update(f"{engine.kv_dtype} {engine.branch_dtype} {block_size}".encode())
    for name, tensor in sorted(engine.model.state_dict().items()):
        flat = tensor.detach().reshape(-1)
        sample = flat[::max(1, flat.numel() // 256)][:256].cpu().contiguous()
        digest.update(f"{name} {tuple(tensor.shape)} {tensor.dtype}".encode())
        digest.update(sample.view(torch.uint8).numpy().tobytes() if sample.numel() else b"")
    return digest.digest()


class KVOffload:
    """The blocks of `cache` (a PagedKVCache) kept in host memory and in `directory`, by key."""

    def __init__(self, cache, identity: bytes, *, host_bytes: int = 0, directory: str | None = None) -> None:
        self.buffers: list[Tensor] = [b for name, b in cache.named_buffers() if not name.endswith("lut")]
        self.sizes = [b[0].nbytes for b in self.buffers]
        self.identity, self.host_bytes, self.directory = identity, host_bytes, directory
        self.host: OrderedDict[bytes, Tensor] = OrderedDict()  # key -> the block's bytes (uint8, CPU)
        self.rejected: set[bytes] = set()  # keys whose file was not valid: not read again
        self.saved = self.restored = self.written = 0
        if directory is not None:
            os.makedirs(directory, exist_ok=True)

    def key(self, h: bytes) -> bytes:
        return hashlib.blake2b(self.identity + h, digest_size=16).digest()

    # -- keeping -----------------------------------------------------------------------------------

    def save(self, block: int, h: bytes) -> None:
        """A cached block leaves the pool: its bytes go to host memory (or straight to a file)."""
        key = self.key(h)
        if key in self.host:
            self.host.move_to_end(key)
            return
        if self.host_bytes < sum(self.sizes):
            if not os.path.exists(self._path(key)):
                self._write(key, self._read(block))
            return
        self.host[key] = self._read(block)
        self.saved += 1
        while len(self.host) * sum(self.sizes) > self.host_bytes:
            old, payload = self.host.popitem(last=False)
            self._write(old, payload)

    def flush(self, cached: dict[bytes, int]) -> None:
        """Write every block of host memory and every cached block of the pool ({hash: block}) to files."""
        for key, payload in self.host.items():
            if not os.path.exists(self._path(key)):
                self._write(key, payload)
        for h, block in cached.items():
            key = self.key(h)
            if key not in self.host and not os.path.exists(self._path(key)):
                self._write(key, self._read(block))

    # -- finding -----------------------------------------------------------------------------------

    def count(self, hashes: Sequence[bytes]) -> int:
        """How many of the leading `hashes` are kept here (files not yet validated)."""
        n = 0
        for h in hashes:
            key = self.key(h)
            if key in self.rejected or (key not in self.host and not os.path.exists(self._path(key))):
                break
            n += 1
        return n

    def restore(self, hashes: Sequence[bytes], blocks: Sequence[int]) -> int:
        """Copy the kept blocks of the leading `hashes` into `blocks`; how many were (the first
        one missing or not valid ends it)."""
        for n, (h, block) in enumerate(zip(hashes, blocks)):
            payload = self._find(self.key(h))
            if payload is None:
                return n
            for buffer, part in zip(self.buffers, payload.split(self.sizes)):
                buffer[block].copy_(part.view(buffer.dtype).view(buffer[block].shape))
            self.restored += 1
        return min(len(hashes), len(blocks))

    def _find(self, key: bytes) -> Tensor | None:
        if key in self.host:
            self.host.move_to_end(key)
            return self.host[key]
        if key in self.rejected or self.directory is None:
            return None
        payload = self._load(key)
        if payload is None:
            self.rejected.add(key)
        return payload

    # -- bytes and files ---------------------------------------------------------------------------

    def _read(self, block: int) -> Tensor:
        return torch.cat([b[block].reshape(-1).view(torch.uint8).cpu() for b in self.buffers])

    def _path(self, key: bytes) -> str:
        return os.path.join(self.directory or "", key.hex() + ".kv")

    def _write(self, key: bytes, payload: Tensor) -> None:
        if self.directory is None:
            return
        data = payload.numpy().tobytes()
        header = MAGIC + self.identity + key + len(data).to_bytes(8, "little") + _checksum(data)
        path = self._path(key)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(header + data)
        os.replace(tmp, path)
        self.written += 1

    def _load(self, key: bytes) -> Tensor | None:
        """The payload of key's file, or None (and a log line) if the file is not one of ours, whole."""
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            return _ignored(path, f"unreadable ({exc.strerror or exc})")
        head, body = data[:HEADER], data[HEADER:]
        m = len(MAGIC)
        if len(head) < HEADER or head[:m] != MAGIC:
            return _ignored(path, "not a KV block file")
        if head[m:m + 16] != self.identity or head[m + 16:m + 32] != key:
            return _ignored(path, "written for another model, format or block size")
        if int.from_bytes(head[m + 32:m + 40], "little") != sum(self.sizes) or len(body) != sum(self.sizes):
            return _ignored(path, f"{len(body)} bytes of blocks, {sum(self.sizes)} expected (truncated?)")
        if head[m + 40:] != _checksum(body):
            return _ignored(path, "its checksum does not match its contents")
        return torch.frombuffer(bytearray(body), dtype=torch.uint8)


def _checksum(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def _ignored(path: str, why: str) -> None:
    print(f"anatomy serve: warning: ignoring the KV block file {path}: {why}; the block is computed",
          file=sys.stderr, flush=True)
    return None
