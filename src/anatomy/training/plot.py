"""Loss curves of a run (metrics.jsonl) drawn to a PNG with matplotlib's Agg backend (no display)."""

from __future__ import annotations

import json
from pathlib import Path

from anatomy.errors import InputError


def read_metrics(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """(training lines, evaluation lines) of <run_dir>/metrics.jsonl; a cut-off last line is skipped."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise InputError(f"{path}: no such file (is {run_dir} a run directory of `anatomy train`?)")
    train, evals = [], []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if "val_loss" in record:
            evals.append(record)
        elif record.get("loss") is not None:
            train.append(record)
    if not train:
        raise InputError(f"{path}: holds no training steps yet")
    return train, evals


def plot_losses(run_dirs: list[Path], output: Path, *, smooth: int = 20) -> Path:
    """Training loss (raw and a moving average over `smooth` steps) and validation loss vs step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    for run_dir in run_dirs:
        train, evals = read_metrics(run_dir)
        steps, losses = [r["step"] for r in train], [r["loss"] for r in train]
        line, = ax.plot(steps, losses, alpha=0.25, linewidth=0.8)
        label = Path(run_dir).name
        if len(losses) >= smooth > 1:
            avg = [sum(losses[i - smooth + 1:i + 1]) / smooth for i in range(smooth - 1, len(losses))]
            ax.plot(steps[smooth - 1:], avg, color=line.get_color(), label=f"{label} train (avg {smooth})")
        else:
            line.set_label(f"{label} train")
        if evals:
            ax.plot([r["step"] for r in evals], [r["val_loss"] for r in evals], "o--", color=line.get_color(),
                    label=f"{label} val")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output)
    plt.close(fig)
    return output
