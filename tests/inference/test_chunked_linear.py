"""ChunkedLinear computes F.linear (same parameters, same state dict), for few rows and many."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from anatomy.inference.chunked_linear import ChunkedLinear, use_chunked_linears


@pytest.mark.parametrize("shape", [(1, 1, 48), (8, 1, 48), (3, 5, 48), (40, 48)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("chunks", [2, 4])
def test_equals_f_linear(shape, bias, chunks):
    layer = nn.Linear(48, 96, bias=bias)
    x = torch.randn(shape)
    expected = F.linear(x, layer.weight, layer.bias)
    use_chunked_linears(layer, chunks)
    assert isinstance(layer, ChunkedLinear) and layer.chunks == chunks
    torch.testing.assert_close(layer(x), expected, atol=1e-6, rtol=1e-6)


def test_state_dict_and_uneven_rows_unchanged():
    layer = nn.Linear(48, 30)  # 30 rows do not split into 4 chunks: plain F.linear
    before = dict(layer.state_dict())
    use_chunked_linears(layer, 4)
    assert layer.state_dict().keys() == before.keys()
    x = torch.randn(1, 48)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
