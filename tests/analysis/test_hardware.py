"""Hardware entries, JSON files and the on-the-spot measurement."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from anatomy.analysis.hardware import BUILTIN, get_hardware, measure_local
from anatomy.errors import InputError


def test_builtin_entries_are_dense_and_cite_a_source():
    assert get_hardware("h100-sxm").peak("bf16") == 989e12  # half of the 1,979 sparsity headline
    assert get_hardware("a100-80gb").peak("bf16") == 312e12
    assert get_hardware("h200").bandwidth == 4.8e12
    for hw in BUILTIN.values():
        assert "datasheet" in hw.source and "sparsity" in hw.source + hw.notes
        assert hw.peak("f16") == hw.peak("bf16") > hw.peak("f32")


def test_json_file(tmp_path):
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"name": "mine", "peak_flops": {"bf16": 5e14}, "bandwidth": 2e12}))
    hw = get_hardware(str(path))
    assert (hw.name, hw.peak("bf16"), hw.peak("f16"), hw.bandwidth) == ("mine", 5e14, 5e14, 2e12)


def test_json_file_with_old_dtype_keys_still_reads(tmp_path):
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"peak_flops": {"fp32": 6e13, "fp16": 9e14}, "bandwidth": 2e12}))
    with pytest.deprecated_call() as record:
        hw = get_hardware(str(path))
    assert [str(w.message).split(": ")[-1] for w in record] == ["peak_flops key='fp32' is deprecated, use 'f32'",
                                                                "peak_flops key='fp16' is deprecated, use 'f16'"]
    assert (hw.peak("f32"), hw.peak("f16"), hw.peak("bf16")) == (6e13, 9e14, 9e14)


@pytest.mark.parametrize("content, message", [
    ({"name": "x", "bandwidth": 1e12}, "no peak figures"),
    ({"peak_flops": {}, "bandwidth": 1e12}, "no peak figures"),
    ({"peak_flops": 1e15}, "'bandwidth' must be a positive number"),
    ({"peak_flops": -1, "bandwidth": 1e12}, "peak_flops.any"),
    ({"peak_flops": {"fp8": 1e15}, "bandwidth": 1e12}, "peak_flops key='fp8' is not one of f32, f16, bf16"),
])
def test_json_without_figures_is_an_error(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(content))
    with pytest.raises(InputError, match=message):
        get_hardware(str(path))


def test_unknown_name_suggests_close_ones():
    with pytest.raises(InputError, match="did you mean .*h100-sxm"):
        get_hardware("h100")


def test_local_measurement_takes_the_fastest_round_of_each(monkeypatch):
    """On a virtual clock that gives the three matmul rounds 3, 1 and 2 ms and the three sums 5, 4 and
    8 ms: 2 x 256^3 FLOPs in 1 ms and 16 MiB read in 4 ms; the f32 figure stands in for every dtype and says so."""
    import anatomy.analysis.hardware as hardware

    durations = [3e-3, 1e-3, 2e-3, 5e-3, 4e-3, 8e-3]  # a start and a stop per round, rounds 10 s apart
    ticks = iter(t for i, d in enumerate(durations) for t in (10.0 * i, 10.0 * i + d))
    monkeypatch.setattr(hardware, "time", SimpleNamespace(perf_counter=lambda: next(ticks)))
    hw = measure_local(matmul_n=256, read_mib=16, repeats=3)
    assert hw.peak("f32") == pytest.approx(2 * 256 ** 3 / 1e-3) and hw.bandwidth == pytest.approx(16 * 2 ** 20 / 4e-3)
    assert next(ticks, None) is None  # every round was timed
    assert hw.peak("bf16") == hw.peak("f32") and "stands in for every compute dtype" in hw.notes
