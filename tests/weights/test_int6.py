"""int6 (weights/int6.py): GGUF Q6_K blocks carried over dequantize bit for bit to what gguf-py's
independent decoder and anatomy's ggml dequantization give; row operations and column cuts on
super-blocks; the weights= choices that keep it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from anatomy.checkpoints.gguf_dequant import dequantize
from anatomy.checkpoints.gguf_types import TENSOR_TYPES_BY_NAME
from anatomy.errors import InputError
from anatomy.weights.formats import WeightFormat
from anatomy.weights.gguf_blocks import format_from_gguf
from anatomy.weights.int6 import Int6Weight

gguf = pytest.importorskip("gguf")
Q6_K = TENSOR_TYPES_BY_NAME["Q6_K"]


def random_q6_k(rows: int, K: int, seed: int = 0) -> np.ndarray:
    """Raw Q6_K bytes of a [rows, K] weight: random codes and int8 sub-scales, finite float16 d."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows * K // 256, 210), dtype=np.uint8)
    d = (rng.standard_normal((rows * K // 256, 1)) * 1e-3).astype(np.float16)
    blocks[:, 208:210] = d.view(np.uint8)
    return blocks.reshape(-1)


def int6(rows: int, K: int, seed: int = 0) -> Int6Weight:
    fmt = format_from_gguf(random_q6_k(rows, K, seed), Q6_K, (rows, K), label="w")
    assert isinstance(fmt, Int6Weight)
    return fmt


def gguf_py(raw: np.ndarray, rows: int) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(raw.reshape(rows, -1), gguf.GGMLQuantizationType.Q6_K))


@pytest.mark.parametrize("rows, K", [(1, 256), (7, 768), (16, 1536)])
def test_q6_k_blocks_carry_over_exactly(rows, K):
    raw = random_q6_k(rows, K, seed=K)
    fmt = format_from_gguf(raw, Q6_K, (rows, K), label="w")
    assert isinstance(fmt, Int6Weight) and fmt.signature == f"int6[{rows},{K}]g16"
    assert torch.equal(fmt.dequantize(), gguf_py(raw, rows))  # bit for bit, gguf-py's decoder
    assert torch.equal(fmt.dequantize(), dequantize(raw, Q6_K, (rows, K)))
    assert fmt.nbytes == Q6_K.nbytes(rows * K)  # 6.5625 bits a weight, the file's size
    assert fmt.codes().shape == (rows, K) and int(fmt.codes().max()) <= 63


def test_row_operations_and_embedding_rows():
    a, b = int6(5, 512, seed=1), int6(3, 512, seed=2)
    fused = WeightFormat.cat_rows([a, b], label="qkv")
    dense = fused.dequantize()
    assert fused.shape == (8, 512) and torch.equal(dense, torch.cat([a.dequantize(), b.dequantize()]))
    index = torch.tensor([[6, 0], [2, 7]])
    assert torch.equal(fused.rows(index), dense[index])  # [2, 2, 512]
    assert torch.equal(fused.take_rows(torch.tensor([4, 1])).dequantize(), dense[[4, 1]])
    with pytest.raises(InputError, match="cannot fuse"):
        WeightFormat.cat_rows([a, int6(2, 768)])


def test_columns_are_cut_on_super_blocks():
    fmt = int6(4, 1024)
    part = fmt.take_columns(256, 768, label="down.shard")
    assert part.shape == (4, 512) and part.label == "down.shard"
    assert torch.equal(part.dequantize(), fmt.dequantize()[:, 256:768])
    with pytest.raises(InputError, match=r"columns \[128, 768\).*super-blocks of 256"):
        fmt.take_columns(128, 768)


def test_bad_buffers_name_the_rule():
    fmt = int6(2, 256)
    with pytest.raises(InputError, match=r"down: int6 .*K = 256, scale torch.float32"):
        Int6Weight(fmt.low, fmt.high, fmt.scale.float(), fmt.d, label="down")
    with pytest.raises(InputError, match=r"K a positive multiple of 256.*K = 64"):
        Int6Weight(fmt.low[:, :32], fmt.high[:, :16], fmt.scale[:, :4], fmt.d[:, :1])


@pytest.mark.parametrize("choice", ["auto", "int8", "int4"])
def test_the_choices_that_keep_it(choice):
    """auto and int8 keep a Q6_K matrix (exact, under 8 bits a weight); int4 converts it, but for the
    token table and the LM head, which it keeps at int8's precision or better."""
    from anatomy import build_model, get_preset
    from anatomy.weights.choice import compact_formats

    model = build_model(get_preset("llama-7b", vocab_size=64, d_model=256, n_layers=1, n_heads=4, d_ff=256))
    kept = {name: int6(*module.weight.shape, seed=i) for i, (name, module) in enumerate(
        (n, m) for n, m in model.named_modules() if hasattr(m, "weight") and m.weight.dim() == 2)}
    formats = compact_formats(model, choice, dtype=torch.float32, lossless=lambda n: kept[n.removesuffix(".weight")],
                              dense=lambda n: kept[n.removesuffix(".weight")].dequantize())
    for name, fmt in formats.items():
        table_or_head = name.startswith(("lm_head", "stack.embed"))
        assert (fmt is kept[name.removesuffix(".weight")]) == (choice != "int4" or table_or_head), name
