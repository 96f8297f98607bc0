"""`anatomy train --lora` end to end, on a tiny random LLaMA-style checkpoint: the adapter each
checkpoint holds loads in HF PEFT unchanged with anatomy's logits (fp32, 1e-4), training lowers the
held-out loss with the base untouched, resuming is bit-exact, 2 ranks (DDP, FSDP2) train what 1 does,
and bad options are one error each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import anatomy
from anatomy.cli import main
from anatomy.lora import apply_lora

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

LORA = ["--lora", "--lora-rank", "4", "--lora-alpha", "8", "--lora-targets", "q,v,o,down", "--seq-len", "32",
        "--batch-size", "8", "--lr", "1e-2", "--warmup", "2", "--eval-steps", "2", "--quiet"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> tuple[Path, Path]:
    """(an HF checkpoint of a tiny random LLaMA-style decoder, a text of random words)."""
    root = tmp_path_factory.mktemp("lora-train")
    torch.manual_seed(0)
    anatomy.save(anatomy.build_model(anatomy.get_preset(
        "llama-7b", vocab_size=96, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128, max_seq_len=64)),
        root / "base")
    words = "the king and queen of a land far away said that all men must love their fool now".split()
    rng = np.random.default_rng(0)
    text = "\n".join(" ".join(rng.choice(words, size=rng.integers(4, 12))) for _ in range(800))
    (root / "text.txt").write_text(text + "\n")
    return root / "base", root / "text.txt"


def _train(setup, out: Path, *extra: str) -> int:
    base, text = setup
    return main(["train", "--data", str(text), "--model", str(base), *LORA, *extra, "--out", str(out)])


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_trained_adapter_loads_in_peft_with_anatomys_logits(setup, tmp_path):
    base, _ = setup
    assert _train(setup, tmp_path / "run", "--steps", "12", "--eval-every", "12") == 0
    val = [r["val_loss"] for r in _records(tmp_path / "run") if "val_loss" in r]
    assert val[-1] < val[0] - 0.3  # held-out loss at step 12 against step 0
    adapter = tmp_path / "run" / "checkpoints" / "step-000012"
    assert not (adapter / "model.safetensors").exists()  # the adapter alone, not the base
    written = json.loads((adapter / "adapter_config.json").read_text())
    assert written["base_model_name_or_path"] == str(base.resolve())
    assert sorted(written["target_modules"]) == ["down_proj", "o_proj", "q_proj", "v_proj"]

    ids = torch.tensor([[5, 9, 13, 2, 30, 7, 11, 4, 8, 21]])
    hf = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    with torch.no_grad():
        plain = hf(ids).logits
        expected = peft.PeftModel.from_pretrained(hf, adapter).eval()(ids).logits
        ours = apply_lora(anatomy.load(base, dtype="f32").eval(), adapter)(ids)
        merged = anatomy.merge_lora(anatomy.load(base, dtype="f32").eval(), adapter)(ids)
    assert (expected - plain).abs().max() > 0.1  # training changed what the model computes
    assert (ours - expected).abs().max() < 1e-4
    assert (merged - expected).abs().max() < 1e-4


def test_resume_is_bit_exact_and_checks_the_adapter(setup, tmp_path, capsys):
    dropout = ["--lora-dropout", "0.1", "--decay-steps", "6"]
    assert _train(setup, tmp_path / "a", *dropout, "--steps", "6") == 0
    assert _train(setup, tmp_path / "b", *dropout, "--steps", "3") == 0
    assert _train(setup, tmp_path / "b", *dropout, "--steps", "6", "--resume") == 0
    losses = [{r["step"]: r["loss"] for r in _records(tmp_path / run) if "val_loss" not in r} for run in "ab"]
    assert sorted(losses[1]) == list(range(1, 7)) and losses[1] == losses[0]

    capsys.readouterr()
    assert _train(setup, tmp_path / "b", *dropout, "--steps", "8", "--resume", "--lora-alpha", "16") == 2
    assert "adapter_config.json: the checkpoint's adapter has alpha=8.0, this run's 16.0" in capsys.readouterr().err

    weights = tmp_path / "b" / "checkpoints" / "step-000006" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])  # truncated
    assert _train(setup, tmp_path / "b", *dropout, "--steps", "8", "--resume") == 2
    assert f"{weights}: " in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--lora-rank", "4"], "--lora-rank shapes a LoRA adapter: add --lora"),
    (["--lora", "--lora-rank", "0"], "--lora-rank 0 must be a positive integer"),
    (["--lora", "--lora-dropout", "1"], "--lora-dropout 1.0 must be in [0, 1)"),
    (["--lora", "--lora-targets", "q,qkv"], "--lora-targets: LoRA target 'qkv' is not one of q, k, v, o, gate, up, down"),
    (["--lora", "--model", "llama-7b"], "--lora trains an adapter over a checkpoint's frozen weights; --model llama-7b "
                                        "is a preset"),
    (["--lora", "--d-model", "32"], "--lora keeps the model's architecture; drop --d-model"),
])
def test_bad_lora_options_are_named(setup, tmp_path, capsys, args, message):
    base, text = setup
    argv = ["train", "--data", str(text), "--model", str(base), "--seq-len", "32", "--steps", "1", *args,
            "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_ranks_train_the_same_adapter_and_resume_on_one(setup, tmp_path, strategy):
    """2 gloo ranks (torchrun) match 1 rank within 1e-5 with the base frozen, and the 2-rank
    adapter checkpoint resumes on 1 rank, continuing the same curve."""
    base, text = setup
    args = ["train", "--data", str(text), "--model", str(base), *LORA, "--decay-steps", "6"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert main([*args, "--steps", "6", "--out", str(one)]) == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "anatomy", *args, "--steps", "4", "--out", str(two), "--nproc", "2",
                    "--strategy", strategy], env=env, check=True, capture_output=True)
    assert main([*args, "--steps", "6", "--out", str(two), "--resume"]) == 0
    ref, got = ({r["step"]: r["loss"] for r in _records(run) if "val_loss" not in r} for run in (one, two))
    assert sorted(got) == list(range(1, 7))
    for step in got:
        assert got[step] == pytest.approx(ref[step], abs=1e-5, rel=0)
