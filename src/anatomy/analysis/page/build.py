"""Assemble the pages: jinja2 templates (templates/), the stylesheet and script (assets/) inlined,
the report embedded as JSON. Nothing on a page refers to another file or the network."""

from __future__ import annotations

import functools
import os
from html import escape
from pathlib import Path
from typing import Any

from anatomy.analysis import render
from anatomy.analysis.page import charts, svg
from anatomy.analysis.page.diagram import diagram_svg
from anatomy.analysis.page.parts import Part, diagram_parts
from anatomy.analysis.page.trace import trace_groups
from anatomy.atomic import atomic_file
from anatomy.errors import InputError

HERE = Path(__file__).parent
KIND_LABELS = {"embedding": "embeddings", "position": "positions", "attention": "attention",
               "cross_attention": "cross-attention", "ffn": "FFN", "norm": "norms", "head": "head", "other": "other"}


def kind_class(kind: str) -> str:
    """The colour class of a ledger kind; a kind the page does not know yet is drawn as "other"."""
    return kind if kind in KIND_LABELS else "other"


@functools.lru_cache(maxsize=1)
def _env():
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(kind_class=kind_class, count=lambda n: f"{int(n):,}", short=svg.short, si=svg.si, binary=svg.binary,
                       pct=_pct, difference_label=lambda k: charts.DIFFERENCE_LABELS.get(k, k.replace("_", " ")),
                       numeric=_numeric)
    env.globals.update(asset=_asset, version=_version(), kind_labels=KIND_LABELS)
    return env


@functools.lru_cache(maxsize=None)
def _asset(name: str) -> str:
    return (HERE / "assets" / name).read_text(encoding="utf-8")


def _version() -> str:
    from anatomy import __version__

    return __version__


def _pct(x: float) -> str:
    return f"{x:.1%}" if x >= 0.001 or x == 0 else f"{x * 100:.2g}%"


def _numeric(cell: str) -> bool:
    """A table cell that holds a number (right-aligned)."""
    text = cell.strip().lstrip("+-−≤≥~ ")
    return bool(text) and (text[0].isdigit() or text.startswith((".", "inf", "nan")))


# -- pages --------------------------------------------------------------------------------------

def inspect_page(report: dict[str, Any]) -> str:
    """The page of one `anatomy inspect` report (the dict `inspect --json` prints)."""
    parts = diagram_parts(report)
    context = {
        "report": report,
        "title": f"anatomy of {report['model']['name']}",
        "summary": summary(report),
        "chips": chips(report),
        "diagram": diagram_svg(report, parts=parts),
        "parts": list(parts.values()),
        "ledger": ledger_rows(report, parts),
        "treemap": charts.treemap_svg(tree_items(report, parts), total=report["params"]["total"]),
        "waterfall": charts.waterfall_svg(report["params"]),
        "kinds": _kinds_present(report, parts),
        "phases": [(phase, trace_groups(report, phase)) for phase in ("prefill", "decode")],
        "flops_bars": _flops_bars(report),
        "memory_bars": _memory_bars(report),
        "roofline": _roofline(report),
        "tables": _tables(report),
    }
    return _env().get_template("inspect.html.j2").render(**context)


def render_template(name: str, **context: Any) -> str:
    return _env().get_template(name).render(**context)


# -- pieces -------------------------------------------------------------------------------------

def _tables(report: dict[str, Any]) -> dict[str, render.TableSpec]:
    """The terminal's FLOPs, memory, roofline and training tables, by section."""
    sections = {"FLOPs": "FLOPs", "Memory": "Memory", "Roofline": "Roofline", "Training": "Training time"}
    return {key: spec for spec in render.tables(report) for prefix, key in sections.items()
            if spec.title.startswith(prefix)}


def summary(report: dict[str, Any]) -> str:
    c, arch = report["model"]["config"], report["model"]["architecture"]
    kind = {"decoder": "decoder-only", "encoder": "encoder-only", "encoder-decoder": "encoder-decoder"}[arch]
    layers = (f"{c['n_layers']} + {c['n_decoder_layers']} layers" if arch == "encoder-decoder"
              else f"{c['n_layers']} layers")
    heads = f"{c['n_heads']} heads" + (f" ({c['n_kv_heads']} KV)" if c["n_kv_heads"] != c["n_heads"] else "")
    norm = f"{'Pre' if c['norm_position'] == 'pre' else 'Post'}-Norm {c['norm']}"
    positions = {"rope": "RoPE", "alibi": "ALiBi", "learned": "learned positions",
                 "sinusoidal": "sinusoidal positions", "none": "no positions"}.get(c["position"], c["position"])
    ffn = f"{c['activation']} {'GLU' if c['ffn'] == 'glu' else 'MLP'}"
    return " · ".join([kind, layers, f"D {c['d_model']:,}", heads, f"F {c['d_ff']:,}", ffn, norm, positions,
                       f"V {c['vocab_size']:,}", f"context {c['max_seq_len']:,}"])


def chips(report: dict[str, Any]) -> list[tuple[str, str]]:
    o, m, f = report["options"], report["memory"], report["flops"]
    out = [("parameters", f"{report['params']['total']:,}"),
           (f"weights ({o['dtype']})", svg.binary(m["weights_bytes"])),
           ("forward per token", svg.si(f["forward_per_token"], "FLOP"))]
    if "decode" in report["roofline"]:
        out.append((f"KV cache per token ({o['kv_dtype']})", svg.binary(m["kv_cache_bytes_per_token"])))
    out += [("B", str(o["batch"])), ("S", f"{o['seq']:,}"), ("T", f"{o['context']:,}"),
            ("hardware", o["hardware"])]
    return out


def ledger_rows(report: dict[str, Any], parts: dict[str, Part]) -> list[dict[str, Any]]:
    owner = {id(comp): part.id for part in parts.values() for comp in part.ledger}
    total = report["params"]["total"]
    return [{**comp, "part": owner.get(id(comp), ""), "share": comp["total"] / total if total else 0.0}
            for comp in report["params"]["components"]]


def tree_items(report: dict[str, Any], parts: dict[str, Part]) -> list[charts.TreeItem]:
    rows = ledger_rows(report, parts)
    stacked = report["model"]["architecture"] == "encoder-decoder"
    items = []
    for r in rows:
        where = f" ({r['stack']})" if stacked and r.get("stack") in ("encoder", "decoder") else ""
        tip = (f"{r['name']}{where}\n{r['formula']}\n{r['per_copy']:,} × {r['copies']} = {r['total']:,} parameters "
               f"({r['share']:.2%})")
        abbreviated = (r["name"].split(" (")[0].replace("cross-attention ", "cross ").replace("attention ", "attn ")
                       .replace("embedding", "emb."))
        short_where = {" (encoder)": " (enc)", " (decoder)": " (dec)"}.get(where, "")
        labels = (r["name"] + where, abbreviated + short_where, abbreviated)
        items.append(charts.TreeItem(labels, r["total"], kind_class(r["kind"]), tip, r["part"]))
    return items


def _kinds_present(report: dict[str, Any], parts: dict[str, Part]) -> list[str]:
    kinds = {p.kind for p in parts.values()} | {c["kind"] for c in report["params"]["components"]}
    return [k for k in KIND_LABELS if k in {kind_class(kind) for kind in kinds}]


def _flops_bars(report: dict[str, Any]) -> dict[str, str]:
    f, o = report["flops"], report["options"]
    labels = {"qkv_projection": "Q/K/V projection", "attention_scores": "scores Q Kᵀ",
              "attention_values": "weights · V", "output_projection": "output projection", "ffn": "FFN",
              "cross_projections": "cross-attn projections", "cross_attention_matmuls": "cross-attn matmuls"}
    css = {"ffn": "fill-ffn", "cross_projections": "fill-cross_attention", "cross_attention_matmuls":
           "fill-cross_attention"}
    per_layer = [charts.Bar(labels.get(k, k), v, css.get(k, "fill-attention"), svg.si(v, "FLOP"),
                            tip=f"{labels.get(k, k)}: {v:,} FLOPs per layer at B={o['batch']}, S={o['seq']}")
                 for k, v in f["per_layer"].items()]
    part_labels = {"projections": "attention projections", "attention_matmuls": "attention matmuls",
                   "ffn": "FFN", "lm_head": "LM head", "cross_projections": "cross-attn projections",
                   "cross_attention_matmuls": "cross-attn matmuls", "mlm_head": "MLM head"}
    part_css = {"ffn": "fill-ffn", "lm_head": "fill-head", "mlm_head": "fill-head",
                "cross_projections": "fill-cross_attention", "cross_attention_matmuls": "fill-cross_attention"}
    parts = [charts.Bar(part_labels.get(k, k), v, part_css.get(k, "fill-attention"), svg.si(v, "FLOP"),
                        tip=f"{part_labels.get(k, k)}: {v:,} FLOPs in one forward over [B, S]")
             for k, v in f["parts"].items()]
    return {"per_layer": charts.bars_svg(per_layer, title="FLOPs of one layer"),
            "parts": charts.bars_svg(parts, title="FLOPs of one forward")}


def _memory_bars(report: dict[str, Any]) -> dict[str, str]:
    m, o = report["memory"], report["options"]
    items = [(f"weights ({o['dtype']})", m["weights_bytes"], "fill-attention")]
    if "decode" in report["roofline"]:
        items.append((f"KV cache (B={o['batch']}, T={o['context']:,})", m["kv_cache_bytes"], "fill-cross_attention"))
    act = m["activations"]["fused_attention"]
    items += [("training activations", act["total"], "fill-ffn"),
              ("  with checkpointing", act["checkpointed"], "fill-ffn"),
              ("training state (Adam)", m["training_state_bytes"], "fill-head")]
    bars = [charts.Bar(label.strip(), value, css, svg.binary(value), tip=f"{label.strip()}: {value:,} bytes")
            for label, value, css in items]
    dtypes = [charts.Bar(f"weights in {d}", v, "fill-attention" if d == o["dtype"] else "fill-base", svg.binary(v),
                         tip=f"weights in {d}: {v:,} bytes") for d, v in m["weights_bytes_by_dtype"].items()]
    return {"main": charts.bars_svg(bars, title="memory"), "dtypes": charts.bars_svg(dtypes, title="weights by dtype")}


def _roofline(report: dict[str, Any]) -> str:
    r = report["roofline"]
    points = [charts.RoofPoint(phase, phase, r[phase]) for phase in ("prefill", "decode") if phase in r]
    return charts.roofline_svg(r["hardware"], points, dtype=report["options"]["compute_dtype"])


# -- files and notebooks ------------------------------------------------------------------------

def check_output_path(path: str | os.PathLike[str], *, option: str = "--html") -> Path:
    """The file a page will be written to, checked before any work: its folder must exist and be
    writable, and it must not be a folder itself."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise InputError(f"{option} {path}: is a directory, not a file")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"{option} {path}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise InputError(f"{option} {path}: not writable (permission denied)")
    return path


def write_page(html: str, path: str | os.PathLike[str], *, option: str = "--html") -> Path:
    """Write the page through a temporary file: a failure leaves no partial file."""
    path = check_output_path(path, option=option)
    with atomic_file(path) as f:
        f.write(html.encode("utf-8"))
    return path


def notebook_frame(html: str, *, height: int = 860) -> str:
    """A page for a notebook cell: inside an iframe, so its styles and script stay its own."""
    return (f'<iframe srcdoc="{escape(html, quote=True)}" style="width: 100%; height: {height}px; border: 1px solid '
            f'#dde1e8; border-radius: 8px" sandbox="allow-scripts" loading="lazy" '
            f'title="anatomy page"></iframe>')
