"""The attention page: per attention group, a grid of L x H heatmaps (one canvas per layer and
head) and one enlarged map with the tokens on its axes; hovering shows which token attends to
which and how much. The weights travel as base64 of little-endian uint16 (w * 65535, so values
are exact to 1.5e-5); the page's script draws them."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from anatomy.analysis.page.build import render_template

KIND_TEXT = {"causal": "causal: each token attends to itself and the tokens before it",
             "bidirectional": "bidirectional: each token attends to every token",
             "cross": "cross-attention: each target token attends to every source token"}


def encode_weights(weights) -> str:
    """[L, H, S_q, S_k] floats in [0, 1] -> base64 of uint16 little-endian, row-major."""
    array = np.clip(weights.numpy(), 0.0, 1.0)
    return base64.b64encode(np.rint(array * 65535).astype("<u2").tobytes()).decode("ascii")


def group_data(maps, index: int) -> dict[str, Any]:
    g = maps.groups[index]
    L, H, S_q, S_k = g.weights.shape
    return {"name": g.name, "kind": g.kind, "queries": list(g.queries), "keys": list(g.keys),
            "layers": list(g.layers), "heads": list(g.heads), "shape": [L, H, S_q, S_k],
            "weights": encode_weights(g.weights)}


def attention_page(maps) -> str:
    layer, head = maps.focus or (maps.groups[0].layers[0], maps.groups[0].heads[0])
    groups = []
    for k, g in enumerate(maps.groups):
        focus_layer = layer if layer in g.layers else g.layers[0]
        focus_head = head if head in g.heads else g.heads[0]
        groups.append({"index": k, "group": g, "kind_text": KIND_TEXT.get(g.kind, g.kind),
                       "focus": (focus_layer, focus_head)})
    data = {"groups": [group_data(maps, k) for k in range(len(maps.groups))]}
    tokens = len(maps.groups[0].keys)
    return render_template("attention.html.j2", title=f"attention of {maps.model}", maps=maps, groups=groups,
                           data=data, tokens=tokens)
