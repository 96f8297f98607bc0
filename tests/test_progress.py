"""anatomy/progress.py: the display shows on a terminal (forced here with ANATOMY_PROGRESS=1, which
makes rich's console a terminal) once DELAY_S has passed; nothing shows when stderr is not a
terminal, under quieted()/--quiet, with ANATOMY_PROGRESS=0, or for work that ends sooner; and the
long work of the commands (first-use kernel measurement, loading, training, sweeps) goes through it."""

from __future__ import annotations

import json
import time

import pytest
import torch

from anatomy import progress
from anatomy.cli import main


@pytest.fixture(autouse=True)
def _quick(monkeypatch):
    monkeypatch.setattr(progress, "DELAY_S", 0.01)
    monkeypatch.delenv(progress.ENV, raising=False)
    monkeypatch.setenv("COLUMNS", "250")  # a forced terminal is 80 columns wide otherwise: long paths are cut


def _work(description: str = "counting sheep", total: int = 5, seconds: float = 0.3) -> None:
    with progress.task(description, total=total) as bar:
        for _ in range(total):
            time.sleep(seconds / total)
            bar.advance()


def test_a_terminal_shows_the_task_and_its_count(monkeypatch, capsys):
    monkeypatch.setenv(progress.ENV, "1")
    _work()
    err = capsys.readouterr().err
    assert "counting sheep" in err and "/5" in err and "\x1b[" in err  # drawn with terminal control codes


def test_nothing_when_stderr_is_not_a_terminal(capsys):
    assert not progress.console().is_terminal  # pytest captures stderr: not a terminal
    _work()
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("how", ["quieted", "env"])
def test_nothing_when_quiet(how, monkeypatch, capsys):
    monkeypatch.setenv(progress.ENV, "0" if how == "env" else "1")
    with progress.quieted(how == "quieted"):
        _work()
        assert not progress.shown()
    assert capsys.readouterr().err == ""
    if how == "quieted":
        assert progress.shown()  # the setting comes back after


def test_work_that_ends_before_the_delay_shows_nothing(monkeypatch, capsys):
    monkeypatch.setenv(progress.ENV, "1")
    monkeypatch.setattr(progress, "DELAY_S", 5.0)
    _work(seconds=0.0)
    assert capsys.readouterr().err == ""


def test_nested_tasks_share_one_display_and_track_counts(monkeypatch, capsys):
    """rich allows one live display at a time: a task inside another joins it."""
    monkeypatch.setenv(progress.ENV, "1")
    seen = []
    with progress.task("outer"):
        for item in progress.track(["a", "b", "c"], "inner"):
            time.sleep(0.05)
            seen.append(item)
        _work("innermost", total=2, seconds=0.1)
    err = capsys.readouterr().err
    assert seen == ["a", "b", "c"] and "outer" in err and "inner" in err and "innermost" in err
    assert progress._shared["display"] is None and progress._shared["depth"] == 0  # closed


def test_first_use_kernel_measurement_shows_progress(monkeypatch, capsys):
    from anatomy.kernels.plan import make_plan
    from anatomy.kernels.timing import Phase
    from anatomy.weights.formats import FloatWeight

    monkeypatch.setenv(progress.ENV, "1")
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    linears = {f"l{i}.weight": FloatWeight(torch.randn(16 * (i + 1), 32)) for i in range(3)}
    make_plan(linears, model_id="progress-test", weights="f32", phases=(Phase("decode", 1, None),), repeats=1,
              cache=False)
    err = capsys.readouterr().err
    assert "measuring kernels (first use)" in err and "/3" in err


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text("To be, or not to be, that is the question. " * 60, encoding="utf-8")
    return path


def _train(corpus, out, *extra: str) -> list[str]:
    return ["train", "--data", str(corpus), "--tokenizer", "chars", "--model", "gpt2", "--n-layers", "1",
            "--d-model", "32", "--n-heads", "2", "--d-ff", "64", "--steps", "30", "--batch-size", "2",
            "--seq-len", "16", "--eval-steps", "1", "--warmup", "1", "--out", str(out), *extra]


@pytest.mark.parametrize("quiet", [False, True])
def test_training_shows_its_steps_unless_quiet(quiet, corpus, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(progress.ENV, "1")
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    assert main(_train(corpus, tmp_path / "run", *(["--quiet"] if quiet else []))) == 0
    out, err = capsys.readouterr()
    assert out.startswith("done: 30 steps")  # stdout holds the result only
    assert ("train" in err and "/30" in err and "tok/s" in err) is not quiet
    assert (err == "") is quiet


def test_a_sweep_shows_its_points(monkeypatch, capsys, tmp_path):
    import anatomy

    from .inference.conftest import llama_tiny

    monkeypatch.setenv(progress.ENV, "1")
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    anatomy.save(llama_tiny(), tmp_path / "tiny")
    assert main(["profile", "--model", str(tmp_path / "tiny"), "--prompt-len", "4", "--new-tokens", "2",
                 "--sweep", "batch=1,2", "--json"]) == 0
    out, err = capsys.readouterr()
    assert [r["batch"] for r in json.loads(out)["sweep"]] == [1, 2]
    assert f"profiling {tmp_path / 'tiny'}" in err and "sweep batch" in err
