"""`anatomy profile` on the command line: JSON, Markdown, the plot and the page from a tiny model
saved as an HF directory; bad input as one line and exit 2 before anything is loaded; and the real
default model, whose op FLOPs add up to the analytic decode step."""

from __future__ import annotations

import json

import pytest

from anatomy.cli import main

from ..inference.conftest import llama_tiny

QUICK = ["--prompt-len", "8", "--new-tokens", "4"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    import anatomy

    path = tmp_path_factory.mktemp("tiny") / "llama"
    anatomy.save(llama_tiny(), path)
    return str(path)


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["profile", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_plot_and_page(tiny_dir, tmp_path, capsys):
    plot, page = tmp_path / "p.png", tmp_path / "p.html"
    code, out, err = _run(capsys, "--model", tiny_dir, *QUICK, "--sweep", "batch=1,2", "--json", "--plot", str(plot),
                          "--html", str(page))
    assert code == 0, err
    report = json.loads(out)
    assert report["model"]["architecture"] == "decoder" and report["options"]["weights"] == "f32"
    for d in report["phases"].values():
        assert d["ops_s"] + d["unattributed_s"] == pytest.approx(d["step_s"])
    decode = report["phases"]["decode"]  # the production step beside the eager one, split over the rows
    assert decode["tok_per_s"] == pytest.approx(1 / decode["production_step_s"]) and decode["eager_tok_per_s"] > 0
    assert sum(o["production_time_s"] for o in decode["ops"]) + decode["production_unattributed_s"] == \
        pytest.approx(decode["production_step_s"])
    assert [(r["sweep"], r["batch"]) for r in report["sweep"]] == [("batch", 1), ("batch", 2)]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = page.read_text(encoding="utf-8")
    assert 'id="decode"' in html and "svg class=\"chart roofline\"" in html and "data:image/png;base64" in html
    assert f"wrote {page}" in err


def test_markdown(tiny_dir, capsys):
    code, out, _ = _run(capsys, "--model", tiny_dir, *QUICK, "--markdown")
    assert code == 0
    for title in ("## This machine, measured in this run", "## decode: the positions of the decoder's map",
                  "## prefill: every op (summed over layers), per step", "## decode: what the prediction misses"):
        assert title in out
    assert "| QKV / FFN GEMM |" in out and "| stack.blocks.*.attn.qkv | linear |" in out
    assert "| step, production (captured, as anatomy.generate runs it; unprofiled) |" in out
    assert "production ms (split)" in out
    assert "production ms of a position (of an op: --json) = its profiled ms x production step / profiled step" in out


@pytest.mark.parametrize("argv, message", [
    (["--context", "100000"], "--context 100000 exceeds the model's context of 8192 tokens"),
    (["--prompt-len", "64", "--context", "70"], "--context 70 is too small: --prompt-len 64 + 2 warm-up"),
    (["--batch-size", "0"], "--batch-size 0 must be a positive integer"),
    (["--sweep", "batch=1,4096", "--context", "8192"], "--sweep batch=4096 needs about"),
    (["--sweep", "depth=2"], "--sweep 'depth=2': write KEY=V1,V2,..."),
    (["--what-if", "speed=fast"], "--what-if 'speed=fast': write SWITCH=VALUE"),
    (["--what-if", "attention=flash"], "--what-if attention=flash: the backends are sdpa, eager"),
    (["--weights", "int3"], "--weights 'int3' is not one of f32, f16, bf16"),
    (["--plot", "out.xyz"], "--plot out.xyz: .xyz is not an image format"),
    (["--model", "no-such-model"], "no-such-model"),
])
def test_bad_input_is_one_line_and_exit_2_before_loading(capsys, argv, message):
    code, out, err = _run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("anatomy profile: error: ") and message in err


def test_html_to_a_missing_folder_fails_first(tmp_path, capsys):
    code, _, err = _run(capsys, "--html", str(tmp_path / "nowhere" / "p.html"))
    assert code == 2 and "does not exist" in err


@pytest.mark.slow
def test_the_default_model(capsys):
    """SmolLM2-135M-Instruct through the engine: every decode op matched, FLOPs equal to the analytic
    decode step, the tied LM head reading the whole matrix in its kernel's layout, and the JSON keys of the issue."""
    from anatomy.analysis import flops
    from anatomy.checkpoints.loader import load_config

    code, out, err = _run(capsys, "--prompt-len", "32", "--new-tokens", "8", "--json")
    assert code == 0, err
    report = json.loads(out)
    config = load_config("smollm2-135m-instruct")
    decode = report["phases"]["decode"]
    o = report["options"]
    assert sum(r["flops"] or 0 for r in decode["ops"]) == flops.decode_flops(
        config, batch=1, context=o["context"], source_len=o["prompt_len"]).total
    head = next(r for r in decode["ops"] if r["module"] == "lm_head" and r["op"] == "linear")
    assert head["position"] == "lm_head" and head["kernel"]  # the engine's plan names the head's kernel
    # the [49152, 576] matrix as that kernel's layout holds it (4 bits a value at the least), all of it read
    assert head["bytes"] >= head["kernel_weight_bytes"] >= 49152 * 576 // 2
    gemms = [r for r in decode["ops"] if r["position"] == "qkv_ffn_gemm" and r["op"] == "linear"]
    assert len(gemms) == 4 and all(r["calls"] == config.n_layers for r in gemms)
    for phase in ("prefill", "decode"):
        d = report["phases"][phase]
        assert d["ops_s"] + d["unattributed_s"] == pytest.approx(d["step_s"])
        assert set(d["positions"]) >= {"qkv_ffn_gemm", "rope_attention", "residual_norm", "kv_cache", "lm_head"}
    assert report["machine"]["bandwidth_bytes_per_s"] > 0 and report["machine"]["peak_flops_per_s"] > 0
