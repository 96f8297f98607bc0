"""Layouts built a piece of rows at a time (kernels/piecewise.py): every form that says it keeps W's rows in
order (Form.piece_rows) builds, from pieces, the very tensors its whole build gives, and the stored rows it
has packed are given back to the system (their pages read as zeros; the process's RSS falls)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from anatomy import heap
from anatomy.checkpoints.gguf_types import TENSOR_TYPES_BY_NAME
from anatomy.kernels import candidates, native
from anatomy.kernels import piecewise
from anatomy.kernels.candidates import KERNELS
from anatomy.weights.formats import Int4Weight, Int5Weight, Int8GroupWeight
from anatomy.weights.gguf_blocks import format_from_gguf

pytestmark = pytest.mark.skipif(not native.available(), reason="this CPU runs no vector path of the native kernels")
FORMS = {k.form.name: k.form for k in KERNELS if k.form.piece_rows}


def q6k(N: int, K: int) -> torch.nn.Module:
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, size=(N * K // 256, 210), dtype=np.uint8)
    blocks[:, 208:210] = (rng.standard_normal((N * K // 256, 1)) * 1e-3).astype(np.float16).view(np.uint8)
    return format_from_gguf(blocks.reshape(-1), TENSOR_TYPES_BY_NAME["Q6_K"], (N, K), label="w")


def iq4(N: int, K: int) -> torch.nn.Module:
    rng = np.random.default_rng(1)
    blocks = rng.integers(0, 256, size=(N * K // 32, 18), dtype=np.uint8)
    blocks[:, 0:2] = (rng.standard_normal((N * K // 32, 1)) * 1e-3).astype(np.float16).view(np.uint8)
    return format_from_gguf(blocks.reshape(-1), TENSOR_TYPES_BY_NAME["IQ4_NL"], (N, K), label="w")


def q4k(N: int, K: int) -> torch.nn.Module:
    rng = np.random.default_rng(2)
    blocks = rng.integers(0, 256, size=(N * K // 256, 144), dtype=np.uint8)
    blocks[:, 0:4] = (rng.random((N * K // 256, 2)) * 1e-3).astype(np.float16).view(np.uint8)  # d, dmin
    return format_from_gguf(blocks.reshape(-1), TENSOR_TYPES_BY_NAME["Q4_K"], (N, K), label="w")


def formats(N: int = 208, K: int = 512) -> list:
    torch.manual_seed(0)
    w = torch.randn(N, K) * 0.05 + 0.01
    return [Int4Weight.from_float(w, group=32), Int4Weight.from_float(w, group=256), Int5Weight.from_float(w, group=32),
            Int8GroupWeight.from_float(w), q6k(N, K), iq4(N, K), q4k(N, K)]


def test_the_piecewise_forms_include_the_tiles_and_row_layouts():
    want = {"q4x", "q5x", "q8x", "q6x"} | ({"q4t", "q5t", "q8t", "l4t", "k4t"} if native.runs("avx512-vnni") else set())
    assert want <= set(FORMS)


@pytest.mark.parametrize("name", sorted(FORMS))
def test_a_form_built_in_pieces_is_its_whole_build(name, monkeypatch):
    form = FORMS[name]
    built = 0
    for fmt in formats():
        if not form.accepts(fmt):
            continue
        whole = form.build(fmt)
        monkeypatch.setattr(piecewise, "PIECE_BYTES", fmt.nbytes // 5)  # 5 pieces or so, the last one short
        pieces = piecewise.build_consuming(form, fmt)
        assert len(pieces) == len(whole)
        for a, b in zip(pieces, whole):
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), f"{name} on {fmt.signature}"
        built += 1
    assert built, f"no test format is accepted by {name}"


def rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))


@pytest.mark.skipif(not heap.discards(), reason="no madvise in this system's C library")
def test_the_rows_packed_are_given_back():
    N, K = 4096, 4096  # 16 MiB of int8 codes
    fmt = Int8GroupWeight.from_float(torch.randn(N, K))
    fmt.codes.fill_(1)  # every page touched
    before = rss()
    freed = piecewise.discard_rows(fmt, 0, N // 2)
    assert freed >= N // 2 * K - 2 * heap.PAGE  # whole pages only
    assert before - rss() >= freed * 0.9
    assert int(fmt.codes[1:N // 2 - 1].abs().sum()) == 0  # the first row starts inside a page it shares
    assert bool((fmt.codes[N // 2 + 1:] == 1).all())  # the rows not packed are kept


def test_int4x2_is_packed_a_piece_of_rows_at_a_time_as_in_one_go(monkeypatch):
    """torch's int4 packing converts int32 codes (8x the layout's bytes): the head's are packed 64-row blocks
    at a time, to the same layout."""
    form = next(k.form for k in KERNELS if k.form.name == "int4x2")
    fmt = Int8GroupWeight.from_float(torch.randn(208, 256))  # 3 blocks of 64 and 16 rows
    if not form.accepts(fmt):
        pytest.skip("this torch build has no int4 packing for the CPU")
    monkeypatch.setattr(candidates, "INT4X2_ROWS", 10 ** 9)
    whole = form.build(fmt)
    monkeypatch.setattr(candidates, "INT4X2_ROWS", 64)
    assert all(torch.equal(a, b) for a, b in zip(form.build(fmt), whole))
