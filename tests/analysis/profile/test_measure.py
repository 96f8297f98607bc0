"""anatomy profile on tiny random models of every family: the reconciliation identities, the
mapping of ops to trace rows and positions, FLOPs and bytes from the trace, verdicts, sweeps and
what-ifs (the checks before a run: test_checks.py). No wall-clock time is asserted: only
sums, structure and bounds that hold on any machine."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from anatomy import build_model, get_preset
from anatomy.analysis import flops, trace
from anatomy.analysis.hardware import Hardware
from anatomy.analysis.profile.measure import ProfileOptions, measure as profile
from anatomy.analysis.profile.match import canonical, layer_kinds, op_name
from anatomy.analysis.profile.rows import Roofs, Row, row_dict
from anatomy.analysis.profile.sweep import fit_ridge, parse_sweep
from anatomy.analysis.profile.whatif import parse_what_if
from anatomy.errors import InputError

from ...inference.conftest import SMALL, gpt2_tiny, llama_tiny, seq2seq_tiny

MACHINE = Hardware("test", {"f32": 1e11, "bf16": 2e11, "any": 1e11}, 2e10)  # fixed roofs: nothing measured
OPTIONS = ProfileOptions(prompt_len=8, new_tokens=4, warmup=1, prefill_runs=4)


llama = llama_tiny


def bert():
    return build_model(get_preset("bert-base", **SMALL, n_layers=2, d_ff=128)).eval()


@pytest.fixture(scope="module")
def reports():
    torch.manual_seed(0)
    return {name: profile(make(), options=OPTIONS, machine=MACHINE, name=name)
            for name, make in (("llama", llama_tiny), ("gpt2", gpt2_tiny), ("bert", bert), ("seq2seq", seq2seq_tiny))}


@pytest.mark.parametrize("family, phases", [("llama", {"prefill", "decode"}), ("gpt2", {"prefill", "decode"}),
                                            ("bert", {"prefill"}), ("seq2seq", {"prefill", "decode"})])
def test_every_family_has_its_phases_and_they_reconcile(reports, family, phases):
    report = reports[family]
    assert set(report["phases"]) == phases
    for d in report["phases"].values():
        # the rows (ops and each module's Python) plus the unattributed time are the profiled step
        assert d["ops_s"] + d["unattributed_s"] == pytest.approx(d["step_s"], rel=1e-9)
        assert sum(o["time_s"] for o in d["ops"]) == pytest.approx(d["ops_s"], rel=1e-9)
        assert sum(d["positions"].values()) == pytest.approx(d["ops_s"], rel=1e-9)
        assert d["unattributed_s"] >= 0 and all(o["time_s"] >= 0 for o in d["ops"])
        assert d["profiler_overhead_s"] == pytest.approx(d["step_s"] - d["unprofiled_step_s"])
        assert d["eager_tok_per_s"] == pytest.approx(d["tokens_per_step"] / d["unprofiled_step_s"])
        # tok/s is the production step's where one is measured (a decoder's decode), else the unprofiled step's
        assert d["tok_per_s"] == pytest.approx(d["tokens_per_step"] / d.get("production_step_s",
                                                                           d["unprofiled_step_s"]))
        assert d["steps_used"] <= d["steps_measured"] and d["steps_used"] >= 1
    produced = {phase for phase, d in report["phases"].items() if "production_step_s" in d}
    assert produced == ({"decode"} if family in ("llama", "gpt2") else set())


def test_json_keys_of_the_issue(reports):
    report = reports["llama"]
    assert {"bandwidth_bytes_per_s", "peak_flops_per_s"} <= set(report["machine"])
    assert report["machine"]["bandwidth_bytes_per_s"] == MACHINE.bandwidth
    for d in report["phases"].values():
        assert {"step_s", "ops_s", "unattributed_s", "tok_per_s", "eager_tok_per_s", "predicted_tok_per_s",
                "positions", "ops"} <= set(d)
        for o in d["ops"]:
            assert {"module", "op", "shapes", "flops", "bytes", "time_s", "flops_per_s", "bytes_per_s",
                    "roofline_s", "bound"} <= set(o)
            assert o["bound"] in ("compute", "bandwidth", "overhead")
    decode = report["phases"]["decode"]
    assert {"production_step_s", "production_context", "production_captured_graphs", "production_native_blocks",
            "production_positions", "production_unattributed_s"} <= set(decode)
    assert all("production_time_s" in o for o in decode["ops"])
    assert not any("production_time_s" in o for o in report["phases"]["prefill"]["ops"])


def test_the_production_step_is_captured_and_split_by_the_eager_shares():
    """The decode step anatomy.generate runs (the kept engine with its defaults) is timed after its
    capture; its time is split over the rows by their shares of the profiled eager step, so the split
    adds up to it, and no FLOP or byte figure moves."""
    from anatomy.inference.engine import engine_for

    model = llama()
    report = profile(model, options=dataclasses.replace(OPTIONS, phases=("decode",), rounds=1), machine=MACHINE)
    d = report["phases"]["decode"]
    engine = engine_for(model)  # the production engine: anatomy.generate's for this model
    assert d["production_captured_graphs"] == engine.captured_graphs
    if engine.captured:
        assert engine.captured_graphs > 0
    assert d["production_native_blocks"] == engine.native_blocks
    assert d["production_context"] >= report["options"]["context"]  # the engine rounds its cache up
    assert d["production_step_s"] > 0 and d["tok_per_s"] == pytest.approx(1 / d["production_step_s"])
    split = [o["production_time_s"] for o in d["ops"]]
    assert math.fsum(split) + d["production_unattributed_s"] == pytest.approx(d["production_step_s"], rel=1e-9)
    assert math.fsum(d["production_positions"].values()) == pytest.approx(math.fsum(split), rel=1e-9)
    scale = d["production_step_s"] / d["step_s"]
    assert all(o["production_time_s"] == pytest.approx(o["time_s"] * scale) for o in d["ops"])
    assert sum(o["flops"] or 0 for o in d["ops"]) == flops.decode_flops(
        model.config, batch=1, context=report["options"]["context"], source_len=report["options"]["prompt_len"]).total


def test_no_production_step_where_the_context_has_no_room_for_its_capture():
    report = profile(llama(), options=ProfileOptions(prompt_len=40, new_tokens=2, warmup=1, rounds=1,
                                                     phases=("decode",)), machine=MACHINE)
    d = report["phases"]["decode"]  # 40 + 4 slots + the 33 steps before a capture > the model's 64
    assert "production_step_s" not in d and d["tok_per_s"] == d["eager_tok_per_s"]


def test_decode_ops_are_the_trace_rows_summed_over_layers(reports):
    """Each block row carries the trace row's FLOPs and bytes times the layers; their FLOPs add up to
    the analytic decode step of analysis/flops.py."""
    model = llama()
    config = model.config
    o = reports["llama"]["options"]
    rows = {(r["module"], r["op"]): r for r in reports["llama"]["phases"]["decode"]["ops"]}
    traced = trace.trace(config, phase="decode", batch=1, seq=o["prompt_len"], context=o["context"],
                         attention="sdpa")
    qkv = next(t for t in traced if t.module == "stack.blocks.0.attn.qkv")
    row = rows[("stack.blocks.*.attn.qkv", "linear")]
    assert row["calls"] == config.n_layers
    assert row["flops"] == qkv.flops * config.n_layers and row["bytes"] == qkv.bytes * config.n_layers
    assert row["shapes"] == {"inputs": qkv.inputs, "output": qkv.output}
    sdpa = rows[("stack.blocks.*.attn", "scaled_dot_product_attention")]
    assert sdpa["shapes"]["inputs"][1][2] == o["context"]  # K of all T cache slots
    timed = sum(r["flops"] or 0 for r in reports["llama"]["phases"]["decode"]["ops"])
    assert timed == flops.decode_flops(config, batch=1, context=o["context"], source_len=o["prompt_len"]).total


def test_a_causal_kernels_row_is_the_traced_attention_at_the_pairs_it_computes(native_forced):
    """A fresh prompt's attention, run by anatomy's causal kernel, is the trace's attention row (its shapes,
    its bytes) with the FLOPs of the query-key pairs at or before each query: 4 H d flops a pair (q k^T and
    the weights @ v), counted by analysis/flops.py, about half of the trace's full S x S."""
    model = llama()
    config, S = model.config, OPTIONS.prompt_len
    report = profile(model, options=OPTIONS, machine=MACHINE)
    rows = {(r["module"], r["op"]): r for r in report["phases"]["prefill"]["ops"]}
    row = rows[("stack.blocks.*.attn", "scaled_dot_product_attention")]
    assert row["via"] == "causal_attention" and row["calls"] == config.n_layers
    traced = trace.trace(config, phase="prefill", batch=1, seq=S, context=S, attention="sdpa")
    sdpa = next(t for t in traced if t.module == "stack.blocks.0.attn" and t.op == "scaled_dot_product_attention")
    assert row["shapes"] == {"inputs": sdpa.inputs, "output": sdpa.output}
    assert row["bytes"] == sdpa.bytes * config.n_layers
    pairs = flops.attended_pairs(S, S, causal=True)
    assert row["flops"] == pytest.approx(4 * config.n_heads * config.head_dim * pairs * config.n_layers, rel=1e-12)
    assert row["flops"] < sdpa.flops * config.n_layers


def test_positions_follow_the_module_kinds(reports):
    ops = reports["llama"]["phases"]["decode"]["ops"]
    where = {(o["module"], o["op"]): o["position"] for o in ops}
    for linear in ("attn.qkv", "attn.out", "ffn.gate_up", "ffn.down"):
        assert where[(f"stack.blocks.*.{linear}", "linear")] == "qkv_ffn_gemm"
    assert where[("stack.blocks.*.attn", "scaled_dot_product_attention")] == "rope_attention"
    assert where[("stack.blocks.*.attn", "index_copy_")] == "kv_cache"
    assert where[("stack.blocks.*.attn_norm", "rms_norm")] == "residual_norm"
    assert where[("stack.blocks.*", "add")] == "residual_norm"
    assert where[("lm_head", "linear")] == "lm_head"
    assert where[("stack.embed.tokens", "embedding")] == "embedding"
    chosen = {o["op"]: o["position"] for o in ops if o["module"] == "engine:sampling"}
    assert chosen["argmax"] == "sampling" and set(chosen.values()) == {"sampling"}, chosen  # anatomy::argmax
    decode = reports["llama"]["phases"]["decode"]["positions"]
    assert decode["qkv_ffn_gemm"] > 0 and decode["rope_attention"] > 0 and decode["kv_cache"] > 0


def test_seq2seq_prefill_is_the_encoder_and_the_cross_attention_projection(reports):
    prefill = {o["module"] for o in reports["seq2seq"]["phases"]["prefill"]["ops"]}
    assert "encoder.blocks.*.attn.qkv" in prefill and "decoder.blocks.*.cross_attn.kv" in prefill
    assert "decoder.blocks.*.attn.qkv" not in prefill
    decode = {o["module"] for o in reports["seq2seq"]["phases"]["decode"]["ops"]}
    assert "decoder.blocks.*.cross_attn.q" in decode and "encoder.blocks.*.attn.qkv" not in decode


def test_the_callers_model_is_untouched():
    model = llama()
    linear_classes = {type(m) for m in model.modules()}
    profile(model, options=OPTIONS, machine=MACHINE)
    assert {type(m) for m in model.modules()} == linear_classes
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_real_weight_bytes_replace_the_traced_ones():
    """int8 weights: a linear row reads what its planned kernel's layout holds, and shows the bytes
    of the format as loaded beside it (codes + scales), not the trace's 4 bytes per weight."""
    from anatomy.inference.engine import engine_for
    from anatomy.analysis.profile.api import converted

    model = converted(llama_tiny(), "int8")
    report = profile(model, options=ProfileOptions(prompt_len=8, new_tokens=2, warmup=1, prefill_runs=2, rounds=1,
                                                   phases=("decode",)), machine=MACHINE)
    row = next(o for o in report["phases"]["decode"]["ops"] if o["module"] == "stack.blocks.*.attn.qkv")
    fmt = model.stack.blocks[0].attn.qkv.compact
    assert row["weight_bytes"] == 2 * fmt.nbytes  # two layers
    w = engine_for(model, capture=False).plan.for_layer("stack.blocks.0.attn.qkv.weight")  # the profile's engine
    kernel = w.choices["decode"]
    assert row["kernel"] == kernel
    from anatomy.kernels.candidates import KERNELS_BY_NAME

    read = w.form_bytes[KERNELS_BY_NAME[kernel].form.name]
    assert row["kernel_weight_bytes"] == 2 * read
    x, out = 64 * 4, fmt.shape[0] * 4  # f32 activations in the trace (the engine's dtype may differ)
    element = 2 if report["options"]["compute_dtype"] == "bf16" else 4
    x, out = x // 4 * element, out // 4 * element
    assert row["bytes"] == 2 * (x + read + out)


@pytest.mark.parametrize("flops_, bytes_, seconds, bound", [
    (1e9, 1e3, 0.011, "compute"),  # 10 ms at the 1e11 peak; the bytes are nothing
    (1e3, 1e9, 0.06, "bandwidth"),  # 50 ms at 2e10 B/s
    (1e3, 1e8, 0.1, "bandwidth"),  # 20x above its 5 ms roof: a slow kernel (a miss), not overhead
    (1e3, 1e4, 1e-4, "overhead"),  # 0.5 us at its roof, below the 10 us one op takes: latency
    (0, 0, 1e-6, "overhead"),  # a view: nothing to put on a roof
])
def test_verdicts(flops_, bytes_, seconds, bound):
    from anatomy.analysis.profile.match import RowKey
    from anatomy.analysis.trace import TraceRow

    row = Row(RowKey("m", "", 0, "op"), "qkv_ffn_gemm", TraceRow("decode", "m", "op", [], [], flops_, bytes_),
              time_s=seconds, calls=1)
    d = row_dict(row, Roofs(1e11, 2e10, 1e-5))
    assert d["bound"] == bound
    assert d["roofline_s"] == max(flops_ / 1e11, bytes_ / 2e10)


@pytest.mark.parametrize("kernel, peak", [("q4t16", 8e11), ("q4t", 8e11), ("q8x", 8e11), ("q4t16/amx", 3e12),
                                          ("q4f", 1e11), ("int4pack", 1e11), (None, 1e11)])
def test_a_linear_row_is_roofed_by_the_products_its_kernel_runs(kernel, peak):
    """Integer products (int8 and int16 activations on VNNI, AMX) run under their own measured peak; float
    ones (and a row without a planned kernel) under the compute dtype's matmul peak."""
    from anatomy.analysis.profile.match import RowKey
    from anatomy.analysis.profile.weights import LinearWeight
    from anatomy.analysis.trace import TraceRow

    from anatomy.kernels.candidates import KERNELS_BY_NAME

    weight = LinearWeight((64, 64), 4096, kernel, 4096, products=KERNELS_BY_NAME[kernel].products) if kernel else None
    row = Row(RowKey("m", "", 0, "linear"), "qkv_ffn_gemm", TraceRow("prefill", "m", "linear", [], [], 1e10, 1e3),
              time_s=1.0, calls=1, weight=weight)
    d = row_dict(row, Roofs(1e11, 2e10, 1e-5, integer={"int8": 8e11, "amx": 3e12}))
    assert d["roofline_s"] == pytest.approx(1e10 / peak) and d["bound"] == "compute"
    assert row_dict(row, Roofs(1e11, 2e10, 1e-5))["roofline_s"] == pytest.approx(1e10 / 1e11)  # none measured


def test_the_integer_peaks_are_measured_only_where_the_cpu_runs_them():
    """The int8 roof is VNNI's instruction rate on every thread: above what one product of the int8 tiles
    reaches (their loop does more than the multiply-adds), and absent under a limit below VNNI."""
    from anatomy.analysis.hardware import measure_integer_peaks
    from anatomy.kernels import native

    if not native.loaded() or not native.runs("avx512-vnni"):
        pytest.skip(f"this CPU runs {native.isa()}: no AVX-512 VNNI products to measure")
    with pytest.raises(RuntimeError, match="iterations = 0: must be positive"):
        torch.ops.anatomy.integer_peak(0)
    peaks = measure_integer_peaks(repeats=3)
    assert ("amx" in peaks) == native.runs("amx")
    codes = torch.randint(-127, 128, (512, 512), dtype=torch.int8, generator=torch.Generator().manual_seed(0))
    tiles, x = torch.ops.anatomy.pack_q8_tiles(codes, torch.full((512, 16), 1e-2)), torch.randn(64, 512)
    best = min(_seconds(lambda: torch.ops.anatomy.q8_tiles_linear(x, tiles, False, 8)) for _ in range(3))
    assert peaks["int8"] > 2 * 64 * 512 * 512 / best
    with native.limited("avx512"):
        assert measure_integer_peaks(repeats=1) == {} and torch.ops.anatomy.integer_peak(10) == 0.0


def _seconds(fn) -> float:
    import time

    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def test_a_given_machines_roofs_are_its_own():
    """integer_roofs measures nothing on a Hardware the caller gave (a test's or a named accelerator's roofs)."""
    from anatomy.analysis.profile.machine import Machine

    machine = Machine(MACHINE)
    assert machine.integer_roofs() is MACHINE and machine.roofs("f32") is MACHINE


def test_the_attention_pairs_by_name_with_the_one_unmatched_row():
    """Around the attention the trace gathers the cache (index_select, repeat) where the engine reads it in
    place: the attention op still takes the attention row, and no other op pairs by name alone."""
    from anatomy.analysis.profile.match import _align

    trace_ops = ["view", "reshape", "index_select", "view", "transpose", "reshape", "repeat",
                 "scaled_dot_product_attention", "reshape", "transpose", "reshape"]
    ops = ["view", "to", "scaled_dot_product_attention", "transpose", "reshape", "mul"]
    out = _align(trace_ops, ops)
    assert out[2] == 7 and out[1] is None and out[5] is None
    assert _align(trace_ops + ["scaled_dot_product_attention"], ops)[2] is None  # two rows: no guess


def test_predicted_keeps_overhead_rows_at_their_time(reports):
    d = reports["llama"]["phases"]["decode"]
    bound = [o for o in d["ops"] if o["bound"] != "overhead"]
    excess = sum(o["time_s"] - o["roofline_s"] for o in bound)
    rest = d["unprofiled_step_s"] - sum(o["time_s"] for o in bound)
    assert d["predicted_step_s"] == pytest.approx(sum(o["roofline_s"] for o in bound) + max(0.0, rest))
    if rest >= 0:  # the prediction misses by the bound rows' time above their roofs, exactly
        assert d["unprofiled_step_s"] - d["predicted_step_s"] == pytest.approx(excess)
    assert d["predicted_tok_per_s"] == pytest.approx(1 / d["predicted_step_s"])
    assert d["miss"]["ratio"] == pytest.approx(d["unprofiled_step_s"] / d["predicted_step_s"])


def test_layer_kinds_and_names():
    assert canonical("stack.blocks.12.attn.qkv") == ("stack.blocks.*.attn.qkv", 12)
    assert canonical("lm_head") == ("lm_head", None)
    assert op_name("__getitem__") == op_name("select") == "getitem"
    assert op_name("split_with_sizes") == op_name("split")
    mixed = get_preset("gemma-2-9b", **SMALL, n_layers=4, n_kv_heads=2, head_dim=16, sliding_window=8,
                       sliding_window_layers=(0, 2))
    first, kinds = layer_kinds(mixed)
    assert set(first.values()) == {0, 1} and kinds[2] == kinds[0] != kinds[1]
    assert layer_kinds(get_preset("llama-7b", **SMALL, n_layers=2)) == ({"": 0}, {0: "", 1: ""})


def test_a_stack_of_two_kinds_matches_each_layer_to_its_kind():
    config = get_preset("gemma-2-9b", **SMALL, n_layers=4, n_kv_heads=2, head_dim=16, sliding_window=8,
                        sliding_window_layers=(0, 2), d_ff=96, attn_softcap=None)  # a softcap has no sdpa
    report = profile(build_model(config).eval(), machine=MACHINE,
                     options=ProfileOptions(prompt_len=12, new_tokens=2, warmup=1, prefill_runs=2, rounds=1))
    modules = {o["module"] for o in report["phases"]["decode"]["ops"]}
    assert any(m.startswith("stack.blocks.*.attn (window 8)") for m in modules)
    assert any(m.startswith("stack.blocks.*.attn (dense, full attention)") for m in modules)
    sdpa = [o for o in report["phases"]["decode"]["ops"] if o["op"] == "scaled_dot_product_attention"]
    assert len(sdpa) == 2 and all(o["calls"] == 2 and o["flops"] for o in sdpa)


def test_fit_ridge():
    xs = [1, 2, 4, 8, 16, 32, 64]
    assert fit_ridge(xs, [max(10.0, 1.25 * x) for x in xs]) == pytest.approx(8.0)
    assert fit_ridge(xs, [10.0] * len(xs)) is None
    assert fit_ridge([1, 2], [1.0, 2.0]) is None


def test_sweep_and_what_if_parsing():
    assert parse_sweep("batch=4,1,2,2") == ("batch", [1, 2, 4])
    assert parse_what_if("weights=bf16") == ("weights", "bf16")
    for bad in ("batch", "depth=1,2", "batch=1,x", "batch=0"):
        with pytest.raises(InputError, match="--sweep"):
            parse_sweep(bad)
    for bad in ("weights", "speed=fast", "batch=two", "batch="):
        with pytest.raises(InputError, match="--what-if"):
            parse_what_if(bad)


def test_sweep_rows_and_what_if_rows():
    from anatomy.analysis.profile.api import run_session

    report = run_session(llama(), weights="f32", options=ProfileOptions(prompt_len=8, new_tokens=2, warmup=1,
                                                                        prefill_runs=2, rounds=1),
                         sweeps=[("batch", [1, 2, 4]), ("context", [16, 24])], what_ifs=[("attention", "eager"),
                                                                                        ("weights", "bf16")],
                         machine=MACHINE)
    rows = report["sweep"]
    assert [(r["sweep"], r["batch"], r["context"]) for r in rows] == [
        ("batch", 1, 16), ("batch", 2, 16), ("batch", 4, 16), ("context", 1, 16), ("context", 1, 24)]  # 12 in blocks of 16
    for r in rows:
        assert {"batch", "context", "tok_per_s", "predicted_tok_per_s"} <= set(r) and r["tok_per_s"] > 0
    assert "production_step_s" in report["phases"]["decode"]  # the main run only: sweeps and what-ifs are eager
    assert rows[4]["attention_bytes"] > rows[3]["attention_bytes"]  # more cache slots read
    assert "predicted_batch" in report["ridge"]
    switches = [w["switch"] for w in report["what_if"]]
    assert switches == ["attention=eager", "weights=bf16"]
    for w in report["what_if"]:
        assert set(w["phases"]) == {"prefill", "decode"}
        for phase, p in w["phases"].items():
            assert p["before_step_s"] > 0 and p["after_step_s"] > 0
            assert p["before_tok_per_s"] == report["phases"][phase]["eager_tok_per_s"]
            assert all(len(v) == 2 for v in p["positions"].values())


def test_named_hardware_prediction(reports):
    from anatomy.analysis.hardware import BUILTIN
    from anatomy.analysis.profile.measure import named_prediction
    from anatomy.analysis.profile.workloads import Shape

    o = reports["llama"]["options"]
    out = named_prediction(llama().config, BUILTIN["h100-sxm"], Shape(1, o["prompt_len"], o["context"]), "f32",
                           reports["llama"]["phases"])
    assert out["decode"]["bound"] == "memory" and math.isfinite(out["decode"]["tok_per_s"])


def test_the_2026_families_place_latent_attention_sinks_and_windows():
    """DeepSeek's latent attention: its absorbed up-projections (einsum) are GEMMs, its attention over the
    cached latent is attention, the latent's write is the KV cache, and the timed FLOPs are the analytic
    decode step's; gpt-oss's sinks (a column of the eager softmax) and Gemma 3's windowed layers are attention."""
    from ...inference.conftest import deepseek_tiny, gemma3_tiny, gpt_oss_tiny

    torch.manual_seed(0)
    latent = deepseek_tiny()
    report = profile(latent, options=OPTIONS, machine=MACHINE, name="deepseek")
    o, ops = report["options"], report["phases"]["decode"]["ops"]
    where = {(r["module"], r["op"]): r["position"] for r in ops}
    attn = "stack.blocks.*.attn (experts)"
    assert where[(attn, "einsum")] == "qkv_ffn_gemm"
    assert where[(attn, "scaled_dot_product_attention")] == "rope_attention"
    assert where[(attn, "index_copy_")] == "kv_cache"
    assert where[("stack.blocks.*.attn.kv_a (experts)", "linear")] == "qkv_ffn_gemm"
    assert sum(r["flops"] or 0 for r in ops) == flops.decode_flops(latent.config, batch=1, context=o["context"],
                                                                    source_len=o["prompt_len"]).total
    sinks = profile(gpt_oss_tiny(), options=OPTIONS, machine=MACHINE, name="gpt-oss")["phases"]["decode"]["ops"]
    assert {r["position"] for r in sinks if r["op"] == "softmax" and r["module"].startswith("stack.blocks.*.attn ")} \
        == {"rope_attention"}
    windows = profile(gemma3_tiny(), options=OPTIONS, machine=MACHINE, name="gemma3")["phases"]["decode"]["ops"]
    assert {r["position"] for r in windows
            if r["module"] == "stack.blocks.*.attn (window 4)" and r["op"] == "scaled_dot_product_attention"} \
        == {"rope_attention"}
