"""One block: Pre-Norm x + f(norm(x)) vs Post-Norm norm(x + f(x)), cross-attention, dropout, and
HF's Llama decoder layer and BERT layer as references."""

from __future__ import annotations

import pytest
import torch

from anatomy import ModelConfig
from anatomy.layers import Block
from anatomy.layers.pass_inputs import PassInputs


def config(**changes) -> ModelConfig:
    base = dict(vocab_size=10, d_model=32, n_layers=1, n_heads=4, d_ff=48, qkv_bias=True, attn_out_bias=True,
                ffn_bias=True)
    return ModelConfig(**{**base, **changes})


def _randomize(module):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.1 + (1.0 if p.dim() == 1 and p.shape[0] == 32 else 0.0))


def test_pre_and_post_norm_compose_differently():
    x = torch.randn(2, 5, 32)
    pre = Block(config(norm_position="pre"), causal=False).eval()
    _randomize(pre)
    post = Block(config(norm_position="post"), causal=False).eval()
    post.load_state_dict(pre.state_dict())
    with torch.no_grad():
        h = x + pre.attn(pre.attn_norm(x))
        assert (pre(x) - (h + pre.ffn(pre.ffn_norm(h)))).abs().max() <= 1e-5
        h = post.attn_norm(x + post.attn(x))
        assert (post(x) - post.ffn_norm(h + post.ffn(h))).abs().max() <= 1e-5


def test_matches_hf_llama_decoder_layer():
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    hf_config = transformers.LlamaConfig(hidden_size=32, intermediate_size=48, num_attention_heads=4,
                                         num_key_value_heads=2, rms_norm_eps=1e-5)
    hf_config._attn_implementation = "eager"
    ref = LlamaDecoderLayer(hf_config, layer_idx=0).eval()
    _randomize(ref)
    ours = Block(config(norm="rmsnorm", norm_eps=1e-5, ffn="glu", activation="silu", n_kv_heads=2, position="rope",
                        qkv_bias=False, attn_out_bias=False, ffn_bias=False), causal=True).eval()
    a, m = ref.self_attn, ref.mlp
    with torch.no_grad():
        ours.attn.qkv.weight.copy_(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
        ours.attn.out.weight.copy_(a.o_proj.weight)
        ours.ffn.gate_up.weight.copy_(torch.cat([m.gate_proj.weight, m.up_proj.weight]))
        ours.ffn.down.weight.copy_(m.down_proj.weight)
        ours.attn_norm.weight.copy_(ref.input_layernorm.weight)
        ours.ffn_norm.weight.copy_(ref.post_attention_layernorm.weight)
    x, pos = torch.randn(2, 6, 32), torch.arange(6)[None].expand(2, 6)
    cos, sin = LlamaRotaryEmbedding(hf_config)(x, pos)
    causal = torch.full((6, 6), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        expected = ref(x, attention_mask=causal, position_embeddings=(cos, sin), position_ids=pos)
        expected = expected[0] if isinstance(expected, tuple) else expected
        assert (ours(x, PassInputs(rope=(cos[:, :, None], sin[:, :, None]))) - expected).abs().max() <= 1e-5


def test_cross_attention_block_reads_the_memory():
    block = Block(config(norm_position="post"), causal=True, cross=True).eval()
    x, memory = torch.randn(1, 4, 32), torch.randn(1, 3, 32)
    with torch.no_grad():
        a = block(x, memory_kv=block.cross_attn.project_memory(memory))
        b = block(x, memory_kv=block.cross_attn.project_memory(memory + 1))
    assert a.shape == (1, 4, 32) and (a - b).abs().max() > 1e-3
    children = [n for n, _ in block.named_children()]
    assert children == ["attn_norm", "attn", "cross_norm", "cross_attn", "ffn_norm", "ffn"]


def test_dropout_only_in_training():
    block = Block(config(dropout=0.5), causal=False)
    x = torch.randn(2, 5, 32)
    block.train()
    assert not torch.equal(block(x), block(x))
    block.eval()
    assert torch.equal(block(x), block(x))
