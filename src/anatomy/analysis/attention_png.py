"""`anatomy attention --png FILE`: each attention group as a grid of its L x H maps (one image,
layers down, heads across) beside the enlarged map of the focused layer and head with the tokens
on its axes. Colour is sqrt(weight), as on the page; masked (future) positions are grey."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from anatomy.atomic import atomic_file

GAP = 1  # pixels of background between the maps of the grid, in map cells


def grid_image(weights: np.ndarray, *, causal: bool, transpose: bool = False) -> np.ndarray:
    """[L, H, S_q, S_k] -> one image of all the maps (layers down and heads across, or the other
    way with `transpose`): weights in [0, 1], -1 for masked cells, NaN for the gaps between maps."""
    L, H, S_q, S_k = weights.shape
    rows, cols = (H, L) if transpose else (L, H)
    image = np.full((rows * (S_q + GAP) - GAP, cols * (S_k + GAP) - GAP), np.nan)
    mask = np.triu(np.ones((S_q, S_k), dtype=bool), k=1) if causal else np.zeros((S_q, S_k), dtype=bool)
    for li in range(L):
        for hi in range(H):
            r, c = (hi, li) if transpose else (li, hi)
            y, x = r * (S_q + GAP), c * (S_k + GAP)
            image[y:y + S_q, x:x + S_k] = np.where(mask, -1.0, weights[li, hi])
    return image


def rgba(image: np.ndarray, cmap, norm) -> np.ndarray:
    """Colours of a grid_image: the colour map for weights, grey for masked cells, the page's
    background for the gaps."""
    out = cmap(norm(np.clip(np.nan_to_num(image, nan=0.0), 0.0, 1.0)))
    out[image < 0] = (0.886, 0.898, 0.918, 1.0)  # masked: #e2e5ea
    out[np.isnan(image)] = (1.0, 1.0, 1.0, 1.0)
    return out


def save_png(maps, path: str | os.PathLike[str], *, option: str = "--png") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import PowerNorm

    from anatomy.analysis.page import check_output_path

    path = check_output_path(path, option=option)
    layer, head = maps.focus or (maps.groups[0].layers[0], maps.groups[0].heads[0])
    norm = PowerNorm(gamma=0.5, vmin=0.0, vmax=1.0)
    cmap = matplotlib.colormaps["Blues"]
    heights = []
    for g in maps.groups:
        L, H = g.weights.shape[:2]
        heights += [max(1.6, min(6.0, 13.0 * min(L, H) / max(L, H))), 6.4]
    fig, axes = plt.subplots(len(heights), 1, figsize=(14, sum(heights) + 0.8), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for k, g in enumerate(maps.groups):
        weights = g.weights.numpy()
        causal = g.kind == "causal"
        _grid(axes[2 * k][0], g, weights, causal, cmap, norm)
        li = g.layers.index(layer) if layer in g.layers else 0
        hi = g.heads.index(head) if head in g.heads else 0
        image = _enlarged(axes[2 * k + 1][0], g, weights[li, hi], causal, cmap, norm,
                          title=f"layer {g.layers[li]}, head {g.heads[hi]}")
        fig.colorbar(image, ax=axes[2 * k + 1][0], fraction=0.03, pad=0.02, label="weight (colour ∝ √weight)")
    fig.suptitle(f"{maps.model}: attention over {len(maps.groups[0].keys)} tokens", fontsize=14, x=0.01, ha="left")
    fig.tight_layout()
    try:
        with atomic_file(path) as f:
            fig.savefig(f, format="png", dpi=110)
    finally:
        plt.close(fig)
    return path


def _grid(ax, g, weights: np.ndarray, causal: bool, cmap, norm) -> None:
    """All maps in one image; with more layers than heads, layers run across."""
    L, H, S_q, S_k = weights.shape
    transpose = L > H
    ax.imshow(rgba(grid_image(weights, causal=causal, transpose=transpose), cmap, norm), interpolation="nearest")
    across, down = (g.layers, g.heads) if transpose else (g.heads, g.layers)
    step_x, step_y = max(1, len(across) // 40), max(1, len(down) // 24)
    ax.set_xticks([k * (S_k + GAP) + S_k / 2 - 0.5 for k in range(0, len(across), step_x)],
                  [str(v) for v in across[::step_x]], fontsize=8)
    ax.set_yticks([k * (S_q + GAP) + S_q / 2 - 0.5 for k in range(0, len(down), step_y)],
                  [str(v) for v in down[::step_y]], fontsize=8)
    ax.set_xlabel("layer" if transpose else "head")
    ax.set_ylabel("head" if transpose else "layer")
    ax.set_title(f"{g.name}: {L} layers × {H} heads", fontsize=11, loc="left")
    ax.set_anchor("W")
    for spine in ax.spines.values():
        spine.set_visible(False)


def _enlarged(ax, g, weights: np.ndarray, causal: bool, cmap, norm, *, title: str):
    S_q, S_k = weights.shape
    if causal:
        weights = np.where(np.triu(np.ones_like(weights, dtype=bool), k=1), -1.0, weights)
    ax.imshow(rgba(weights, cmap, norm), interpolation="nearest")
    image = ax.imshow(np.full((1, 1), np.nan), cmap=cmap, norm=norm, visible=False)  # for the colour bar
    step = max(1, max(S_q, S_k) // 48)
    ax.set_xticks(range(0, S_k, step), [_label(t) for t in g.keys[::step]], rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(0, S_q, step), [_label(t) for t in g.queries[::step]], fontsize=8)
    ax.set_anchor("W")
    ax.set_xlabel("attended (key) token")
    ax.set_ylabel("attending (query) token")
    ax.set_title(f"{g.name}, {title}", fontsize=11, loc="left")
    return image


def _label(token: str) -> str:
    text = token.replace("\n", "⏎").replace("\t", "⇥").strip()
    return (text or "␣")[:16]
