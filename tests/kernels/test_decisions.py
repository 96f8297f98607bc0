"""Choices measured once per machine and model, then kept (kernels/decisions.py)."""

import pytest

import anatomy.kernels.decode_block as decode_block
import anatomy.kernels.record as record
from anatomy.inference.engine import DecoderEngine
from anatomy.kernels import native
from anatomy.kernels.cache import CACHE_ENV
from anatomy.kernels.decisions import decided


def test_a_decision_is_measured_once_and_then_read(tmp_path):
    calls = []

    def measure():
        calls.append(1)
        return len(calls) * 4

    assert decided("rows", {"model": "a"}, measure=measure, cache=tmp_path) == 4
    assert decided("rows", {"model": "a"}, measure=measure, cache=tmp_path) == 4  # kept: not measured again
    assert decided("rows", {"model": "b"}, measure=measure, cache=tmp_path) == 8  # another model: its own
    assert decided("rows", {"model": "a"}, measure=measure, cache=False) == 12  # not read, not kept
    assert decided("rows", {"model": "a"}, measure=measure, cache=tmp_path) == 4
    assert len(calls) == 3


def test_a_corrupt_kept_decision_is_measured_again(tmp_path):
    decided("rows", {"model": "a"}, measure=lambda: 4, cache=tmp_path)
    (kept,) = (tmp_path / "plans").glob("*.json")
    kept.write_text('{"version": 3, "key": "not this one"')
    assert decided("rows", {"model": "a"}, measure=lambda: 2, cache=tmp_path) == 2


@pytest.mark.skipif(not native.available(), reason="this CPU runs no vector path of the native kernels")
def test_a_second_engine_of_the_model_races_nothing(int4_tiny, tmp_path, monkeypatch):
    """The fused block's race runs for the first engine of a machine and model only; the second takes
    the kept answer (the same path), and a fresh cache measures again."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(record, "NOISE_LIMIT", float("inf"))  # the plan kept however busy the machine is
    races = []

    def faster(*args, **kwargs):
        races.append(kwargs.get("rows", 1))
        return True

    monkeypatch.setattr(decode_block, "faster", faster)
    first = DecoderEngine(int4_tiny)
    assert races == list(decode_block.ROWS) and first.native_blocks == int4_tiny.config.n_layers
    second = DecoderEngine(int4_tiny)
    assert races == list(decode_block.ROWS)  # no race at the second start
    assert second.native_blocks == first.native_blocks
    assert {b.max_rows for b in second.model.stack.blocks} == {decode_block.ROWS[-1]}
