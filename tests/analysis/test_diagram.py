"""The block diagram shows what the modules are: norm class and placement, FFN, positions."""

from __future__ import annotations

from anatomy.analysis.diagram import describe, mermaid, text
from anatomy.presets import get_preset


def test_llama_3_block():
    shape = describe(get_preset("llama-3-8b"))
    assert shape.pre_norm and shape.norm == "RMSNorm" and shape.ffn.startswith("GLU silu")
    assert shape.attention == "GQA H=32 H_kv=8 d_h=128" and shape.position.startswith("RoPE")
    lines = text(shape).splitlines()
    assert lines[0].startswith("block (Pre-Norm") and lines[2:5] == [
        "  -> RMSNorm", "  -> self-attention GQA H=32 H_kv=8 d_h=128", "  -> + residual"]


def test_bert_block_is_post_norm_with_learned_positions():
    shape = describe(get_preset("bert-base"))
    assert not shape.pre_norm and shape.norm == "LayerNorm" and shape.ffn.startswith("MLP gelu")
    assert shape.position.startswith("learned")
    lines = text(shape).splitlines()
    assert lines[2:5] == ["  -> self-attention MHA H=12 H_kv=12 d_h=64", "  -> + residual", "  -> LayerNorm"]


def test_mermaid_of_the_original_transformer_decoder_block():
    shape = describe(get_preset("transformer-base"))
    chart = mermaid(shape)
    assert chart.startswith("flowchart TB") and "cross-attention" in chart and "sinusoidal" in chart
    assert "Post-Norm" in chart and chart.count("-. residual .->") == 3
    assert describe(get_preset("llama-7b", position="alibi")).position.startswith("ALiBi")
