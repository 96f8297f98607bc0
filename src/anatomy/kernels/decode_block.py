"""A decode step's blocks as one native operator each (kernels/native/block.cpp).

    fuse_blocks(view, plan, formats)      each LLaMA-style block becomes a NativeBlock where the native
                                          library runs and the operator measured faster (kernels/decisions.py)
    NativeBlock(x [B, 1, D], ctx, cache)  a decode step of up to `max_rows` rows in one operator -> [B, 1, D];
                                          anything else (prefill, a span, an 8-bit cache) runs the block as it is

Why: a small model's decode step is bound by the host, dozens of torch operators per block around
its four products; `anatomy::decode_block` does the same arithmetic in one call. Only blocks it
covers exactly are swapped; which ones, and the products' activations: docs/inference.md, "Speed".
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from anatomy.kernels import native
from anatomy.kernels.candidates import K4T, KERNELS_BY_NAME, L4T, Q4T, Q5T, Q6T, Q8T, Form
from anatomy.kernels.decisions import decided
from anatomy.kernels.norm import NativeRMSNorm
from anatomy.kernels.planned_linear import PlannedLinear
from anatomy.kernels.planning import model_id
from anatomy.kernels.record import KernelPlan, by_kernel
from anatomy.layers.attention import Attention
from anatomy.layers.block import Block
from anatomy.layers.pass_inputs import PassInputs
from anatomy.layers.ffn import GLU
from anatomy.layers.norm import RMSNorm
from anatomy.weights.formats import WeightFormat
from anatomy.weights.modules import SplitLinear

LINEARS = ("attn.qkv", "attn.out", "ffn.gate_up", "ffn.down")  # in the operator's order
INT8_KERNELS = ("q4x", "q8x", "q5x", "q6x")  # int8 activations on each native layout (q4f/q8f/q5f/q6s share it)
# a row layout's tiles, and how they are packed from it (q4, q5: with the format's `symmetric`, formats.Symmetric)
TILES = {"q4x": (Q4T, lambda held, fmt: torch.ops.anatomy.pack_q4_tiles(held, fmt.symmetric)),
         "q5x": (Q5T, lambda held, fmt: torch.ops.anatomy.pack_q5_tiles(held, fmt.symmetric)),
         "q6x": (Q6T, lambda held, fmt: torch.ops.anatomy.pack_q6_tiles(held))}
# On tiles (AVX-512 VNNI) a product takes its activations rounded to int16 (tiles.cpp, q6_tiles.cpp): its error is
# int8's times this ratio (the rounding steps'), within the plan's bound, and int16 keeps near-ties of a
# greedy answer that int8 activations flip, for a small cost per step (docs/inference.md, "Speed")
INT16_ERROR = 127 / 32767
# Past decode's rows (the plan's later phases, routed by row count as a PlannedLinear routes), a tile's product
# takes int8 activations where the plan chose the tiles' int8 kernel for that phase
INT8_TILE_KERNELS = {Q4T.name: "q4t", Q5T.name: "q5t", Q6T.name: "q6t", Q8T.name: "q8t", L4T.name: "l4t",
                     K4T.name: "k4t"}
CACHE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
ROWS = (1, 2, 4, 8, 16)  # the decode batches the operator is timed on against the block


class NativeBlock(Block):
    """A Block whose decode steps run as anatomy::decode_block; every other pass runs as the Block it
    was made from (whose modules, under the same names, and settings it takes over)."""

    def __init__(self, block: Block, weights: list[list[Tensor]], int8: int,
                 routes: list[tuple[int | None, int]] | None = None) -> None:
        nn.Module.__init__(self)
        for name, child in block.named_children():
            self.add_module(name, child)
        vars(self).update({k: v for k, v in vars(block).items() if not k.startswith("_")})
        # the four products' native layouts, each one or more (a split weight's runs, their outputs side by
        # side); bit i of int8: the i-th layout of the flat list takes int8 activations. routes: (the plan
        # phase's most rows, None: any; its mask) in the plan's order, the first phase's mask int8
        self.weights, self.int8 = [w for product in weights for w in product], int8
        self.routes = routes if routes is not None else [(None, int8)]
        self.counts = [len(product) for product in weights]
        self.max_rows = 1  # the most rows of a decode step the operator computes (measured: fuse_blocks)
        attn = self.attn
        self.n_heads, self.head_dim = attn.n_heads, attn.head_dim
        self.scale = attn.scale if attn.scale is not None else attn.head_dim ** -0.5
        self.norms = (self.attn_norm.weight, self.ffn_norm.weight)
        self.eps = self.attn_norm.eps

    def forward(self, x: Tensor, ctx: PassInputs = PassInputs(), *, cache=None, memory_kv=None,
                weights=None) -> Tensor:
        step = self._step(x, ctx, cache) if weights is None else None
        if step is None:
            return super().forward(x, ctx, cache=cache, memory_kv=memory_kv, weights=weights)
        k, v, where, tables = step
        B = x.shape[0]
        cos, sin = (t.expand(B, 1, 1, self.head_dim).reshape(B, self.head_dim) for t in ctx.rope)
        int8 = next(mask for rows, mask in self.routes if rows is None or B <= rows)
        out = torch.ops.anatomy.decode_block(x.reshape(B, -1), *self.norms, self.eps, self.weights, self.counts,
                                             int8, cos, sin, k, v, ctx.mask, where, tables, self.n_heads, self.scale)
        return out.view(B, 1, -1)

    def _step(self, x: Tensor, ctx: PassInputs, cache) -> tuple | None:
        """(k, v, where, tables) of a decode step the operator computes; None for any other pass."""
        if x.shape[1] != 1 or x.shape[0] > self.max_rows or x.dtype != torch.float32 or ctx.rope is None \
                or ctx.bias is not None:
            return None
        if ctx.rope[0].shape[-1] != self.head_dim:  # partial rotary
            return None
        pool = getattr(cache, "pool", None)  # a paged cache's layer (inference/engine/paged.py)
        if pool is None or pool.kind is not None or pool.k.dtype not in CACHE_DTYPES:
            return None
        where = cache.at(ctx.input_pos)
        if where.new != 1:
            return None
        return pool.k, pool.v, where.slots, where.tables.view(where.rows, where.blocks)


def fusable(block: nn.Module) -> bool:
    """Does anatomy::decode_block compute exactly what this block computes in a decode step?"""
    if not isinstance(block, Block) or not block.pre_norm or block.moe or block.cross_attn is not None \
            or not isinstance(block.attn, Attention):
        return False
    if block.attn_out_norm is not None or block.ffn_out_norm is not None or block.window is not None \
            or block.rope != "main":
        return False
    norms = (block.attn_norm, block.ffn_norm)
    if not all(isinstance(n, NativeRMSNorm) or (isinstance(n, RMSNorm) and not n.unit_offset) for n in norms):
        return False
    attn, ffn = block.attn, block.ffn
    if attn.q_norm is not None or attn.softcap is not None or attn.sinks is not None or attn.head_dim % 16 \
            or attn.head_dim > 256:
        return False
    if not isinstance(ffn, GLU) or ffn.act is not F.silu or ffn.clamp is not None:
        return False
    return all(layers(block.get_submodule(n)) for n in LINEARS)


def layers(module: nn.Module) -> list[tuple[str, PlannedLinear]]:
    """(name under the module, layer) of each planned product of a linear module (a SplitLinear's
    parts), when each is a PlannedLinear without a bias; else []."""
    found = [("", module)] if not isinstance(module, SplitLinear) else \
        [(f"parts.{j}.", part) for j, part in enumerate(module.parts)]
    return found if all(isinstance(m, PlannedLinear) and m.bias is None for _, m in found) else []


def native_weight(layer: PlannedLinear, fmt: WeightFormat, plan: KernelPlan,
                  name: str) -> tuple[Tensor, bool, str | None] | None:
    """(the layer's native layout, whether its product takes int8 activations at decode's rows, the kernel
    whose choice in a later phase makes it take int8 there (None: it takes the same at any row count)), or
    None when the format has no native layout. An int4 (int5, int6) layout becomes q4 (q5, q6) tiles where
    they run (`tiled`), int16 activations at decode's rows; int8g held as q8 or l4 tiles, and int4 as k4
    tiles, runs on them (int16 activations at decode's rows too)."""
    for held_tiles in (Q8T, L4T, K4T):  # tiles held by the plan, never packed from a row layout here
        if (tiles := layer.layouts.get(held_tiles.name)) is not None:
            return tiles[0], False, INT8_TILE_KERNELS[held_tiles.name]
    for int8_kernel in INT8_KERNELS:
        form = KERNELS_BY_NAME[int8_kernel].form
        if form.accepts(fmt):
            measured = by_kernel(plan.for_layer(name).measurements.get("decode", [])).get(int8_kernel)
            error = measured.error if measured is not None else None
            tile_form, pack = TILES.get(int8_kernel, (None, None))
            if tile_form is not None and tile_form.accepts(fmt) and error is not None \
                    and error * INT16_ERROR <= plan.threshold:
                tiles = tiled(layer, fmt, tile_form, form, pack)
                kernel = INT8_TILE_KERNELS.get(tile_form.name)
                return None if tiles is None else (tiles, False, kernel)  # int16 activations at decode's rows
            prepared = layer.layouts.get(form.name) or (None if fmt.released else form.build(fmt))
            if prepared is None:
                return None  # the format was given back (take_weights): only a held layout can serve
            return prepared[0], error is not None and error <= plan.threshold, None
    return None


def tiled(layer: PlannedLinear, fmt: WeightFormat, form: Form, rows: Form,
          pack: Callable[[Tensor, WeightFormat], Tensor]) -> Tensor | None:
    """The layer's tiles of `form`: the plan's, else packed (`pack(layout, fmt)`) from the plan's
    layout of `rows`, else built (None: the format was given back and no layout holds them)."""
    if (tiles := layer.layouts.get(form.name)) is not None:
        return tiles[0]
    if (held := layer.layouts.get(rows.name)) is not None:
        return pack(held[0], fmt)
    return None if fmt.released else form.build(fmt)[0]


def native_block(name: str, block: Block, plan: KernelPlan, formats: dict[str, WeightFormat]) -> NativeBlock | None:
    weights, masks, i = [], [0] * len(plan.phases), 0
    for linear in LINEARS:
        product = []
        for part, layer in layers(block.get_submodule(linear)):
            layer_name = f"{name}.{linear}.{part}weight"
            found = native_weight(layer, formats[layer_name], plan, layer_name)
            if found is None:
                return None
            layout, int8, kernel = found
            choices = plan.for_layer(layer_name).choices
            for p, phase in enumerate(plan.phases):  # the first phase is decode's: int8 as found
                masks[p] |= (int8 if p == 0 or kernel is None else choices.get(phase.name) == kernel) << i
            product.append(layout)
            i += 1
        weights.append(product)
    return NativeBlock(block, weights, masks[0], [(phase.max_rows, m) for phase, m in zip(plan.phases, masks)])


def fuse_blocks(view: nn.Module, plan: KernelPlan | None, formats: dict[str, WeightFormat], *,
                cache: bool | str | Path = True) -> int:
    """Swap the view's blocks for NativeBlocks where the operator covers them and measures faster than
    the block on a one-row decode step here, each computing decode steps of up to the most rows of
    ROWS at which it still measures faster (more rows run as the block); how many were swapped. The
    measurement is made once per machine, model and plan and kept (kernels/decisions.py)."""
    if plan is None or not native.available():
        return 0
    blocks = view.stack.blocks
    swapped = {i: b for i, block in enumerate(blocks) if fusable(block)
               and (b := native_block(f"stack.blocks.{i}", block, plan, formats)) is not None}
    first = next(iter(swapped), None)
    if first is None:
        return 0
    choices = {w.key: [w.choices, w.forms] for w in plan.weights.values()}  # what the blocks would run
    depends_on = {"model": model_id(view), "plan": _digest(choices), "fused": sorted(swapped),
                  "activations": swapped[first].routes}
    max_rows = decided("fused_rows", depends_on, measure=lambda: fused_rows(blocks[first], swapped[first], view),
                       cache=cache)
    if not max_rows:
        return 0
    for i, b in swapped.items():
        b.max_rows = max_rows
        blocks[i] = b
    return len(swapped)


def fused_rows(block: Block, fused: NativeBlock, view: nn.Module) -> int:
    """The most rows of ROWS up to which the operator measures faster than the block (0: not even one)."""
    max_rows = 0
    for rows in ROWS:
        if not faster(block, fused, view, rows=rows):
            break
        max_rows = rows
    return max_rows


def _digest(data) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


@torch.inference_mode()
def faster(block: Block, fused: NativeBlock, view: nn.Module, *, rows: int = 1, slots: int = 256, rounds: int = 5,
           calls: int = 20) -> bool:
    """Is the operator faster than the block it stands for, on `rows` rows over a cache of `slots`?
    Timed in alternating rounds (the fastest round of each), the block's own tensors and a scratch cache."""
    from anatomy.inference.engine.kv_cache import KVCache
    from anatomy.models.position_rules import PositionTables

    config = view.config
    dtype = layers(block.attn.qkv)[0][1].dtype
    cache = KVCache(config, batch=rows, max_len=slots, n_layers=1,
                    dtype=dtype if dtype in CACHE_DTYPES else torch.float32)[0]
    pos = torch.tensor([slots // 2])
    tables = PositionTables(view.stack.position_rules, length=slots, dtype=dtype)
    ctx = tables.build(pos.expand(rows)[:, None], q_slots=pos, input_pos=pos)
    fused.max_rows = rows
    x = torch.randn(rows, 1, config.d_model)
    best = {}
    for _ in range(rounds):
        for name, module in (("block", block), ("fused", fused)):
            start = time.perf_counter()
            for _ in range(calls):
                module(x, ctx, cache=cache)
            best[name] = min(best.get(name, float("inf")), time.perf_counter() - start)
    return best["fused"] < best["block"]
