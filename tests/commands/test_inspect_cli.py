"""`anatomy inspect` and `anatomy compare` run as the real console script, in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from anatomy.cli import main


def _anatomy(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "anatomy", *args], capture_output=True, text=True, timeout=300,
                            check=False)
    if check:
        assert result.returncode == 0, result.stderr
    return result


@pytest.mark.slow
def test_inspect_json_reproduces_the_seed_figures(tmp_path):
    plot = tmp_path / "llama.png"
    out = _anatomy("inspect", "--model", "llama-2-7b", "--json", "--seq-len", "10", "--context", "4096", "--dtype",
                   "f16", "--kv-dtype", "f16", "--hardware", "h100-sxm", "--tokens", "1e12", "--gpus", "512", "--mfu",
                   "0.45", "--plot", str(plot))
    report = json.loads(out.stdout)
    assert report["params"]["total"] == 6_738_415_616
    assert report["params"]["per_layer"] == 202_383_360
    assert {c["name"] for c in report["params"]["components"]} >= {"token embedding", "attention Q/K/V", "LM head"}
    assert report["memory"]["kv_cache_bytes"] == 2_147_483_648  # 4096 tokens, fp16, one sequence
    assert report["memory"]["kv_cache_bytes_per_token"] == 524_288
    assert report["memory"]["weights_bytes"] == 2 * 6_738_415_616
    flops = report["flops"]
    assert flops["forward"] == flops["flop_counter_forward"] and flops["flop_counter_matches"]
    assert flops["forward_per_token"] == flops["forward"] / 10
    assert flops["training_per_token"] == pytest.approx(3 * flops["forward_per_token"])
    training = report["training"]  # 6N with the exact N: 4.04e22 FLOPs, ~2.0 days on 512 H100s at 45% MFU
    assert training["total_flops"] == pytest.approx(6 * 6_738_415_616 * 1e12)
    assert round(training["wall_days"], 2) == 2.05
    assert report["roofline"]["decode"]["bound"] == "memory"
    prefill_scores = [r for r in report["trace"] if r["phase"] == "prefill" and r["note"].startswith("scores")]
    decode_scores = [r for r in report["trace"] if r["phase"] == "decode" and r["note"].startswith("scores")]
    assert prefill_scores[0]["output"] == [1, 32, 10, 10] and decode_scores[0]["output"] == [1, 32, 1, 4096]
    assert set(report["trace"][0]) >= {"op", "inputs", "output", "flops", "bytes"}
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_inspect_markdown():
    md = _anatomy("inspect", "--model", "bert-base", "--markdown", "--seq-len", "512").stdout
    assert "| per layer |  |  |  | 7,087,872 |" in md
    assert "| total (exact) |  |  |  | 109,482,240 |" in md
    assert "| one layer | 8,053,063,680 |" in md  # seed 004 at n=512, with the QK^T and AV matmuls
    assert "forward without attention matmuls" in md


def test_terminal_tables(capsys):
    assert main(["inspect", "--model", "smollm2-135m", "--seq-len", "16", "--context", "64"]) == 0  # rich, not a tty
    terminal = capsys.readouterr().out
    assert "Post-Norm" not in terminal and "Pre-Norm" in terminal and "GQA H=9 H_kv=3" in terminal
    assert "Shape trace: decode" in terminal


def test_mermaid_only(capsys):
    assert main(["inspect", "--model", "gpt2", "--mermaid"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("flowchart TB") and "MLP gelu_tanh" in out and "LayerNorm" in out


@pytest.mark.slow
def test_compare_side_by_side():
    out = _anatomy("compare", "llama-7b", "llama-3-8b", "--markdown", "--seq-len", "32", "--context", "128").stdout
    assert "| parameters | 6,738,415,616 | 8,030,261,248 |" in out
    assert "| KV cache per token | 524,288 B (512.00 KiB) | 131,072 B (128.00 KiB) |" in out


BAD_INPUT = [
    (["inspect", "--model", "llama-7"], "unknown preset 'llama-7'; did you mean llama-7b"),
    (["compare", "gpt2", "llama-7b", "--hardware", "HWFILE"], "has no peak figures"),
    (["inspect", "--model", "llama-7b", "--batch-size", "0"], "--batch-size 0 must be a positive integer"),
    (["inspect", "--model", "llama-7b", "--seq-len", "-3"], "--seq-len -3 must be a positive integer"),
    (["inspect", "--model", "llama-7b", "--mfu", "1.5"], "--mfu 1.5 is outside (0, 1]"),
    (["inspect", "--model", "llama-7b", "--mfu", "0"], "--mfu 0 is outside (0, 1]"),
    (["inspect", "--model", "llama-7b", "--kv-dtype", "fp8"], "--kv-dtype 'fp8' is not one of f32, f16, bf16, int8, int4"),
    (["inspect", "--model", "llama-7b", "--dtype", "q4"], "--dtype 'q4' is not one of f32, f16, bf16, int8, int4"),
    (["inspect", "--model", "bert-base", "--seq-len", "1024"], "--seq-len 1024 exceeds max_seq_len=512"),
    (["inspect", "--model", "CONFIGFILE"], "model_type='mamba' is not supported"),
    (["inspect", "--model", "llama-7b", "--gpus", "two"], "argument --gpus: invalid int value: 'two'"),
    (["inspect"], "no model to inspect: give one with --model"),
    (["inspect", "gpt2", "--model", "llama-7b"], "two models: --model llama-7b and gpt2"),
    (["compare", "gpt2", "--hardware", "tpu"], "unknown hardware 'tpu'"),
    (["compare", "gpt2", "--context", "0"], "--context 0 must be a positive integer"),
    (["inspect", "--model", "llama-7b", "--speculative", "0"], "--speculative 0 must be an integer >= 1"),
    (["inspect", "--model", "llama-7b", "--acceptance", "0.5"], "--acceptance needs --speculative K"),
    (["inspect", "--model", "llama-7b", "--speculative", "4", "--acceptance", "1.5"], "--acceptance 1.5 is outside [0, 1]"),
    (["inspect", "--model", "bert-base", "--speculative", "4"], "speculative decoding needs a decoder-only model"),
    (["inspect", "--model", "llama-7b", "--speculative", "4", "--draft-model", "gpt2"],
     "the draft's vocabulary (50257 tokens) differs from the model's (32000)"),
    (["inspect", "--model", "llama-7b", "--speculative", "4", "--draft-layers", "40"], "--draft-layers 40 must be in [1, 32]"),
    (["inspect", "--model", "llama-7b", "--speculative", "64", "--context", "64"],
     "--speculative 64 is beyond the decode context --context 64"),
]


def _bad_args(tmp_path, args):
    hardware = tmp_path / "gpu.json"
    hardware.write_text(json.dumps({"name": "x", "bandwidth": 1e12}))
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "mamba", "hidden_size": 64}))
    return [str(hardware) if a == "HWFILE" else str(config) if a == "CONFIGFILE" else a for a in args]


@pytest.mark.parametrize("args, message", BAD_INPUT[:2])
def test_bad_input_is_one_line_exit_2_from_the_console_script(tmp_path, args, message):
    result = _anatomy(*_bad_args(tmp_path, args), check=False)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("args, message", BAD_INPUT[2:])
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, args, message):
    assert main(_bad_args(tmp_path, args)) == 2  # the same entry point, in process (cheaper)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_old_spellings_still_work_with_a_one_line_note_each(capsys):
    assert main(["inspect", "gpt2", "--batch", "2", "--seq", "8", "--dtype", "fp16", "--kv-dtype", "float16",
                 "--json"]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert (report["model"]["name"], report["options"]["batch"], report["options"]["seq"]) == ("gpt2", 2, 8)
    assert (report["options"]["dtype"], report["options"]["kv_dtype"]) == ("f16", "f16")
    assert err.splitlines() == [
        "anatomy inspect: warning: --batch is deprecated, use --batch-size",
        "anatomy inspect: warning: --seq is deprecated, use --seq-len",
        "anatomy inspect: warning: `anatomy inspect gpt2` is deprecated, use `anatomy inspect --model gpt2`",
        "anatomy inspect: warning: --dtype 'fp16' is deprecated, use 'f16'",
        "anatomy inspect: warning: --kv-dtype 'float16' is deprecated, use 'f16'"]


def test_models_by_name_gguf_file_and_config_json(capsys, smollm2_gguf_path):
    from anatomy.checkpoints.registry import resolve

    minilm_config = resolve("all-minilm-l6-v2") / "config.json"
    args = ["compare", "smollm2-135m-instruct", str(smollm2_gguf_path), "smollm2-135m", str(minilm_config),
            "--json", "--seq-len", "16", "--context", "32"]
    assert main(args) == 0
    reports = json.loads(capsys.readouterr().out)
    totals = [r["params"]["total"] for r in reports.values()]
    assert totals[0] == totals[1] == totals[2] == 134_515_008  # the GGUF's metadata gives the preset's shape
    assert totals[3] == _safetensors_count(minilm_config.parent / "model.safetensors") == 22_713_216
    assert "decode" not in reports[str(minilm_config)]["roofline"]  # an encoder does not decode


def _safetensors_count(path) -> int:
    """Elements of every parameter tensor the checkpoint file holds (position_ids is a buffer)."""
    import math

    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys() if not k.endswith("position_ids"))


def test_inspect_mixtral_reports_total_and_active_and_expert_bytes(capsys):
    """In process (main): the report of a mixture model carries total and active parameters, the
    experts' resident and read bytes; the KV cache of a windowed model is capped."""
    assert main(["inspect", "--model", "mixtral-8x7b", "--json", "--seq-len", "4", "--context", "64",
                 "--dtype", "bf16"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["params"]["total"], report["params"]["active"]) == (46_702_792_704, 12_879_925_248)
    experts = report["memory"]["experts"]
    assert experts["read_per_token_bytes"] * 4 == experts["resident_bytes"]  # 2 of 8 experts
    assert report["flops"]["flop_counter_matches"]
    assert main(["inspect", "--model", "mistral-7b", "--json", "--seq-len", "4", "--context", "8192"]) == 0
    memory = json.loads(capsys.readouterr().out)["memory"]
    assert memory["kv_cache_bytes_without_windows"] == 2 * memory["kv_cache_bytes"]  # 8192 kept vs the 4096 window


def test_a_checkpoint_reports_the_bytes_it_really_stores(capsys, smollm2_gguf_path):
    """Next to the analytic bytes per dtype: the shipped GGUF's tensors by type (gguf-py reads the
    same file independently), and a loaded model's own bytes by format (anatomy.inspect)."""
    import anatomy
    from gguf import GGUFReader

    assert main(["inspect", "--model", str(smollm2_gguf_path), "--json", "--seq-len", "16"]) == 0
    stored = json.loads(capsys.readouterr().out)["memory"]["stored_weights"]
    theirs = {}
    for t in GGUFReader(smollm2_gguf_path).tensors:
        theirs[t.tensor_type.name] = theirs.get(t.tensor_type.name, 0) + int(t.n_bytes)
    assert stored["by_format"] == theirs and stored["bytes"] == sum(theirs.values())
    loaded = anatomy.inspect(anatomy.load(smollm2_gguf_path), seq_len=16)["memory"]["stored_weights"]
    assert loaded["by_format"] == {"int4": theirs["Q4_1"], "int8g": theirs["Q8_0"], "f32": theirs["F32"]}
    assert main(["inspect", "--model", "llama-7b", "--json", "--seq-len", "16"]) == 0  # a preset: nothing stored
    assert "stored_weights" not in json.loads(capsys.readouterr().out)["memory"]


def test_inspect_predicts_speculative_decoding(capsys):
    """In process: --speculative K --acceptance A adds the prediction; a draft of the model's first
    blocks costs a decode step of its own per proposed token."""
    args = ["inspect", "--model", "smollm2-135m", "--context", "512", "--dtype", "f32", "--json"]
    assert main([*args, "--speculative", "4", "--acceptance", "0.5"]) == 0
    ngram = json.loads(capsys.readouterr().out)["speculative"]
    assert main([*args, "--speculative", "4", "--acceptance", "0.5", "--draft-layers", "6"]) == 0
    draft = json.loads(capsys.readouterr().out)["speculative"]
    assert ngram["expected_tokens_per_forward"] == pytest.approx(1 + 0.5 + 0.25 + 0.125 + 0.0625)
    assert ngram["draft_step"] is None and draft["draft_step"]["bytes"] < draft["step"]["bytes"] / 2  # 6 of 30 blocks, the head
    assert draft["speedup"] < ngram["speedup"] and draft["draft"] == "the model itself, first 6 blocks"
