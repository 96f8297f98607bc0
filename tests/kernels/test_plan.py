"""The kernel plan: only accurate kernels are chosen, the fastest per phase; a second layout is
held only when it pays and fits the memory budget; plans are cached per machine and model, and a
corrupt, truncated or foreign cache file is measured again, never trusted. PlannedLinear runs the
chosen kernel per number of rows with the documented dtype contract.

Most tests use fake kernels that compute the right (or a wrong) product and advance a virtual
clock by a set cost, so that the decisions are deterministic whatever else the machine runs;
timings of the real kernels are never asserted."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
import torch
import torch.nn.functional as F

from anatomy.errors import InputError
from anatomy.kernels import plan as plan_module
from anatomy.kernels import timing as plan_timing
from anatomy.kernels import record as plan_record
from anatomy.weights.formats import FloatWeight, Int4Weight
from anatomy.kernels.candidates import KERNELS, Form, Kernel, relative_error
from anatomy.kernels.plan import DEFAULT_PHASES, KernelPlan, make_plan
from anatomy.kernels.timing import Phase
from anatomy.kernels.planned_linear import PlannedLinear
from anatomy.kernels.sampled_rows import near_sampled

PHASES = (Phase("decode", 1, 4), Phase("batch", 8, 32), Phase("prefill", 64, None))
FAST, SLOW = 1e-5, 3e-3  # virtual seconds a fake kernel takes
SPIKE_AT = 3  # the call of the spiky kernel that meets a spike: its first timed one (after a check and a warm-up)


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


CLOCK = VirtualClock()


@pytest.fixture(autouse=True)
def _deterministic(monkeypatch, tmp_path):
    monkeypatch.setattr(plan_timing, "MAX_COPIES", 2)
    monkeypatch.setattr(plan_timing, "PASS_SECONDS", 1e-4)  # ten fast calls a pass
    monkeypatch.setattr(plan_timing, "clock", CLOCK)
    monkeypatch.setattr(plan_record, "NOISE_LIMIT", float("inf"))  # other processes' noise must not stop caching
    monkeypatch.setenv("ANATOMY_CACHE_DIR", str(tmp_path / "cache"))


def _form(name: str) -> Form:
    return Form(name, lambda fmt: (fmt.dequantize(),), lambda fmt: True, lambda fmt: fmt.shape[0] * fmt.shape[1] * 4)


def _fake(name: str, form: Form, *, slow_above: int | None = None, slow_upto: int | None = None,
          wrong: bool = False, fails: bool = False, calls: list | None = None, cost: float | None = None,
          off: float = 0.0) -> Kernel:
    """A kernel computing F.linear in f32 that takes SLOW (virtual) seconds when the rows are above/up to a
    limit, FAST otherwise."""

    def bind(p):
        (w,) = p

        def run(x):
            rows = x.shape[0]
            if calls is not None:
                calls.append((name, rows))
            if fails:
                raise RuntimeError("this kernel does not work here")
            slow = (slow_above is not None and rows > slow_above) or (slow_upto is not None and rows <= slow_upto)
            CLOCK.now += cost if cost is not None else SLOW if slow else FAST
            return torch.zeros(rows, w.shape[0]) if wrong else F.linear(x, w) * (1 + off)

        return run

    return Kernel(name, form, torch.float32, bind)


A, B = _form("a"), _form("b")
FAST_DECODE = _fake("fast-decode", A, slow_above=4)  # layout a: fast for 1 row, slow for more
FAST_GEMM = _fake("fast-gemm", B, slow_upto=4)  # layout b: slow for 1 row, fast for more
WRONG = _fake("wrong", A, wrong=True)  # the fastest of all, and wrong
BROKEN = _fake("broken", B, fails=True)
FAKES = (FAST_DECODE, FAST_GEMM, WRONG, BROKEN)


def _linears(n: int = 2) -> dict[str, FloatWeight]:
    return {f"blocks.{i}.ffn.down": FloatWeight.from_float(torch.randn(32, 64)) for i in range(n)}


def _plan(linears=None, **kw) -> KernelPlan:
    kw = {"model_id": "test-model", "weights": "f32", "phases": PHASES, "kernels": FAKES, "repeats": 3,
          "memory_budget": 2 ** 30, **kw}
    return make_plan(linears or _linears(), **kw)


def test_accurate_fastest_kernels_chosen_and_second_layout_when_it_pays():
    plan = _plan(cache=False)
    w = plan.for_layer("blocks.1.ffn.down")
    assert w.choices == {"decode": "fast-decode", "batch": "fast-gemm", "prefill": "fast-gemm"}
    # b serves two of the three phases fastest (the least summed slowdown): held first; a is bought for decode
    assert w.forms == ["b", "a"] and plan.extra_bytes == 2 * 32 * 64 * 4
    notes = {m.kernel: m.note for m in w.measurements["decode"]}
    assert notes["wrong"].startswith("inaccurate") and notes["broken"].startswith("failed")
    assert all(m.kernel not in ("wrong", "broken") for ms in w.measurements.values() for m in ms if m.eligible)
    text = "\n".join(plan.describe())
    assert "decode   f32[32,64] x2: fast-decode" in text and "wrong (inaccurate)" in text and "broken (failed)" in text


@pytest.mark.parametrize("budget", [0, None])  # None: the default, no second layout unless $ANATOMY_LAYOUT_BUDGET
def test_no_budget_keeps_the_one_layout_best_for_all_phases(budget, monkeypatch):
    monkeypatch.delenv("ANATOMY_LAYOUT_BUDGET", raising=False)
    plan = _plan(cache=False, memory_budget=budget)
    w = plan.for_layer("blocks.0.ffn.down")
    # a: 1 + 300 + 300 times the fastest per phase; b: 300 + 1 + 1
    assert w.choices == {"decode": "fast-gemm", "batch": "fast-gemm", "prefill": "fast-gemm"}
    assert w.forms == ["b"] and plan.extra_bytes == 0 and plan.budget_bytes == 0
    assert "budget" in w.reasons["decode"]
    assert "on the held layout; faster elsewhere: fast-decode" in "\n".join(plan.describe())


def test_layout_budget_from_the_environment(monkeypatch):
    monkeypatch.setenv("ANATOMY_LAYOUT_BUDGET", "1MiB")
    plan = _plan(cache=False, memory_budget=None)
    assert plan.budget_bytes == 2 ** 20 and plan.for_layer("blocks.0.ffn.down").forms == ["b", "a"]
    monkeypatch.setenv("ANATOMY_LAYOUT_BUDGET", "lots")
    with pytest.raises(InputError, match="ANATOMY_LAYOUT_BUDGET 'lots' is not a size"):
        _plan(cache=False, memory_budget=None)


def test_a_spike_in_a_first_pass_prunes_no_kernel():
    """A kernel whose first timed call meets a spike of the host (here 300 times its cost) is timed a second
    time before it is pruned (over PRUNE_FACTOR times the fastest): its figure is its own, and a slower
    steady kernel is not chosen over it. One that is slow in both passes stays pruned."""
    count = [0]

    def bind(p):
        (w,) = p

        def run(x):
            count[0] += 1
            CLOCK.now += SLOW if count[0] == SPIKE_AT else FAST
            return F.linear(x, w)

        return run

    spiky = Kernel("spiky", A, torch.float32, bind)
    kernels = (spiky, _fake("steady", A, cost=3 * FAST), _fake("slow", A, cost=20 * FAST))
    phases = (Phase("decode", 1, None),)
    plan = _plan(linears=_linears(1), kernels=kernels, phases=phases, cache=False)
    ms = {m.kernel: m for m in plan.for_layer("blocks.0.ffn.down").measurements["decode"]}
    assert ms["spiky"].spread is not None and ms["spiky"].seconds == pytest.approx(FAST)
    assert plan.for_layer("blocks.0.ffn.down").choices == {"decode": "spiky"}
    assert ms["slow"].spread is None and "pruned" in ms["slow"].note


def test_a_tie_goes_to_the_more_accurate_kernel():
    rough = _fake("rough", A, cost=FAST, off=3e-3)  # accurate enough (3e-3 < 1e-2), the fastest
    close = _fake("close", A, cost=FAST * 1.04)  # 4% slower: tied, and exact
    far = _fake("far", A, cost=FAST * 1.2, off=0.0)  # 20% slower: not tied
    plan = _plan(cache=False, kernels=(rough, far))
    assert plan.for_layer("blocks.0.ffn.down").choices["decode"] == "rough"
    plan = _plan(cache=False, kernels=(rough, close, far))
    assert set(plan.for_layer("blocks.0.ffn.down").choices.values()) == {"close"}


def test_no_accurate_kernel_raises():
    with pytest.raises(InputError, match="no kernel computed it accurately"):
        _plan(cache=False, kernels=(WRONG, BROKEN))


def test_cache_hit_skips_measuring(tmp_path, monkeypatch):
    first = _plan()
    assert not first.from_cache and first.path is not None and first.path.is_relative_to(tmp_path / "cache")
    monkeypatch.setattr(plan_module, "measure_weight", _must_not_measure)
    second = _plan()
    assert second.from_cache and second.path == first.path
    assert second.to_json() == first.to_json()


def test_a_plan_chosen_by_older_rules_is_measured_again(monkeypatch):
    monkeypatch.setattr(plan_module, "RULES", plan_module.RULES - 1)
    assert not _plan().from_cache
    monkeypatch.setattr(plan_module, "RULES", plan_module.RULES + 1)
    assert not _plan().from_cache and _plan().from_cache


def _must_not_measure(*args, **kwargs):
    raise AssertionError("measured again although the plan was cached")


@pytest.mark.parametrize("damage", ["truncated", "garbage", "not a plan", "unknown kernel", "foreign machine"])
def test_damaged_or_foreign_cache_is_measured_again(damage):
    path = _plan().path
    data = json.loads(path.read_text())
    if damage == "truncated":
        path.write_text(path.read_text()[: len(path.read_text()) // 2])
    elif damage == "garbage":
        path.write_bytes(b"\x00\xff not json")
    elif damage == "not a plan":
        data["plan"]["weights"] = 5
        path.write_text(json.dumps(data))
    elif damage == "unknown kernel":
        data["plan"]["weights"][0]["choices"]["decode"] = "a-kernel-from-elsewhere"
        path.write_text(json.dumps(data))
    else:
        data["key"]["machine"]["cpu"] = "some other CPU"
        path.write_text(json.dumps(data))
    plan = _plan()
    assert not plan.from_cache and plan.for_layer("blocks.0.ffn.down").choices["decode"] == "fast-decode"
    assert _plan().from_cache  # the file was rewritten with a good plan


def test_key_separates_models_and_weights():
    a = _plan()
    assert _plan(model_id="another-model").path != a.path
    assert _plan(weights="f16").path != a.path
    assert _plan(linears=_linears(3)).path != a.path


def test_cache_directory_default_and_overrides(tmp_path, monkeypatch):
    monkeypatch.delenv("ANATOMY_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _plan().path.is_relative_to(tmp_path / "xdg" / "anatomy" / "plans")
    assert _plan(cache=tmp_path / "mine").path.is_relative_to(tmp_path / "mine")
    assert _plan(cache=False).path is None


def test_a_noisy_plan_is_kept_named_and_forgotten_on_asking(monkeypatch, capsys, tmp_path):
    """Every start of the same machine and model takes the same path: a plan measured under noise is
    kept and reused; `anatomy doctor` names it and `anatomy doctor --replan` forgets it."""
    from anatomy import installation
    from anatomy.cli import main
    from anatomy.kernels.cache import CACHE_ENV, noisy_plans

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))  # --replan forgets this test's plans only
    quiet = _plan(linears=_linears(5))
    monkeypatch.setattr(plan_record, "NOISE_LIMIT", float("inf"))
    assert quiet.path is not None and noisy_plans() == [] and installation.plans_fact().fix == ""
    monkeypatch.setattr(plan_record, "NOISE_LIMIT", -1.0)
    plan = _plan()
    assert plan.path is not None and "measured under noise" in plan.describe()[-1]
    again = _plan()
    assert again.from_cache and again.path == plan.path
    assert {k: w.choices for k, w in again.weights.items()} == {k: w.choices for k, w in plan.weights.items()}
    assert plan.path in noisy_plans() and quiet.path in noisy_plans(), "every plan is noisy under a limit of -1"
    fact = installation.plans_fact()
    assert fact.details["noisy"] == 2 and "--replan" in fact.fix
    assert main(["doctor", "--replan"]) == 0
    assert not plan.path.exists() and not quiet.path.exists() and noisy_plans() == []
    assert "forgot" in capsys.readouterr().err


def test_bad_phases_and_layers_raise():
    with pytest.raises(InputError, match="phases"):
        _plan(cache=False, phases=(Phase("prefill", 64, None), Phase("decode", 1, 4)))
    plan = _plan(cache=False)
    with pytest.raises(InputError, match="not in this kernel plan"):
        plan.for_layer("lm_head")
    with pytest.raises(InputError, match=r"plan is for f32\[32,64\]"):
        PlannedLinear.from_plan(plan, "blocks.0.ffn.down", FloatWeight.from_float(torch.randn(32, 128)), kernels=FAKES)


def test_planned_linear_routes_by_rows():
    calls = []
    kernels = (_fake("fast-decode", A, slow_above=4, calls=calls), _fake("fast-gemm", B, slow_upto=4, calls=calls))
    lin = _linears(1)
    plan = _plan(linears=lin, kernels=kernels, cache=False)
    layer = PlannedLinear.from_plan(plan, "blocks.0.ffn.down", lin["blocks.0.ffn.down"], kernels=kernels)
    calls.clear()
    for shape in [(1, 1, 64), (2, 2, 64), (8, 64), (3, 30, 64)]:
        layer(torch.randn(shape))
    assert calls == [("fast-decode", 1), ("fast-decode", 4), ("fast-gemm", 8), ("fast-gemm", 90)]
    assert set(layer.layouts) == {"a", "b"}


def test_a_prefill_only_layout_is_built_at_the_first_long_prompt():
    """A layout only the prefill phase reads is not built with the layer: calls of up to the rows that
    phase was timed on take the decode route; the first larger call builds it and every later call of more
    than the batch phase's rows takes it, with the same products."""
    calls = []
    kernels = (_fake("fast-small", A, slow_above=32, calls=calls), _fake("fast-large", B, slow_upto=32, calls=calls))
    lin = _linears(1)
    plan = _plan(linears=lin, kernels=kernels, cache=False)
    assert plan.for_layer("blocks.0.ffn.down").choices == {"decode": "fast-small", "batch": "fast-small",
                                                          "prefill": "fast-large"}
    layer = PlannedLinear.from_plan(plan, "blocks.0.ffn.down", lin["blocks.0.ffn.down"], kernels=kernels)
    assert set(layer.layouts) == {"a"}
    calls.clear()
    x = torch.randn(65, 64)
    want = x @ lin["blocks.0.ffn.down"].dequantize().T
    torch.testing.assert_close(layer(x[:64]), want[:64])
    assert calls == [("fast-small", 64)] and set(layer.layouts) == {"a"}
    torch.testing.assert_close(layer(x), want)
    assert set(layer.layouts) == {"a", "b"} and layer.opaque_bytes == 0
    layer(x[:40]), layer(x[:8])
    assert calls == [("fast-small", 64), ("fast-large", 65), ("fast-large", 40), ("fast-small", 8)]


def test_a_pending_prefill_takes_the_most_accurate_kernel_on_the_held_layout():
    """Before its layout is built, a short prefill runs on the held layout's kernel the plan measured most
    accurate (here a slower exact one), not the faster rounding one decode steps take."""
    calls = []
    rough = _fake("rough", A, slow_above=32, calls=calls)
    rough_bind = rough.bind
    rough = dataclasses.replace(rough, bind=lambda p: (lambda x, fn=rough_bind(p): fn(x.bfloat16().float())))
    kernels = (rough, _fake("exact", A, slow_upto=64, calls=calls), _fake("fast-large", B, slow_upto=32, calls=calls))
    lin = _linears(1)
    plan = _plan(linears=lin, kernels=kernels, cache=False)
    assert plan.for_layer("blocks.0.ffn.down").choices == {"decode": "rough", "batch": "rough", "prefill": "fast-large"}
    layer = PlannedLinear.from_plan(plan, "blocks.0.ffn.down", lin["blocks.0.ffn.down"], kernels=kernels)
    calls.clear()
    x = torch.randn(40, 64)  # more rows than the batch phase's 32, fewer than the prefill phase was timed on
    torch.testing.assert_close(layer(x), x @ lin["blocks.0.ffn.down"].dequantize().T)
    assert calls == [("exact", 40)] and set(layer.layouts) == {"a"}


def test_rows_far_from_a_sampled_one_take_the_fastest_kernel_on_the_prompt_layout():
    """Past the batch phase's rows, in a pass that names its sampled rows (sampled_rows.near_sampled), the rows
    within TAIL up to a sampled one take the prompt rule's kernel (here the exact one) and the others the
    layout's fastest (here one that rounds x to bf16); outside such a pass, or for a product of other rows,
    every row takes the prompt rule's."""
    calls = []
    rough = _fake("rough", A, calls=calls)
    rough_bind = rough.bind
    rough = dataclasses.replace(rough, bind=lambda p: (lambda x, fn=rough_bind(p): fn(x.bfloat16().float())))
    kernels = (rough, _fake("exact", A, cost=2 * FAST, calls=calls))
    lin = _linears(1)
    plan = _plan(linears=lin, kernels=kernels, cache=False)
    assert plan.for_layer("blocks.0.ffn.down").choices == {"decode": "rough", "batch": "rough", "prefill": "exact"}
    layer = PlannedLinear.from_plan(plan, "blocks.0.ffn.down", lin["blocks.0.ffn.down"], kernels=kernels)
    w = lin["blocks.0.ffn.down"].dequantize()
    x = torch.randn(2, 40, 64)
    exact, rounded = x @ w.T, x.bfloat16().float() @ w.T
    calls.clear()
    torch.testing.assert_close(layer(x), exact)
    assert calls == [("exact", 80)]
    calls.clear()
    with near_sampled([5, 39, 79], rows=80):  # two prompts of 40 rows: row 5's logits wanted too
        got = layer(x).view(80, 32)
        layer(x[:, :30])  # a product of other rows (an expert's share) keeps the prompt rule's kernel
    near = torch.zeros(80, dtype=torch.bool)
    near[0:6] = near[24:40] = near[64:80] = True
    torch.testing.assert_close(got[near], exact.view(80, 32)[near], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[~near], rounded.view(80, 32)[~near], rtol=1e-5, atol=1e-5)
    assert (got[~near] - exact.view(80, 32)[~near]).abs().max() > 1e-3  # the far rows did round
    assert calls == [("rough", 80), ("exact", 6), ("exact", 16), ("exact", 16), ("exact", 60)]


def test_planned_linear_with_real_kernels_and_dtype_contract(monkeypatch):
    monkeypatch.setattr(plan_timing, "clock", time.perf_counter)  # real kernels, real time
    lin = {"q": Int4Weight.from_float(torch.randn(64, 128)), "o": FloatWeight.from_float(torch.randn(64, 128))}
    plan = make_plan(lin, model_id="real", weights="mixed", phases=DEFAULT_PHASES, kernels=KERNELS, repeats=1,
                     cache=False)
    bias = torch.randn(64)
    for name, fmt in lin.items():
        w = fmt.dequantize()
        for dtype in (torch.float32, torch.bfloat16):
            layer = PlannedLinear.from_plan(plan, name, fmt, bias=bias, dtype=dtype)
            for shape in [(1, 1, 128), (2, 4, 128), (3, 50, 128)]:
                x = torch.randn(shape).to(torch.bfloat16)  # any float input dtype
                y = layer(x)
                assert y.dtype == dtype and y.shape == (*shape[:-1], 64)
                ref = x.double() @ w.double().T + bias.double()
                assert relative_error(y, ref) < 1e-2, (name, dtype, shape)


FBGEMM_RSS = """
import sys, torch
from anatomy.kernels.candidates import KERNELS_BY_NAME
from anatomy.kernels.planned_linear import PlannedLinear
from anatomy.kernels.sampled_rows import near_sampled
from anatomy.weights.formats import FloatWeight
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
fmt = FloatWeight.from_float(torch.randn(int(sys.argv[1]), int(sys.argv[2])))  # packed as it is: no temporaries
before = rss()
layers = [PlannedLinear.with_kernel(KERNELS_BY_NAME["f16/fbgemm"], fmt) for _ in range(16)]
print((rss() - before) / 16, layers[0].opaque_bytes)
"""


@pytest.mark.skipif("fbgemm" not in torch.backends.quantized.supported_engines, reason="this torch has no FBGEMM")
@pytest.mark.parametrize("shape", [(3072, 576), (576, 1536), (960, 576)])
def test_a_layout_that_is_no_tensor_is_counted_by_the_memory_it_takes(shape):
    """FBGEMM's packed fp16 weight is an opaque object: the layer counts it by the bytes FBGEMM holds,
    its tiles' padding included (K = 576 is packed as 1024 rows), as the process's resident memory
    grows by them (within 3%); the tensor layouts count by their storage (weight_bytes adds both)."""
    import subprocess
    import sys

    from anatomy.kernels.candidates import KERNELS_BY_NAME

    out = subprocess.run([sys.executable, "-c", FBGEMM_RSS, *map(str, shape)], check=True, capture_output=True,
                         text=True).stdout.split()
    grown, counted = float(out[0]), int(out[1])
    assert counted >= shape[0] * shape[1] * 2
    assert abs(grown - counted) < 0.03 * counted, (shape, grown, counted)
    assert PlannedLinear.with_kernel(KERNELS_BY_NAME["f32"], Int4Weight.from_float(torch.randn(64, 128))).opaque_bytes == 0


def test_phases_of_limits_a_layer_and_its_last_phase_takes_any_rows():
    calls = []
    kernels = (_fake("fast-decode", A, slow_above=4, calls=calls), _fake("fast-gemm", B, slow_upto=4, calls=calls))
    lin = {**_linears(1), "lm_head": FloatWeight.from_float(torch.randn(32, 64))}  # same signature, fewer phases
    plan = _plan(linears=lin, kernels=kernels, phases_of={"lm_head": ["decode"]})
    head = plan.for_layer("lm_head")
    assert head.phases == ["decode"] and head is not plan.for_layer("blocks.0.ffn.down")
    assert sum(line.startswith("prefill") for line in plan.describe()) == 1  # the blocks only
    layer = PlannedLinear.from_plan(plan, "lm_head", lin["lm_head"], kernels=kernels)
    calls.clear()
    layer(torch.randn(50, 64))
    assert calls == [("fast-decode", 50)]
    assert _plan(linears=lin, kernels=kernels, phases_of={"lm_head": ["decode"]}).from_cache
    with pytest.raises(InputError, match="phases_of"):
        _plan(linears=lin, kernels=kernels, phases_of={"lm_head": ["generate"]})
    with pytest.raises(InputError, match="not given"):
        _plan(linears=lin, kernels=kernels, phases_of={"blocks.9.ffn.down": ["decode"]})


def test_file_identity_changes_with_the_file(tmp_path):
    from anatomy.kernels.cache import file_identity

    f = tmp_path / "model.gguf"
    f.write_bytes(b"x" * 10)
    first = file_identity(f)
    assert first == file_identity(f) and str(f.resolve()) in first
    f.write_bytes(b"x" * 11)
    assert file_identity(f) != first
    assert file_identity(tmp_path) != file_identity(f)  # a directory: its files together


def test_the_plan_key_names_the_native_kernels_build():
    """A changed native kernel, or another vector path of it, is measured again: the machine key holds
    its build's digest and the code it runs."""
    from anatomy.kernels import native
    from anatomy.kernels.cache import machine_key
    from anatomy.kernels.native.build import library_path

    if not native.loaded():
        assert machine_key()["native"] == "none"
        return
    assert machine_key()["native"] == f"{library_path().stem}:{native.isa()}"
    with native.limited("portable"):
        assert machine_key()["native"] == f"{library_path().stem}:portable"


def test_timing_pools_fit_the_memory_the_machine_has(monkeypatch):
    """A form's timing pool copies it until the copies exceed twice the last-level cache, but never past
    1 / POOL_SHARE of the memory available over the weight's forms: a machine short of memory times on
    fewer copies (the first start of a large model must not need several times its size)."""
    fmt = FloatWeight.from_float(torch.randn(256, 256))  # 256 KiB
    kernel = next(k for k in KERNELS if k.name == "f32")
    monkeypatch.setattr(plan_timing, "llc_bytes", lambda: 4 << 20)
    monkeypatch.setattr(plan_timing, "MAX_COPIES", 64)
    prepared = kernel.form.build(fmt)
    assert len(plan_timing._pool(fmt, kernel, prepared)) == 32  # 2 x 4 MiB / 256 KiB
    assert len(plan_timing._pool(fmt, kernel, prepared, budget=3 << 18)) == 4  # the first and 3 more
    assert len(plan_timing._pool(fmt, kernel, prepared, budget=0)) == 1
    monkeypatch.setattr(plan_timing.heap, "available", lambda: 4 * plan_timing.POOL_SHARE << 18)  # 1 MiB a weight
    seen = []
    real = plan_timing._pool
    monkeypatch.setattr(plan_timing, "_pool", lambda *a: seen.append(len(real(*a))) or real(*a))
    plan_timing.measure_weight(fmt, phases=(Phase("decode", 1, 4),), kernels=(kernel,), threshold=1e-3, repeats=1)
    assert seen == [5]  # 1 MiB for its one form: 4 copies beside the first
