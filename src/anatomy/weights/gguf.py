"""A GGUF file's matrices as weight formats, under the model's own parameter names.

    formats = matrix_formats(read_gguf(path))
    formats["stack.blocks.0.attn.qkv.weight"]  -> Int4Weight int4[960,576]g32 (q, k, v fused, rotary rows in HF order)
    formats["stack.embed.tokens.weight"]       -> Int8GroupWeight int8g[49152,576]g32 (also the LM head when tied)

The same mapping as checkpoints.gguf's loader (tensor_parts: which GGUF tensors fill which rows),
except that the blocks are kept, not dequantized: rows are whole blocks, so fusing and the
rotary row reordering move raw bytes. `lossless_format` is the format of one of the model's
matrices when every part of it has one (gguf_blocks.format_from_gguf): one format where the parts
have one in common (one_format), else a SplitRowsWeight of spans in their own; `expert_formats` the
same for each expert of a stacked expert tensor, where the parts have one in common.
"""

from __future__ import annotations

from anatomy.checkpoints.assign import expected_shapes
from anatomy.checkpoints.gguf_config import config_from_gguf, gguf_architecture
from anatomy.checkpoints.gguf_names import Part, part_bytes, tensor_parts
from anatomy.checkpoints.gguf_reader import GGUFFile
from anatomy.deprecation import deprecated
from anatomy.errors import CheckpointError
from anatomy.models import build_model
from anatomy.weights.formats import Int4Weight, Int5Weight, WeightFormat
from anatomy.weights.gguf_blocks import format_from_gguf, has_lossless_format
from anatomy.weights.modules import StackedFormats
from anatomy.weights.split import SplitRowsWeight


def matrix_formats(f: GGUFFile) -> dict[str, WeightFormat]:
    """{model parameter name: format} for every plain 2-D weight of the model the file describes
    whose GGUF types all have a lossless format."""
    config = config_from_gguf(f)
    shapes = expected_shapes(build_model(config, device="meta"))
    parts_of = tensor_parts(shapes, config, gguf_architecture(f))
    out = {}
    for name, parts in parts_of.items():
        if len(shapes[name]) == 2 and plain_matrix(parts):
            fmt = lossless_format(f, parts, shapes[name][1], label=name)
            if fmt is not None:
                out[name] = fmt
    return out


def plain_matrix(parts: list[Part]) -> bool:
    """Parts that are rows of one matrix, as stored (not stacked experts or heads, not values kept with an offset)."""
    return not any(p.experts or p.per_head or p.offset for p in parts)


def lossless_format(f: GGUFFile, parts: list[Part], K: int, *, label: str) -> WeightFormat | None:
    """The format holding the matrix made of `parts` (fused along rows) exactly, or None when a part's
    type has no lossless format (the matrix is then dequantized). Parts with no common format (Q4_K
    q, k beside a Q6_K v) give a SplitRowsWeight: each span of neighbours that have one, fused."""
    if not all(has_lossless_format(f.tensors[p.name].type) for p in parts):
        return None
    spans = [_fused(span, label) for span in common_spans([_part_format(f, p, K) for p in parts])]
    return spans[0] if len(spans) == 1 else SplitRowsWeight(spans, label=label)


def common_spans(fmts: list[WeightFormat]) -> list[list[WeightFormat]]:
    """`fmts` cut into the fewest spans of neighbours, each in one format that holds every member
    exactly (one_format; a span keeps the longest prefix that has one)."""
    spans: list[list[WeightFormat]] = []
    for fmt in fmts:
        joined = one_format([*spans[-1], fmt]) if spans else None
        if joined is None:
            spans.append([fmt])
        else:
            spans[-1] = joined
    return spans


def common_runs(fmts: list[WeightFormat]) -> list[list[WeightFormat]]:
    """Deprecated name of `common_spans` (a run is one generation)."""
    deprecated("anatomy.weights.gguf.common_runs is deprecated; use common_spans")
    return common_spans(fmts)


def _fused(fmts: list[WeightFormat], label: str) -> WeightFormat:
    return fmts[0] if len(fmts) == 1 else WeightFormat.cat_rows(fmts, label=label)


def expert_formats(f: GGUFFile, parts: list[Part], shape: tuple[int, int, int], *, label: str) -> StackedFormats | None:
    """Each expert's matrix [N, K] of a stacked expert tensor [E, N, K] made of `parts` (GGUF `ffn_*_exps`
    [E, rows, K], fused along rows) in the format that holds it exactly, or None when a part's type has
    none (the experts are then dequantized)."""
    if not parts or not all(p.experts and not p.offset for p in parts):
        return None
    if not all(has_lossless_format(f.tensors[p.name].type) for p in parts):
        return None
    E, _, K = shape
    per_expert = []
    for e in range(E):
        fmts = one_format([_expert_part_format(f, p, e, K) for p in parts])
        if fmts is None:
            return None
        per_expert.append(_fused(fmts, f"{label}.{e}"))
    return StackedFormats(per_expert, label=label)


def _expert_part_format(f: GGUFFile, part: Part, e: int, K: int) -> WeightFormat:
    """Expert e's rows of a stacked GGUF tensor [E, rows, K]: its bytes are the e-th of E equal runs."""
    t = f.tensors[part.name]
    if t.shape != (part.experts, part.rows, K):
        raise CheckpointError(f"{f.path}: {part.name} has shape {list(t.shape)}, the model needs "
                              f"{[part.experts, part.rows, K]}")
    size = t.type.nbytes(part.rows * K)
    return format_from_gguf(f.raw(part.name)[e * size:(e + 1) * size], t.type, (part.rows, K),
                            label=f"{part.name}[{e}]")


def one_format(fmts: list[WeightFormat]) -> list[WeightFormat] | None:
    """The parts of a fused matrix in one format that holds each exactly (llama.cpp's mixes give q, k
    Q5_0 and v Q8_0, or Q4_K beside Q5_0): int4 widened to int5, int5 with offsets -16 * scale (Q5_0)
    as int8g; None when the parts have no such format (the matrix is then dequantized)."""
    names = {fmt.name for fmt in fmts}
    if len(names) == 1:
        return fmts
    if names == {"int4", "int5"}:
        return [Int5Weight.from_int4(fmt) if isinstance(fmt, Int4Weight) else fmt for fmt in fmts]
    if names == {"int5", "int8g"}:
        out = [fmt.as_int8g() if isinstance(fmt, Int5Weight) else fmt for fmt in fmts]
        return None if any(fmt is None for fmt in out) else out
    return None


def named(formats: dict[str, WeightFormat], suffix: str) -> str:
    """The one name in `formats` ending with `suffix` (e.g. "blocks.0.attn.qkv.weight")."""
    found = [n for n in formats if n == suffix or n.endswith("." + suffix)]
    if len(found) != 1:
        raise KeyError(f"{len(found)} weights end with {suffix!r}")
    return found[0]


def _part_format(f: GGUFFile, part: Part, K: int) -> WeightFormat:
    t = f.tensors[part.name]
    if t.shape != (part.rows, K):
        raise CheckpointError(f"{f.path}: {part.name} has shape {list(t.shape)}, the model needs {[part.rows, K]}")
    return format_from_gguf(part_bytes(f.raw(part.name), part), t.type, t.shape, label=part.name)
