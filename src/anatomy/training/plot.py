"""Loss curves of a run (metrics.jsonl) drawn to a PNG with matplotlib's Agg backend (no display)."""

from __future__ import annotations

from pathlib import Path

from anatomy.atomic import write_errors_named
from anatomy.errors import InputError
from anatomy.figures import image_format, pyplot, save_figure
from anatomy.text_file import read_text
from anatomy.training.metrics import is_number, parse_record


def read_metrics(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """(training lines, evaluation lines) of <run_dir>/metrics.jsonl; lines that are not a step's
    record (one cut off by a crash, anything else) are skipped."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise InputError(f"{path}: no such file (is {run_dir} a run directory of `anatomy train`?)")
    train, evals = [], []
    for record in filter(None, map(parse_record, read_text(path, label="metrics").splitlines())):
        if is_number(record.get("val_loss")):
            evals.append(record)
        elif is_number(record.get("loss")):
            train.append(record)
    if not train:
        raise InputError(f"{path}: holds no training steps yet")
    return train, evals


def plot_losses(run_dirs: list[Path], output: Path, *, smooth: int = 20) -> Path:
    """Training loss (raw and a moving average over `smooth` steps) and validation loss vs step."""
    image_format(output, option="--output")
    if isinstance(smooth, bool) or not isinstance(smooth, int) or smooth < 1:
        raise InputError(f"--smooth {smooth} must be a positive integer (1: no smoothing)")
    runs = [(Path(run_dir).name, *read_metrics(run_dir)) for run_dir in run_dirs]
    fig, ax = pyplot().subplots(figsize=(8, 5), dpi=120)
    for label, train, evals in runs:
        _plot_run(ax, label, train, evals, smooth=smooth)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    output = Path(output)
    with write_errors_named(output.parent, option="--output"):
        output.parent.mkdir(parents=True, exist_ok=True)
    return save_figure(fig, output, option="--output")


def _plot_run(ax, label: str, train: list[dict], evals: list[dict], *, smooth: int) -> None:
    steps, losses = [r["step"] for r in train], [r["loss"] for r in train]
    line, = ax.plot(steps, losses, alpha=0.25, linewidth=0.8)
    if len(losses) >= smooth > 1:
        avg = [sum(losses[i - smooth + 1:i + 1]) / smooth for i in range(smooth - 1, len(losses))]
        ax.plot(steps[smooth - 1:], avg, color=line.get_color(), label=f"{label} train (avg {smooth})")
    else:
        line.set_label(f"{label} train")
    if evals:
        ax.plot([r["step"] for r in evals], [r["val_loss"] for r in evals], "o--", color=line.get_color(),
                label=f"{label} val")
