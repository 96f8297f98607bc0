"""`anatomy train` end to end: bit-exact resume after SIGKILL, atomic checkpoints, DDP/FSDP2
equivalence with one rank, N-rank checkpoints resumed on M ranks, and the bad-input errors.

Runs that are compared to the bit run as subprocesses with the same environment (one thread each),
so nothing but the code under test differs between them."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from anatomy.cli import main

TINY = ["--model", "gpt2", "--d-model", "32", "--n-layers", "2", "--n-heads", "2", "--d-ff", "64",
        "--seq-len", "16", "--lr", "1e-2", "--warmup", "2", "--eval-steps", "1", "--quiet"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    words = "the king and queen of a land far away said that all men must love their fool now".split()
    rng = np.random.default_rng(0)
    lines = [" ".join(rng.choice(words, size=rng.integers(4, 12))) for _ in range(800)]
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def _cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "anatomy", "train", *args]


def _losses(run: Path) -> dict[int, float]:
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in lines if "loss" in r and "val_loss" not in r}


def _wait_for(path: Path, proc: subprocess.Popen, hang_guard_s: float = 900) -> None:
    """Until `path` appears; the run ending first fails the test. The guard only stops a hung run
    from hanging the suite: it bounds nothing about speed."""
    deadline = time.monotonic() + hang_guard_s
    while not path.exists():
        assert proc.poll() is None, f"the run ended before {path} appeared: {proc.stderr.read()}"
        assert time.monotonic() < deadline, f"{path} did not appear: the run seems hung"
        time.sleep(0.05)


# `anatomy train ...` whose checkpoint write blocks half-way at one step (after the weights, before
# the optimizer state), so that the test can SIGKILL it there
BLOCKING_TRAIN = """
import sys, time
import anatomy.training.checkpoint as checkpoint
from anatomy.cli import main

block_in, write = sys.argv.pop(1), checkpoint._write_bytes

def blocking_write(path, data):
    if path.parent.name == block_in and path.name == "optimizer.safetensors":
        time.sleep(600)  # killed here
    write(path, data)

checkpoint._write_bytes = blocking_write
sys.exit(main(["train", *sys.argv[1:]]))
"""


@pytest.mark.slow
def test_sigkill_while_checkpointing_then_resume_is_bit_exact(corpus, tmp_path):
    """Run A does 8 steps. Run B saves at step 4, is SIGKILLed in the middle of writing its step-8
    checkpoint (its write is made to block there), then resumes: the step-4 checkpoint must be intact
    and the resumed losses equal A's at every step, bit for bit (dropout on: RNG state matters)."""
    args = [*TINY, "--data", str(corpus), "--steps", "8", "--batch-size", "4", "--dropout", "0.1"]
    a, b = tmp_path / "a", tmp_path / "b"
    subprocess.run(_cmd(*args, "--out", str(a)), env=ENV, check=True, capture_output=True)

    blocking = [sys.executable, "-c", BLOCKING_TRAIN, ".tmp-step-000008", *args, "--out", str(b), "--save-every", "4"]
    proc = subprocess.Popen(blocking, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(b / "checkpoints" / ".tmp-step-000008" / "model.safetensors", proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    pointer = json.loads((b / "checkpoints" / "latest.json").read_text())
    assert pointer == {"step": 4, "dir": "step-000004"}
    assert not (b / "checkpoints" / "step-000008").exists()
    assert max(_losses(b)) >= 5  # the killed run had gone past the checkpoint

    subprocess.run(_cmd(*args, "--out", str(b), "--save-every", "4", "--resume"), env=ENV, check=True,
                   capture_output=True)
    losses_a, losses_b = _losses(a), _losses(b)
    assert sorted(losses_b) == list(range(1, 9))
    assert losses_b == losses_a


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_ranks_match_one_rank_and_resume_on_one(strategy, corpus, tmp_path):
    """2 gloo ranks x 2 rows == 1 rank x 4 rows (within 1e-5), and the 2-rank checkpoint resumes
    on 1 rank, continuing the same curve."""
    args = [*TINY, "--data", str(corpus), "--batch-size", "4", "--grad-clip", "0.5", "--decay-steps", "6"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["train", *args, "--steps", "6", "--out", str(one)]) == 0
    subprocess.run(_cmd(*args, "--steps", "4", "--out", str(two), "--nproc", "2", "--strategy", strategy),
                   env=ENV, check=True, capture_output=True)
    ref, got = _losses(one), _losses(two)
    assert sorted(got) == [1, 2, 3, 4]
    for step in got:
        assert got[step] == pytest.approx(ref[step], abs=1e-5, rel=0)
    trainer = json.loads((two / "checkpoints" / "step-000004" / "trainer.json").read_text())
    assert trainer["world"] == 2

    assert main(["train", *args, "--steps", "6", "--out", str(two), "--resume"]) == 0
    resumed = _losses(two)
    assert sorted(resumed) == list(range(1, 7))
    for step in (5, 6):
        assert resumed[step] == pytest.approx(ref[step], abs=1e-5, rel=0)


def test_gradient_accumulation_matches_one_big_batch(corpus, tmp_path):
    args = [*TINY, "--data", str(corpus), "--batch-size", "4", "--steps", "3"]
    assert main(["train", *args, "--out", str(tmp_path / "a")]) == 0
    assert main(["train", *args, "--accum", "2", "--out", str(tmp_path / "b")]) == 0
    a, b = _losses(tmp_path / "a"), _losses(tmp_path / "b")
    assert a.keys() == b.keys()
    for step in a:
        assert b[step] == pytest.approx(a[step], abs=1e-5, rel=0)


@pytest.fixture
def nan_at_steps(monkeypatch):
    """nan_at_steps({2, 3}): the training loss of those optimizer steps (1-based; one micro-step
    each) is made NaN, as an overflowing run's would be."""
    from anatomy.training.objectives import CausalLM

    def inject(steps: set[int]) -> None:
        real, calls = CausalLM.loss, itertools.count(1)

        def loss(self, model, batch, **kwargs):
            total, n = real(self, model, batch, **kwargs)
            if model.training and next(calls) in steps:
                total = total * float("nan")
            return total, n

        monkeypatch.setattr(CausalLM, "loss", loss)

    return inject


def test_nan_loss_is_skipped_counted_and_logged(corpus, tmp_path, nan_at_steps):
    nan_at_steps({2, 3})
    out = tmp_path / "run"
    assert main(["train", *TINY, "--data", str(corpus), "--batch-size", "2", "--steps", "5", "--out", str(out)]) == 0
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    skipped = [r for r in lines if r.get("skipped")]
    assert [r["step"] for r in skipped] == [2, 3]
    assert [r["nonfinite"] for r in skipped] == [1, 2]
    assert skipped[0]["loss"] is None
    trainer = json.loads((out / "checkpoints" / "step-000005" / "trainer.json").read_text())
    assert trainer["nonfinite_total"] == 2
    assert trainer["tokens"] == 3 * 2 * 16  # skipped steps trained nothing


def test_nan_run_stops_after_max_in_a_row_without_a_bad_checkpoint(corpus, tmp_path, nan_at_steps, capsys):
    nan_at_steps({3, 4, 5})
    out = tmp_path / "run"
    args = ["train", *TINY, "--data", str(corpus), "--batch-size", "2", "--steps", "8", "--save-every", "2",
            "--max-nonfinite", "3", "--out", str(out)]
    assert main(args) == 2
    assert "3 steps in a row had a non-finite loss" in capsys.readouterr().err
    assert json.loads((out / "checkpoints" / "latest.json").read_text())["step"] == 4
    from safetensors.torch import load_file

    weights = load_file(out / "checkpoints" / "step-000004" / "model.safetensors")
    assert all(bool(t.isfinite().all()) for t in weights.values())


def _error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    return capsys.readouterr().err


def test_bad_inputs_fail_before_any_step(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    base = ["train", *TINY, "--steps", "2", "--out", str(out)]
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    assert "the text is empty" in _error(capsys, [*base, "--data", str(empty)])
    assert "no such file" in _error(capsys, [*base, "--data", str(tmp_path / "missing.txt")])
    short = tmp_path / "short.txt"
    short.write_text("tiny text\n")
    assert "fewer than one context window" in _error(capsys, [*base, "--data", str(short)])
    assert "not divisible by world size 1 x --accum 3" in _error(
        capsys, [*base, "--data", str(corpus), "--batch-size", "4", "--accum", "3"])
    assert "more than the model's vocab_size=10" in _error(capsys, [*base, "--data", str(corpus), "--vocab-size", "10"])
    msg = _error(capsys, [*base, "--data", str(corpus), "--batch-size", "100000", "--seq-len", "2048"])
    assert "--accum" in msg and "GiB" in msg
    assert not (out / "metrics.jsonl").exists()


@pytest.mark.parametrize("args, message", [
    (["--steps", "0"], "--steps 0 must be a positive integer"),
    (["--seq-len", "0"], "--seq-len 0 must be a positive integer"),
    (["--lr", "-0.1"], "--lr -0.1 must be a positive number"),
    (["--lr", "nan"], "--lr nan must be a positive number"),
    (["--beta2", "1"], "--beta2 1.0 must be in [0, 1)"),
    (["--weight-decay", "-1"], "--weight-decay -1.0 must be a number >= 0"),
    (["--label-smoothing", "1.5"], "--label-smoothing 1.5 must be in [0, 1)"),
    (["--val-fraction", "0"], "--val-fraction 0.0 must be in (0, 1)"),
    (["--eval-steps", "0"], "--eval-steps 0 must be a positive integer"),
    (["--keep", "-1"], "--keep -1 must be an integer >= 0"),
    (["--nproc", "0"], "--nproc 0 must be a positive integer"),
    (["--grad-clip", "-1"], "--grad-clip -1.0 must be a number >= 0"),
    (["--steps", "ten"], "argument --steps: invalid int value: 'ten'"),
    (["--model", "NOTJSON"], "--model NOTJSON: not UTF-8 text (byte 1"),
    (["--model", "LISTJSON"], "--model LISTJSON: expected a JSON object"),
    (["--tokenizer", "MISSING/tokenizer.json"], "MISSING/tokenizer.json: no such file or directory"),
    (["--out", "AFILE"], "--out AFILE: cannot write it: a file is in the way"),
    (["--cache-dir", "AFILE/cache"], "--cache-dir AFILE/cache: cannot write it"),
])
def test_bad_options_name_the_option_and_the_rule(corpus, tmp_path, capsys, args, message):
    files = {"NOTJSON": tmp_path / "bad.json", "LISTJSON": tmp_path / "list.json", "AFILE": tmp_path / "afile",
             "MISSING": tmp_path / "missing"}
    files["NOTJSON"].write_bytes(b"{\xff")
    files["LISTJSON"].write_text("[1, 2]")
    files["AFILE"].write_text("")
    replace = lambda text: next((text.replace(k, str(v)) for k, v in files.items() if k in text), text)
    base = ["train", *TINY, "--data", str(corpus), "--steps", "2", "--out", str(tmp_path / "run")]
    err = _error(capsys, [*base, *map(replace, args)])
    assert err.count("\n") == 1 and err.startswith("anatomy train: error: ") and replace(message) in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_resume_rejects_corrupted_checkpoint_and_overwrites_nothing(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", *TINY, "--data", str(corpus), "--batch-size", "2", "--steps", "2", "--out", str(out)]
    assert main(args) == 0
    step = out / "checkpoints" / "step-000002"
    weights = step / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    metrics = (out / "metrics.jsonl").read_text()
    err = _error(capsys, [*args, "--steps", "4", "--resume"])
    assert str(weights) in err and "cannot be read back" in err
    assert (out / "metrics.jsonl").read_text() == metrics and weights.stat().st_size == 100

    (step / "trainer.json").write_text('{"step": 2}')
    assert "key 'tokens' is missing" in _error(capsys, [*args, "--steps", "4", "--resume"])
    assert "holds a run" in _error(capsys, args)  # no --resume: never trains over a run


def test_activation_checkpointing_changes_no_loss(corpus, tmp_path):
    args = ["train", *TINY, "--data", str(corpus), "--batch-size", "2", "--steps", "2"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--activation-checkpointing", "--out", str(tmp_path / "b")]) == 0
    assert _losses(tmp_path / "a") == _losses(tmp_path / "b")
