"""`--plot FILE.png`: the parameter breakdown and the roofline with the prefill and decode points."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from anatomy.figures import pyplot, save_figure


def save_plot(report: dict[str, Any], path: str | Path) -> None:
    """The parameter breakdown and the roofline, written to `path` (its suffix names the format)."""
    fig, (left, right) = pyplot().subplots(1, 2, figsize=(12, 4.8))
    _breakdown(left, report)
    _roofline(right, report)
    fig.tight_layout()
    save_figure(fig, path, option="--plot", dpi=120)


def _breakdown(ax, report: dict[str, Any]) -> None:
    kinds = {k: v for k, v in report["params"]["by_kind"].items() if v}
    ax.bar(list(kinds), [v / 1e6 for v in kinds.values()], color="tab:blue")
    ax.set_ylabel("parameters (millions)")
    ax.set_title(f"{report['model']['name']}: {report['params']['total']:,} parameters")
    ax.tick_params(axis="x", rotation=30)


def _roofline(ax, report: dict[str, Any]) -> None:
    r = report["roofline"]
    peak, bandwidth = r["hardware"]["peak_flops"], r["hardware"]["bandwidth"]
    points = {phase: r[phase] for phase in ("prefill", "decode") if phase in r}
    low = min([1.0] + [p["intensity"] / 4 for p in points.values()])
    high = max([peak / bandwidth * 8] + [p["intensity"] * 4 for p in points.values()])
    xs = [low * (high / low) ** (i / 200) for i in range(201)]
    ax.loglog(xs, [min(peak, x * bandwidth) for x in xs], color="black", label="roof")
    for (phase, p), color in zip(points.items(), ("tab:orange", "tab:green")):
        achieved = min(peak, p["intensity"] * bandwidth)
        ax.scatter([p["intensity"]], [achieved], color=color, zorder=3, label=f"{phase} ({p['bound']}-bound)")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("attainable FLOP/s")
    ax.set_title(f"roofline on {r['hardware']['name']}")
    ax.legend()
