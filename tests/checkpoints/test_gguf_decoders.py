"""GGUF for today's decoders against llama.cpp (llama-cpp-python): what anatomy writes for a tiny
random model of each architecture, llama.cpp runs with the same logits; anatomy reads it back into
the same config and weights; what llama.cpp would run differently is refused, naming the field."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from anatomy import build_model, get_preset
from anatomy.checkpoints.gguf import load_gguf, read_gguf, save_gguf
from anatomy.checkpoints.gguf_config import gguf_problems
from anatomy.errors import CheckpointError

llama_cpp = pytest.importorskip("llama_cpp")

V = 64
TOKENIZER = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default",
             "tokenizer.ggml.tokens": [f"t{i}" for i in range(V)], "tokenizer.ggml.token_type": [1] * V,
             "tokenizer.ggml.merges": ["t 0"], "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2}
IDS = [1, 5, 9, 13, 40, 22, 7, 63, 0, 31, 17, 4, 50, 33]  # longer than Gemma 2's window below
BASE = dict(vocab_size=V, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=96, max_seq_len=128,
            bos_token_id=1, eos_token_id=2)
GEMMA = dict(norm_unit_offset=True, embedding_scale=True, activation="gelu_tanh", tie_embeddings=True, head_dim=32)
LLAMA3 = dict(kind="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_seq_len=8192)
# llama.cpp's CPU GELU reads a float16 table: ~1e-3 on logits of size ~10 (as for gpt2)
CASES = {  # name: (fields, GGUF architecture, tolerance)
    "qwen2": (dict(qkv_bias=True), "qwen2", 1e-4),
    "mixtral": (dict(n_experts=4, n_experts_per_token=2), "llama", 1e-4),
    "qwen3": (dict(qk_norm=True, head_dim=24), "qwen3", 1e-4),
    "qwen2moe": (dict(qkv_bias=True, n_experts=4, n_experts_per_token=2, d_ff_expert=32, d_ff_shared_expert=48,
                      shared_expert_gate=True, moe_renormalize=False), "qwen2moe", 1e-4),
    "qwen3moe": (dict(qk_norm=True, n_experts=4, n_experts_per_token=2, d_ff_expert=32), "qwen3moe", 1e-4),
    "gemma": (dict(GEMMA, n_kv_heads=1), "gemma", 1e-2),
    "gemma2": (dict(GEMMA, branch_output_norm=True, attn_scale=32 ** -0.5, attn_softcap=20.0, logit_softcap=8.0,
                    sliding_window=4, sliding_window_layers=(0,)), "gemma2", 5e-3),
    "gemma3": (dict(GEMMA, branch_output_norm=True, qk_norm=True, attn_scale=32 ** -0.5, n_layers=3, sliding_window=4,
                    sliding_window_layers=(0, 1), rope_theta=1e6, rope_scaling=dict(kind="linear", factor=4.0),
                    sliding_rope_theta=100.0, logit_softcap=8.0), "gemma3", 5e-3),
    "smollm3": (dict(n_layers=4, nope_layers=(3,), rope_theta=2e6), "smollm3", 1e-4),
    "gpt-oss": (dict(qkv_bias=True, attn_out_bias=True, ffn_bias=True, attn_sinks=True, n_experts=4,
                     n_experts_per_token=2, d_ff_expert=32, router_bias=True, swiglu_limit=7.0, swiglu_alpha=1.702,
                     sliding_window=4, sliding_window_layers=(0,), head_dim=16, rope_theta=1000.0, max_seq_len=64,
                     rope_scaling=dict(kind="yarn", factor=4.0, original_max_seq_len=8,
                                       attention_factor=0.1 * math.log(4.0) + 1.0)), "gpt-oss", 1e-4),
    "phi3": (dict(rotary_dim=8), "phi3", 1e-4),
    "llama-linear": (dict(rope_scaling=dict(kind="linear", factor=2.0)), "llama", 1e-4),
    "llama3.1": (dict(rope_scaling=LLAMA3, rope_theta=500000.0), "llama", 1e-4),  # d=16: every band of the rule
    "llama-yarn": (dict(rope_scaling=dict(kind="yarn", factor=4.0, original_max_seq_len=8,
                                          attention_factor=0.1 * math.log(4.0) + 1.0), rope_theta=1000.0),
                   "llama", 1e-4),  # past 8 positions
}


def _tiny(**fields):
    torch.manual_seed(0)
    config = get_preset("llama-7b", **{**BASE, **fields})
    model = build_model(config).eval()
    for p in model.parameters():  # logits of order 10; norms away from their initial values
        if p.dim() >= 2:
            p.data.normal_(0, 0.3)
        else:
            p.data.uniform_(-0.5, 0.5) if config.norm_unit_offset else p.data.uniform_(0.5, 1.5)
    return model


def _llama_cpp_logits(path, ids: list[int]) -> torch.Tensor:
    llm = llama_cpp.Llama(model_path=str(path), logits_all=True, verbose=False, n_ctx=64, n_threads=1,
                          type_k=0, type_v=0)  # f32 KV cache
    llm.eval(ids)
    return torch.tensor(np.array(llm.scores[:len(ids)]))  # [S, V]


@pytest.mark.parametrize("name", list(CASES))
@torch.no_grad()
def test_llama_cpp_runs_what_anatomy_writes(tmp_path, name):
    fields, arch, tol = CASES[name]
    model = _tiny(**fields)
    path = save_gguf(model, tmp_path / f"{name}.gguf", tokenizer_metadata=TOKENIZER)
    assert read_gguf(path).metadata["general.architecture"] == arch
    ours = model(torch.tensor([IDS]))[0]  # [S, V]
    assert ours.abs().max() > 5
    assert (ours - _llama_cpp_logits(path, IDS)).abs().max().item() < tol
    back = load_gguf(path)
    assert back.config == model.config
    assert torch.equal(back(torch.tensor([IDS]))[0], ours)


def test_experts_are_stacked_as_llama_cpp_names_them(tmp_path):
    model = _tiny(**CASES["qwen2moe"][0])
    f = read_gguf(save_gguf(model, tmp_path / "moe.gguf", tokenizer_metadata=TOKENIZER))
    E, F, D = 4, 32, 64
    assert f.tensors["blk.0.ffn_gate_exps.weight"].shape == (E, F, D)
    assert f.tensors["blk.0.ffn_down_exps.weight"].shape == (E, D, F)
    assert f.tensors["blk.1.ffn_gate_inp.weight"].shape == (E, D)
    assert f.tensors["blk.1.ffn_gate_inp_shexp.weight"].shape == (1, D)
    assert f.metadata["qwen2moe.expert_used_count"] == 2 and f.metadata["qwen2moe.expert_feed_forward_length"] == F
    gate_of_expert_3 = torch.from_numpy(f.raw("blk.0.ffn_gate_exps.weight").view(np.float32).reshape(E, F, D)[3])
    assert torch.equal(gate_of_expert_3, model.stack.blocks[0].ffn.gate_up[3, :F])


def test_gemma_norms_are_stored_as_one_plus_w(tmp_path):
    model = _tiny(**CASES["gemma"][0])
    f = read_gguf(save_gguf(model, tmp_path / "gemma.gguf", tokenizer_metadata=TOKENIZER))
    stored = torch.from_numpy(f.raw("blk.0.attn_norm.weight").view(np.float32).copy())
    assert torch.equal(stored, model.stack.blocks[0].attn_norm.weight + 1)
    assert "output.weight" not in f.tensors


def test_llama3_frequencies_travel_as_rope_freqs(tmp_path):
    f = read_gguf(save_gguf(_tiny(**CASES["llama3.1"][0]), tmp_path / "l3.gguf", tokenizer_metadata=TOKENIZER))
    factors = f.raw("rope_freqs.weight").view(np.float32)
    assert factors.shape == (8,) and factors.min() == 1.0 and factors.max() == 8.0 and len(set(factors.tolist())) == 3  # kept, blended, divided


@pytest.mark.parametrize("fields, message", [
    (dict(sliding_window=4), "sliding_window=4 \\(this architecture has none in llama.cpp\\)"),
    (dict(rotary_dim=8, sliding_window=5), "the closest, phi3, needs: sliding_window=5"),
    (dict(rope_scaling=dict(kind="dynamic", factor=2.0, original_max_seq_len=16)), "rope_scaling='dynamic'"),
    (dict(n_experts=4, n_experts_per_token=2, moe_layers=(1,)), "moe_layers=\\[1\\] \\(llama.cpp makes every layer"),
    (dict(n_experts=4, n_experts_per_token=2, moe_renormalize=False), "moe_renormalize=False"),
    (dict(GEMMA, branch_output_norm=True, attn_scale=0.1, attn_softcap=20.0, logit_softcap=8.0, sliding_window=4,
          sliding_window_layers=(0,)), "attn_scale=0.1 \\(llama.cpp's gemma2 uses 0.176777\\)"),
])
def test_what_llama_cpp_would_run_differently_is_refused(tmp_path, fields, message):
    with pytest.raises(CheckpointError, match=message):
        save_gguf(_tiny(**fields), tmp_path / "x.gguf", tokenizer_metadata=TOKENIZER)
    assert not (tmp_path / "x.gguf").exists()


def test_mixtral_preset_is_the_llama_architecture_with_experts():
    config = get_preset("mixtral-8x7b")
    assert gguf_problems(config, "llama") == []
    assert "sliding_window=4096 (this architecture has none in llama.cpp)" in gguf_problems(
        get_preset("mistral-7b"), "llama")
