"""anatomy::argmax (kernels/native/argmax.cpp), greedy decoding's choice, against torch.argmax on every
vector path this CPU has: ties give the first index, a NaN the first NaN's, a row of -inf its first
slot; widths that do not fill a vector; the cpu backend's greedy choice takes it, the torch backend's
does not."""

from __future__ import annotations

import pytest
import torch

from anatomy.inference.engine.backend import CPU, TORCH
from anatomy.inference.sampling import greedy
from anatomy.kernels import native

PATHS = list(native.vector_paths())


@pytest.fixture(params=PATHS)
def path(request):
    assert native.loaded(), "the native kernels are not built: run `make kernels`"
    with native.limited(request.param) as running:
        assert running == request.param
        yield running


def rows(V: int, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randn(5, V) * 4


@pytest.mark.parametrize("V", [1, 7, 8, 9, 63, 49152, 128256])
def test_the_index_of_the_largest_value(path, V):
    x = rows(V)
    assert torch.equal(torch.ops.anatomy.argmax(x), torch.argmax(x, dim=-1))


def test_ties_give_the_first_index(path):
    x = torch.zeros(4, 100)
    x[0, [3, 50, 99]] = 2.0  # the same maximum three times
    x[1, [90, 91]] = 1.0
    x[2] = 5.0  # every value equal
    x[3, [8, 16]] = float("inf")
    assert torch.ops.anatomy.argmax(x).tolist() == [3, 90, 0, 8] == torch.argmax(x, dim=-1).tolist()


def test_a_nan_is_chosen_as_torch_chooses_it(path):
    x = rows(300)
    x[1, 217] = float("nan")
    x[3, 5] = x[3, 290] = float("nan")
    x[4, 299] = float("nan")  # in the tail a vector does not fill
    assert torch.equal(torch.ops.anatomy.argmax(x), torch.argmax(x, dim=-1))
    assert torch.ops.anatomy.argmax(x)[[1, 3, 4]].tolist() == [217, 5, 299]


def test_a_row_of_minus_infinity_gives_its_first_slot(path):
    x = torch.full((2, 37), float("-inf"))
    x[1, 30] = -1e30
    assert torch.ops.anatomy.argmax(x).tolist() == [0, 30] == torch.argmax(x, dim=-1).tolist()


def test_a_strided_input_is_read_as_its_values():
    x = rows(200).t().contiguous().t()  # the same values, columns contiguous
    assert not x.is_contiguous()
    assert torch.equal(torch.ops.anatomy.argmax(x), torch.argmax(x, dim=-1))


def test_the_cpu_backend_chooses_with_it_and_the_torch_backend_with_torch():
    assert native.loaded(), "the native kernels are not built: run `make kernels`"
    x = rows(1000)
    cpu, torch_ = CPU.greedy_choice(), TORCH.greedy_choice()
    with torch.profiler.profile() as prof:
        chosen = cpu(x)
    assert "anatomy::argmax" in {e.name for e in prof.events()}
    with torch.profiler.profile() as prof:
        by_torch = torch_(x)
    assert not any(e.name.startswith("anatomy::") for e in prof.events())
    assert torch.equal(chosen, torch.argmax(x, dim=-1)) and torch.equal(by_torch, chosen) and torch_ is greedy


def test_bad_input_is_refused_by_name():
    with pytest.raises(RuntimeError, match="anatomy::argmax: x must be float32"):
        torch.ops.anatomy.argmax(torch.zeros(3, 4, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="anatomy::argmax"):
        torch.ops.anatomy.argmax(torch.zeros(3, 0))
