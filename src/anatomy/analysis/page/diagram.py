"""The block diagram as SVG, laid out from the parts (parts.py): one column per stack, top to
bottom, the residual path on the left of each column, position inputs on the right, a frame
around the repeated block, and for an encoder-decoder the memory feeding the decoder's
cross-attention.

    Pre-Norm:   x ─┬─ norm ─ f ─ (+) ─      Post-Norm:   x ─┬─ f ─ (+) ─ norm ─
                   └────────────┘                           └──────┘

Each part is one `<g class="component" data-part=ID>`: clicking it shows its details.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from anatomy.analysis.page.parts import Part, diagram_parts, stacks
from anatomy.analysis.page.svg import arrow_marker, attrs, esc, short, text_width

BOX_H = 62  # three lines: title, subtitle, parameters
SIDE_H = 50
IO_H = 30
GAP = 24
ADD_R = 10
LANE = 30  # residual lane distance left of the boxes
SIDE_GAP = 38
TITLE_SIZE, SUB_SIZE, PARAM_SIZE = 13.5, 12, 11.5


@dataclass
class _Item:
    kind: str  # box, side, add, io, split
    part: Part | None = None
    label: str = ""
    y: float = 0.0
    h: float = 0.0
    attached: list["_Item"] = field(default_factory=list)  # side boxes of a box or add
    residual_from: "_Item | None" = None  # an add: the split its residual starts at


@dataclass
class _Column:
    stack: str
    items: list[_Item] = field(default_factory=list)
    block: tuple[int, int] = (0, 0)  # first and last index of the repeated block's items
    layers: int = 0
    cx: float = 0.0
    width: float = 0.0
    side_width: float = 0.0

    def add(self, item: _Item) -> _Item:
        self.items.append(item)
        return item


def diagram_svg(report: dict[str, Any], *, parts: dict[str, Part] | None = None, compact: bool = False,
                uid: str = "d") -> str:
    """The SVG of the model's diagram; `compact` drops the explanatory legend (side-by-side use);
    `uid` keeps the arrow markers' ids unique when one page holds several diagrams."""
    parts = parts if parts is not None else diagram_parts(report)
    columns = [_column(report, stack, parts) for stack in stacks(report)]
    _place(columns)
    width = max(c.cx + c.width / 2 + (c.side_width + SIDE_GAP if c.side_width else 0) for c in columns) + 24
    height = max(c.items[-1].y + c.items[-1].h for c in columns) + 20
    legend = "" if compact else _legend(report, height)
    height += 0 if compact else 34
    out = [f'<svg class="diagram" viewBox="0 0 {width:.0f} {height:.0f}" width="{width:.0f}" height="{height:.0f}" '
           f'role="img" aria-label="block diagram of {esc(report["model"]["name"])}">',
           "<defs>", arrow_marker(f"arrow-{uid}", "arrowhead"), arrow_marker(f"memory-{uid}", "arrowhead memory"),
           "</defs>"]
    for col in columns:
        out += _draw_column(col, report)
    if len(columns) == 2:
        out.append(_memory_path(columns[0], columns[1]))
    out.append(legend)
    out.append("</svg>")
    svg = "\n".join(out)  # the drawing refers to #arrow and #arrow-memory: this diagram's own markers
    return svg.replace("url(#arrow)", f"url(#arrow-{uid})").replace("url(#arrow-memory)", f"url(#memory-{uid})")


# -- layout -------------------------------------------------------------------------------------

def _column(report: dict[str, Any], stack: str, parts: dict[str, Part]) -> _Column:
    c = report["model"]["config"]
    seq2seq = report["model"]["architecture"] == "encoder-decoder"
    col = _Column(stack, layers=c["n_decoder_layers"] if seq2seq and stack == "decoder" else c["n_layers"])
    p = lambda key: parts.get(f"{stack}.{key}")  # noqa: E731
    inputs = {"encoder": "src_ids [B, S_src]" if seq2seq else "input_ids [B, S]",
              "decoder": "tgt_ids [B, S]" if seq2seq else "input_ids [B, S]"}
    col.add(_Item("io", label=inputs[stack], h=IO_H))
    col.add(_Item("box", p("embedding"), h=BOX_H))
    added = [x for x in (p("positions"), p("segments")) if x is not None and x.title not in ("RoPE", "ALiBi")]
    if added:
        col.add(_Item("add", h=2 * ADD_R, attached=[_Item("side", x, h=SIDE_H) for x in added]))
    if p("embedding_norm"):
        col.add(_Item("box", p("embedding_norm"), h=BOX_H))
    first = len(col.items)
    pre = c["norm_position"] == "pre"
    sublayers = [("attn_norm", "attn")] + ([("cross_norm", "cross_attn")] if p("cross_attn") else [])
    for norm_key, key in sublayers + [("ffn_norm", "ffn")]:
        split = col.add(_Item("split"))
        branch = [_Item("box", p(norm_key), h=BOX_H), _Item("box", p(key), h=BOX_H)]
        positions = p("positions")
        if key == "attn" and positions is not None and positions.title in ("RoPE", "ALiBi"):
            branch[1].attached.append(_Item("side", positions, h=SIDE_H))
        add = _Item("add", h=2 * ADD_R, residual_from=split)
        order = [branch[0], branch[1], add] if pre else [branch[1], add, branch[0]]
        for item in order:
            col.add(item)
    col.block = (first, len(col.items) - 1)
    if p("final_norm"):
        col.add(_Item("box", p("final_norm"), h=BOX_H))
    if stack == "encoder" and seq2seq:
        col.add(_Item("io", label="memory [B, S_src, D]", h=IO_H))
        return col
    head = parts.get("head")
    if head is not None:
        col.add(_Item("box", head, h=BOX_H))
    outputs = {"LM head": "logits [B, S, V]", "pooler": "pooled [B, D]", "MLM head": "logits [B, S, V]"}
    col.add(_Item("io", label=outputs.get(head.title, "hidden [B, S, D]") if head else "hidden [B, S, D]", h=IO_H))
    return col


def _place(columns: list[_Column]) -> None:
    x = 16.0
    for col in columns:
        boxes = [i.part for i in col.items if i.kind == "box"]
        sides = [s.part for i in col.items for s in i.attached]
        col.width = max([206.0] + [_box_width(p) for p in boxes])
        col.side_width = max([0.0] + [_box_width(p, side=True) for p in sides])
        col.cx = x + LANE + 18 + col.width / 2
        y = 22.0 if len(columns) == 1 else 34.0
        for i, item in enumerate(col.items):
            if i in (col.block[0], col.block[1] + 1):
                y += 22  # room for the block frame and its label
            item.y = y
            y += item.h + (GAP if item.kind != "split" else 10)
        x = col.cx + col.width / 2 + (col.side_width + SIDE_GAP if col.side_width else 0) + 40


def _box_width(part: Part, *, side: bool = False) -> float:
    lines = [(part.title, TITLE_SIZE, True), (part.subtitle, SUB_SIZE, False), (_params_line(part), PARAM_SIZE, False)]
    return max(text_width(t, s, bold=b) for t, s, b in lines) + (22 if side else 30)


def _params_line(part: Part) -> str:
    if part.shared_with:
        return "shared with the encoder"
    if not part.ledger or not part.params:
        return "no parameters"
    copies = {c["copies"] for c in part.ledger}
    if len(copies) == 1 and (n := copies.pop()) > 1:
        return f"{short(part.params // n)} × {n} = {short(part.params)} params"
    return f"{short(part.params)} params"


# -- drawing ------------------------------------------------------------------------------------

def _draw_column(col: _Column, report: dict[str, Any]) -> list[str]:
    out = [_frame(col)]
    if len(stacks(report)) > 1:
        out.append(f'<text class="stack-title" x="{col.cx:.1f}" y="16" text-anchor="middle">{esc(col.stack)}</text>')
    main = [i for i in col.items]
    for a, b in zip(main, main[1:]):
        y0, y1 = a.y + a.h, b.y
        if b.kind == "add":
            y1 = b.y
        marker = "" if b.kind == "split" else ' marker-end="url(#arrow)"'
        out.append(f'<line class="flow" x1="{col.cx:.1f}" y1="{y0:.1f}" x2="{col.cx:.1f}" y2="{y1:.1f}"{marker}/>')
    for item in col.items:
        out += _draw_item(item, col)
    return out


def _frame(col: _Column) -> str:
    first, last = col.items[col.block[0]], col.items[col.block[1]]
    x0 = col.cx - col.width / 2 - LANE - 14
    side = max((s.part and _box_width(s.part, side=True) for i in col.items[col.block[0]:col.block[1] + 1]
                for s in i.attached), default=0)
    x1 = col.cx + col.width / 2 + (side + SIDE_GAP if side else 0) + 14
    y0, y1 = first.y - 14, last.y + last.h + 14
    label = f"{col.stack} block" if col.stack else "block"
    rect = attrs(x=f"{x0:.1f}", y=f"{y0:.1f}", width=f"{x1 - x0:.1f}", height=f"{y1 - y0:.1f}", rx=12)
    return (f'<g class="block-frame"><rect {rect}/>'
            f'<text class="frame-label" x="{x0 + 12:.1f}" y="{y0 - 6:.1f}">{esc(label)}</text>'
            f'<text class="frame-count" x="{x1 - 12:.1f}" y="{y0 - 6:.1f}" text-anchor="end">× {col.layers} layers'
            f"</text></g>")


def _draw_item(item: _Item, col: _Column) -> list[str]:
    cx = col.cx
    if item.kind == "io":
        w = max(150.0, text_width(item.label, 12.5) + 28)
        rect = attrs(x=f"{cx - w / 2:.1f}", y=f"{item.y:.1f}", width=f"{w:.1f}", height=item.h, rx=item.h / 2)
        return [f'<g class="io"><rect {rect}/>'
                f'<text x="{cx:.1f}" y="{item.y + item.h / 2 + 4.5:.1f}" text-anchor="middle">'
                f"{esc(item.label)}</text></g>"]
    if item.kind == "split":
        return [f'<circle class="split" cx="{cx:.1f}" cy="{item.y:.1f}" r="3.2"/>']
    out = []
    if item.kind == "add":
        cy = item.y + ADD_R
        out.append(f'<g class="add" data-tip="residual add: x + f(x)"><circle cx="{cx:.1f}" cy="{cy:.1f}" r="{ADD_R}"/>'
                   f'<path d="M{cx - 5:.1f},{cy:.1f} H{cx + 5:.1f} M{cx:.1f},{cy - 5:.1f} V{cy + 5:.1f}"/></g>')
        if item.residual_from is not None:
            lane = cx - col.width / 2 - LANE
            ys = item.residual_from.y
            out.append(f'<path class="residual" d="M{cx:.1f},{ys:.1f} H{lane:.1f} V{cy:.1f} H{cx - ADD_R:.1f}" '
                       f'marker-end="url(#arrow)"/>')
        out += _sides(item, col, cx + ADD_R, cy, dashed=False)
        return out
    x = cx - col.width / 2
    out.append(_component(item.part, x, item.y, col.width, item.h))
    out += _sides(item, col, cx + col.width / 2, item.y + item.h / 2, dashed=True)
    return out


def _sides(item: _Item, col: _Column, x_edge: float, cy: float, *, dashed: bool) -> list[str]:
    out = []
    n = len(item.attached)
    for k, side in enumerate(item.attached):
        sx = col.cx + col.width / 2 + SIDE_GAP
        sy = cy - side.h / 2 + (k - (n - 1) / 2) * (side.h + 8)
        css = "side-link dashed" if dashed else "side-link"
        marker = "" if dashed else ' marker-end="url(#arrow)"'
        out.append(f'<path class="{css}" d="M{sx:.1f},{sy + side.h / 2:.1f} H{(sx + x_edge) / 2:.1f} V{cy:.1f} '
                   f'H{x_edge + (2 if dashed else 0):.1f}"{marker}/>')
        out.append(_component(side.part, sx, sy, col.side_width, side.h, side=True))
    return out


def _component(part: Part, x: float, y: float, w: float, h: float, *, side: bool = False) -> str:
    params = _params_line(part)
    label = f"{part.title}: {params}"
    lines = [(part.title, "t1"), (part.subtitle, "t2")] + ([] if side else [(params, "t3")])
    step = h / (len(lines) + 1)
    texts = "".join(f'<text class="{cls}" x="{x + w / 2:.1f}" y="{y + step * (k + 1) + 4.5:.1f}" '
                    f'text-anchor="middle">{esc(t)}</text>' for k, (t, cls) in enumerate(lines))
    if side:  # a side box has no room for the third line: its parameters go in the tooltip
        label = f"{part.title} ({part.subtitle}): {params}"
    return (f'<g class="component kind-{esc(part.kind)}{" side" if side else ""}" data-part="{esc(part.id)}" '
            f'data-params="{part.params}" tabindex="0" role="button" aria-label="{esc(label)}" '
            f'data-tip="{esc(label)} · click for details">'
            f'<rect {attrs(x=f"{x:.1f}", y=f"{y:.1f}", width=f"{w:.1f}", height=f"{h:.1f}", rx=8)}/>'
            f"{texts}</g>")


def _memory_path(enc: _Column, dec: _Column) -> str:
    memory = enc.items[-1]
    cross = next(i for i in dec.items if i.part is not None and i.part.id.endswith("cross_attn"))
    x0 = enc.cx + 80  # the memory pill's right side
    y0 = memory.y + memory.h / 2
    channel = dec.cx - dec.width / 2 - LANE - 34
    y1 = cross.y + cross.h / 2
    x1 = dec.cx - dec.width / 2
    return (f'<path class="memory" d="M{x0:.1f},{y0:.1f} H{channel:.1f} V{y1:.1f} H{x1:.1f}" '
            f'marker-end="url(#arrow-memory)"/>'
            f'<text class="memory-label" x="{channel - 6:.1f}" y="{(y0 + y1) / 2:.1f}" text-anchor="end">'
            f"K, V of memory</text>")


def _legend(report: dict[str, Any], y: float) -> str:
    pre = report["model"]["config"]["norm_position"] == "pre"
    text = ("Pre-Norm: x + f(norm(x)), the residual path bypasses the norm" if pre else
            "Post-Norm: norm(x + f(x)), the norm follows each residual add")
    return f'<text class="legend" x="16" y="{y + 14:.1f}">{esc(text)}</text>'
