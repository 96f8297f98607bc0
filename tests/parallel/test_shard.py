"""A rank's shard, cut in this process (cutting issues no collective): its structure, and compact weights
cut in their own format along whole groups (exactly the dequantized slice) or refused naming the layer."""

from __future__ import annotations

import pytest
import torch

import anatomy
from anatomy.errors import InputError
from anatomy.parallel.collectives import Comm
from anatomy.parallel.layers import RowParallelLinear, VocabParallelEmbedding, VocabParallelHead
from anatomy.parallel.layout import Layout
from anatomy.parallel.shard import Place, shard_model
from anatomy.parallel.stages import ReceivedLogits, StageInput, StageOutput
from anatomy.weights.formats import FloatWeight, Int4Weight, Int8GroupWeight, Int8Weight
from anatomy.weights.modules import CompactLinear

from .conftest import tiny


def place(layout: Layout, rank: int) -> Place:
    stage, _ = layout.coords(rank)
    ranks = [layout.rank(stage, r) for r in range(layout.tp)]
    return Place(layout, rank, Comm(None, ranks=ranks, rank=rank))


@pytest.mark.parametrize("make", [
    lambda w: FloatWeight.from_float(w), lambda w: FloatWeight.from_float(w, dtype=torch.bfloat16),
    Int8Weight.from_float, Int8GroupWeight.from_float, Int4Weight.from_float,
    lambda w: Int4Weight.from_float(w, group=64),
])
def test_column_cuts_are_the_dequantized_columns_exactly(make):
    w = torch.randn(6, 256)
    fmt = make(w)
    whole = fmt.dequantize()
    for start, stop in ((0, 128), (128, 256), (64, 192)):
        part = fmt.take_columns(start, stop)
        assert part.shape == (6, stop - start) and part.name == fmt.name
        assert torch.equal(part.dequantize(), whole[:, start:stop])
        assert part.nbytes < fmt.nbytes


def test_a_cut_through_a_group_is_refused_naming_the_layer_and_the_rule():
    fmt = Int4Weight.from_float(torch.randn(4, 128), label="stack.blocks.0.ffn.down.weight")
    with pytest.raises(InputError, match=r"stack\.blocks\.0\.ffn\.down\.weight int4\[4,128\]g32: columns \[0, 48\) "
                                         r"do not fall on its groups of 32.* a multiple of 32"):
        fmt.take_columns(0, 48)


def test_an_int4_model_whose_ffn_shard_cuts_its_groups_is_refused(tmp_path):
    """d_ff = 96 over 2 ranks: the down projection's 48 columns per rank cut its groups of 32."""
    model = anatomy.build_model(anatomy.get_preset("llama-7b", vocab_size=97, d_model=64, n_heads=4, n_kv_heads=2,
                                                   n_layers=1, d_ff=96, max_seq_len=64))
    anatomy.save(model, tmp_path / "m")
    int4 = anatomy.load(tmp_path / "m", weights="int4")
    with pytest.raises(InputError, match=r"stack\.blocks\.0\.ffn\.down\.weight .*columns \[0, 48\) do not fall on its "
                                         r"groups of 32"):
        shard_model(int4, place(Layout(tp=2), 0))


def test_int4_shards_keep_their_format_and_dequantize_to_the_model_s_slice(int4_tiny):
    shard = shard_model(int4_tiny, place(Layout(tp=2), 1))
    down = shard.stack.blocks[0].ffn.down
    assert isinstance(down, RowParallelLinear) and isinstance(down.local, CompactLinear)
    assert down.local.compact.name == "int4" and down.local.compact.shape == (64, 64)
    full = int4_tiny.stack.blocks[0].ffn.down.compact.dequantize()
    assert torch.equal(down.local.compact.dequantize(), full[:, 64:])


def test_the_structure_of_tensor_and_pipeline_shards():
    model = tiny("llama")
    tp = shard_model(model, place(Layout(tp=2), 1))
    attn = tp.stack.blocks[0].attn
    assert (attn.n_heads, attn.n_kv_heads, attn.qkv.out_features) == (2, 1, (2 + 2 * 1) * 16)
    assert isinstance(attn.out, RowParallelLinear) and attn.out.in_features == 32
    assert isinstance(tp.stack.embed.tokens, VocabParallelEmbedding) and tp.stack.embed.tokens.start == 49
    assert isinstance(tp.lm_head, VocabParallelHead) and tp.lm_head.local.out_features == 49
    q = model.stack.blocks[0].attn.qkv.weight
    assert torch.equal(attn.qkv.weight[:32], q[32:64])  # query heads 2 and 3
    assert torch.equal(attn.qkv.weight[32:48], q[64 + 16:64 + 32])  # kv head 1's keys
    first, last = (shard_model(model, place(Layout(pp=2), r)) for r in (0, 1))
    assert len(first.stack.blocks) == len(last.stack.blocks) == 1
    assert isinstance(first.stack.final_norm, StageOutput) and isinstance(first.lm_head, ReceivedLogits)
    assert isinstance(last.stack.embed, StageInput)
    assert last.stack.blocks[0].ffn.gate_up.weight.data_ptr() == model.stack.blocks[1].ffn.gate_up.weight.data_ptr()
    assert not any(p.is_meta for p in first.parameters()) and not any(p.is_meta for p in last.parameters())
    assert model.stack.blocks[0].attn.n_heads == 4  # the model is left as it was
