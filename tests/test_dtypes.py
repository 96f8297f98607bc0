"""The one dtype vocabulary: canonical names, torch dtypes as equals, old spellings with a
deprecation warning, everything else an InputError naming the option and the choices."""

from __future__ import annotations

import pytest
import torch

from anatomy import dtypes
from anatomy.deprecation import AnatomyDeprecationWarning
from anatomy.errors import InputError


@pytest.mark.parametrize("name, bits, torch_dtype", [
    ("f32", 32, torch.float32), ("f16", 16, torch.float16), ("bf16", 16, torch.bfloat16), ("int8", 8, torch.int8),
    ("int4", 4, None)])
def test_canonical_names(name, bits, torch_dtype):
    dtype = dtypes.parse(name, choices=dtypes.ALL)
    assert (dtype.name, dtype.bits, dtype.torch) == (name, bits, torch_dtype)
    assert dtype.nbytes(1000) == 1000 * bits // 8
    assert dtype.is_float == (name in dtypes.FLOATS)


@pytest.mark.parametrize("given, name", [(torch.float32, "f32"), (torch.float16, "f16"), (torch.bfloat16, "bf16")])
def test_torch_dtypes_are_the_same_dtypes(given, name):
    assert dtypes.parse(given).name == name
    assert dtypes.torch_dtype(name) is given and dtypes.name_of(given) == name


@pytest.mark.parametrize("old, new", [("fp32", "f32"), ("float32", "f32"), ("float", "f32"), ("fp16", "f16"),
                                      ("float16", "f16"), ("half", "f16"), ("bfloat16", "bf16")])
def test_old_spellings_still_work_with_a_deprecation_warning(old, new):
    with pytest.warns(AnatomyDeprecationWarning, match=rf"dtype='{old}' is deprecated, use '{new}'") as record:
        assert dtypes.parse(old).name == new
    assert record[0].filename == __file__  # the warning points at the caller, not into anatomy
    with pytest.warns(DeprecationWarning, match=rf"--dtype '{old}' is deprecated, use '{new}'"):
        dtypes.parse(old, option="--dtype")


@pytest.mark.parametrize("value", ["fp8", "F32", "float64", "", torch.float64, torch.int32, 16, None])
def test_anything_else_is_an_input_error_naming_option_and_choices(value):
    with pytest.raises(InputError, match=r"^--kv-dtype .* is not one of f32, f16, bf16, int8, int4, fp8_e4m3, fp8_e5m2$"):
        dtypes.parse(value, option="--kv-dtype", choices=dtypes.ALL)


def test_choices_narrow_what_is_accepted():
    assert dtypes.parse("int8", choices=dtypes.ALL).name == "int8"
    with pytest.raises(InputError, match=r"dtype='int8' is not one of f32, f16, bf16"):
        dtypes.torch_dtype("int8")
    with pytest.raises(InputError, match=r"dtype=torch.bfloat16 is not one of f32, f16$"):
        dtypes.parse(torch.bfloat16, choices=("f32", "f16"))
