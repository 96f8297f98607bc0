"""build_model's arguments: dtypes by any accepted name, and bad arguments as InputErrors naming them."""

from __future__ import annotations

import pytest
import torch

from anatomy import build_model, get_preset
from anatomy.errors import InputError

CONFIG = get_preset("gpt2", d_model=16, n_layers=1, n_heads=2, d_ff=32, vocab_size=50, bos_token_id=None,
                    eos_token_id=None)


@pytest.mark.parametrize("dtype", ["bf16", torch.bfloat16])
def test_dtype_by_name_or_torch_dtype(dtype):
    assert {p.dtype for p in build_model(CONFIG, dtype=dtype).parameters()} == {torch.bfloat16}


@pytest.mark.parametrize("kwargs, message", [
    ({"config": "gpt2"}, "build_model takes a ModelConfig .*got str: 'gpt2'"),
    ({"dtype": "int8"}, "dtype='int8' is not one of f32, f16, bf16"),
    ({"device": "nowhere"}, "device='nowhere' is not a torch device"),
    ({"head": "lm"}, "head='lm' is not one of 'auto', 'base', 'mlm'"),
    ({"attention": "flash"}, "flash"),
])
def test_bad_arguments_are_input_errors(kwargs, message):
    with pytest.raises(InputError, match=message):
        build_model(**{"config": CONFIG, **kwargs})


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch without a CUDA device")
def test_cuda_without_a_cuda_device_says_so():
    with pytest.raises(InputError, match="device='cuda': this torch has no CUDA device"):
        build_model(CONFIG, device="cuda")
