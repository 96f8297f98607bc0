"""The loss plot is a real PNG of the right curves; a missing run is a clear error."""

from __future__ import annotations

import json

from anatomy.cli import main
from anatomy.training.plot import read_metrics


def test_plot_writes_a_png_and_skips_broken_lines(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    lines = [{"step": s, "loss": 4.0 - s / 50} for s in range(1, 51)] + [{"step": 50, "val_loss": 3.1, "val_ppl": 22.2}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"step": 51, "lo')
    train, evals = read_metrics(run)
    assert len(train) == 50 and evals[0]["val_loss"] == 3.1
    out = tmp_path / "loss.png"
    assert main(["plot", str(run), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_plot_of_a_missing_run_is_an_error(tmp_path, capsys):
    assert main(["plot", str(tmp_path), "-o", str(tmp_path / "x.png")]) == 2
    assert "metrics.jsonl: no such file" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()
