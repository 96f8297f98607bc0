"""Weights on transparent huge pages (huge_pages.py): small tensors are copied into advised chunks and take
the copy in place (every holder reads the same values from 2 MiB pages, per /proc/self/smaps), tensors with
views or from foreign memory are not moved, an engine moves its layouts and greedy-decodes the same tokens."""

from __future__ import annotations

import mmap

import numpy as np
import pytest
import torch

import anatomy
from anatomy import heap, huge_pages

pytestmark = pytest.mark.skipif(not huge_pages.offered(),
                                reason="this system gives no transparent huge pages (not Linux, or THP `never`)")


def huge_bytes_at(address: int) -> int:
    """AnonHugePages of the mapping holding `address` (/proc/self/smaps), in bytes."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(a, 16) for a in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "AnonHugePages:":
                return int(line.split()[1]) * 1024
    return 0


def collapses() -> bool:
    """Does this kernel collapse a range onto huge pages on request (MADV_COLLAPSE, Linux 6.1+)?"""
    region = mmap.mmap(-1, 4 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    memory = torch.frombuffer(region, dtype=torch.uint8)
    start = -memory.data_ptr() % huge_pages.HUGE
    memory[start:start + huge_pages.HUGE].fill_(1)
    return heap.advise(memory.data_ptr() + start, huge_pages.HUGE, huge_pages.MADV_COLLAPSE)


def test_small_tensors_move_onto_huge_pages_and_every_holder_reads_the_same_values():
    with torch.inference_mode():
        inferred = torch.randn(300_000)  # made in inference mode, as a model's layouts are
    tiles = torch.randint(0, 256, (5000, 100), dtype=torch.uint8)
    held = {"layouts": [tiles]}
    read = (lambda t: lambda: t.sum())(tiles)  # a bound kernel's closure
    want = [inferred.clone(), tiles.clone()]
    before = [inferred.data_ptr(), tiles.data_ptr()]
    moved = huge_pages.hold([inferred, tiles])
    assert moved >= 2 << 20
    assert [inferred.data_ptr(), tiles.data_ptr()] != before
    assert torch.equal(inferred, want[0]) and torch.equal(held["layouts"][0], want[1]) and read() == want[1].sum()
    assert inferred.is_inference()
    if collapses():  # else the advised pages are huge only where the kernel had them free
        assert huge_bytes_at(tiles.data_ptr()) >= 2 << 20


def test_views_foreign_memory_and_trained_parameters_stay_where_they_are():
    shared = torch.randn(1 << 20)
    view = shared[:16]
    from_file = torch.from_numpy(np.ones(1 << 20, dtype=np.float32))  # as a map of a file would be
    trained = torch.nn.Parameter(torch.randn(1 << 20))
    tiny = torch.randn(16)
    where = [t.data_ptr() for t in (shared, from_file, trained, tiny)]
    huge_pages.hold([shared, from_file, trained, tiny])
    assert [t.data_ptr() for t in (shared, from_file, trained, tiny)] == where
    assert torch.equal(view, shared[:16])


def test_opaque_and_quantized_tensors_are_left_alone():
    """oneDNN's reordered weights (a bf16 plan's) and quantized tensors have no storage to move: skipped,
    not an error."""
    opaque = torch.randn(512, 512).to_mkldnn()
    quantized = torch.quantize_per_tensor(torch.randn(512, 512), 0.1, 0, torch.qint8)
    assert huge_pages.hold([opaque, quantized]) == 0
    assert opaque.to_dense().shape == (512, 512) and quantized.dequantize().shape == (512, 512)


def test_an_engine_moves_its_layouts_and_decodes_the_same_tokens(smollm2_gguf_path):
    prompt = [[1, 504, 3458, 282, 4649, 314]]
    on_pages, plain = (anatomy.engine_for(anatomy.load(smollm2_gguf_path), take_weights=True, huge_pages=huge)
                       for huge in (True, False))
    assert on_pages.huge_page_bytes > 50 << 20 and plain.huge_page_bytes == 0
    got, want = (anatomy.generate(e, prompt, max_new_tokens=40, ignore_eos=True)[0].token_ids
                 for e in (on_pages, plain))
    assert got == want


def test_an_engine_leaves_the_callers_formats_where_they_are(smollm2_gguf_path):
    """Without take_weights the caller keeps its model: its formats' buffers are not moved (a decode step
    reads the layouts built from them, which are), so the kept engine stays valid."""
    from anatomy.weights.formats import WeightFormat

    model = anatomy.load(smollm2_gguf_path)
    buffers = {id(t): t.data_ptr() for m in model.modules() if isinstance(m, WeightFormat)
               for t in m.buffers(recurse=False)}
    engine = anatomy.engine_for(model)
    assert engine.huge_page_bytes > 50 << 20
    now = {id(t): t.data_ptr() for m in model.modules() if isinstance(m, WeightFormat)
           for t in m.buffers(recurse=False)}
    assert now == buffers
    assert anatomy.engine_for(model) is engine  # the model's own tensors did not move: the engine is kept
