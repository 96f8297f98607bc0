"""`anatomy profile --plot FILE.png`: each phase's time per position (measured against the roofline),
and the sweeps: decode tok/s against the batch with the measured and predicted ridges, attention
time and KV-cache bytes against the context."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from anatomy.figures import pyplot, save_figure


def save_profile_plot(report: dict[str, Any], path: str | Path) -> Path:
    return save_figure(figure(report), path, option="--plot", dpi=120)


def png_bytes(report: dict[str, Any], *, dpi: int = 110) -> bytes:
    """The same figure as PNG bytes (the page embeds it)."""
    import io

    fig = figure(report)
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=dpi)
    finally:
        pyplot().close(fig)
    return buffer.getvalue()


def figure(report: dict[str, Any]):
    """One panel per phase (time per position, measured and at the roofs) and per sweep."""
    from anatomy.analysis.profile.render import sweep_keys

    panels = [("phase", p) for p in report["phases"]] + [("sweep", k) for k in sweep_keys(report)]
    fig, axes = pyplot().subplots(1, len(panels), figsize=(6.2 * len(panels), 4.8), squeeze=False)
    for ax, (kind, what) in zip(axes[0], panels):
        if kind == "phase":
            _phase(ax, report, what)
        elif what == "batch":
            _batch(ax, report)
        else:
            _context(ax, report)
    fig.suptitle(f"anatomy profile of {report['model']['name']}")
    fig.tight_layout()
    return fig


def _phase(ax, report: dict[str, Any], phase: str) -> None:
    d = report["phases"][phase]
    labels = report["positions"]
    roof: dict[str, float] = {}
    for o in d["ops"]:
        roof[o["position"]] = roof.get(o["position"], 0.0) + (o["roofline_s"] or 0.0)
    keys = [k for k, v in d["positions"].items() if v]
    names = [labels[k]["label"] for k in keys] + ["unattributed"]
    measured = [d["positions"][k] * 1e3 for k in keys] + [d["unattributed_s"] * 1e3]
    roofline = [roof.get(k, 0.0) * 1e3 for k in keys] + [0.0]
    ys = range(len(names))
    ax.barh([y + 0.2 for y in ys], measured, height=0.4, color="tab:orange", label="measured (profiled)")
    ax.barh([y - 0.2 for y in ys], roofline, height=0.4, color="tab:blue", label="roofline on this machine")
    ax.set_yticks(list(ys), names)
    ax.invert_yaxis()
    ax.set_xlabel("ms per step")
    production = f" (production step {d['tok_per_s']:,.1f})" if "production_step_s" in d else ""
    ax.set_title(f"{phase}: {d['eager_tok_per_s']:,.1f} tok/s measured, {d['predicted_tok_per_s']:,.1f} predicted"
                 + production)
    ax.legend(loc="lower right")


def _batch(ax, report: dict[str, Any]) -> None:
    rows = [r for r in report["sweep"] if r["sweep"] == "batch"]
    xs = [r["batch"] for r in rows]
    ax.loglog(xs, [r["tok_per_s"] for r in rows], "o-", color="tab:orange", label="measured")
    ax.loglog(xs, [r["predicted_tok_per_s"] for r in rows], "s--", color="tab:green",
              label="predicted (roofs + overhead)")
    roof = [(x, r["roofline_tok_per_s"]) for x, r in zip(xs, rows) if r["roofline_tok_per_s"]]
    if roof:
        ax.loglog(*zip(*roof), ":", color="tab:blue", label="roofline")
    ridge = report.get("ridge", {})
    if ridge.get("measured_batch"):
        ax.axvline(ridge["measured_batch"], color="tab:orange", alpha=0.5,
                   label=f"measured ridge {ridge['measured_batch']:.3g}")
    if ridge.get("predicted_batch"):
        ax.axvline(ridge["predicted_batch"], color="tab:blue", alpha=0.5,
                   label=f"predicted ridge {ridge['predicted_batch']}")
    ax.set_xticks(xs, [str(x) for x in xs])  # the batches swept, not 2 x 10^0
    ax.set_xticks([], minor=True)
    ax.set_xlabel("batch")
    ax.set_ylabel("decode tok/s")
    ax.set_title("decode throughput against the batch")
    ax.legend(fontsize="small")


def _context(ax, report: dict[str, Any]) -> None:
    rows = [r for r in report["sweep"] if r["sweep"] == "context"]
    xs = [r["context"] for r in rows]
    ax.plot(xs, [r["attention_s"] * 1e3 for r in rows], "o-", color="tab:orange", label="attention, measured")
    ax.plot(xs, [r["attention_roofline_s"] * 1e3 for r in rows], "s--", color="tab:blue", label="attention, roofline")
    ax.plot(xs, [r["kv_write_s"] * 1e3 for r in rows], "^-", color="tab:gray", label="KV writes, measured")
    ax.set_xlabel("context T (cache slots attended)")
    ax.set_ylabel("ms per decode step")
    twin = ax.twinx()
    twin.plot(xs, [r["attention_bytes"] / 2 ** 20 for r in rows], ":", color="tab:green", label="attention bytes")
    twin.set_ylabel("MiB read by attention per step")
    ax.set_title("attention and KV reads against the context")
    ax.legend(loc="upper left", fontsize="small")
    twin.legend(loc="lower right", fontsize="small")
