"""Mixture-of-experts GGUF files as people download them, made by llama.cpp's own quantizer from F32 files
of small random models: a Qwen3-MoE in Q4_K_M (K-quant experts) and a gpt-oss in MXFP4_MOE (MXFP4
experts, what gpt-oss ships in). anatomy keeps every expert in its file's blocks (one format per expert,
weights/modules.py's CompactExperts; no stacked float copy) standing for exactly what llama.cpp's gguf-py
dequantizes, runs them through the engine's kernel plan, and gives the file's logits (those of the model
dequantized to f32, and llama.cpp's within its 8-bit activation rounding)."""

from __future__ import annotations

import collections

import llama_cpp
import numpy as np
import pytest
import torch
from gguf import LlamaFileType

import anatomy
from anatomy import build_model, get_preset
from anatomy.checkpoints.gguf import save_gguf
from anatomy.checkpoints.gguf_reader import read_gguf
from anatomy.weights.modules import CompactExperts

from .test_gguf_gemma3_quantized import PROMPT, TOKENIZER, V, _quantize

pytestmark = pytest.mark.slow
LOGIT_TOL = 0.08  # of the largest logit: llama.cpp's 8-bit activations against f32 ones (measured 0.057, 0.034)


def _random(model):
    """Random weights whose routers choose decisively (a near-tie between experts flips on any rounding)."""
    for name, p in model.named_parameters():
        std = 0.07 if "embed" in name else 1.0 if "lm_head" in name else 3.0 if "router" in name else 0.15
        p.data.normal_(0, std) if p.dim() >= 2 else p.data.uniform_(-0.5, 0.5)
    return model


FILES = {
    "qwen3moe-Q4_K_M": (dict(preset="qwen3-8b", moe_renormalize=True, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64, d_ff=256,
                             n_experts=4, n_experts_per_token=2, d_ff_expert=256),
                        LlamaFileType.MOSTLY_Q4_K_M, {"Q4_K", "Q6_K"}),
    "gpt-oss-MXFP4": (dict(preset="gpt-oss-20b", n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64, d_ff=256,
                           n_experts=4, n_experts_per_token=2, d_ff_expert=256, sliding_window=8,
                           sliding_window_layers=(0,), rope_scaling=None),
                      LlamaFileType.MOSTLY_MXFP4_MOE, {"MXFP4"}),
}


@pytest.fixture(scope="module", params=list(FILES))
def moe_file(request, tmp_path_factory):
    fields, ftype, _ = FILES[request.param]
    torch.manual_seed(0)
    config = get_preset(fields.pop("preset"), vocab_size=V, d_model=256, max_seq_len=256, bos_token_id=2,
                        eos_token_id=1, pad_token_id=0, **fields)
    folder = tmp_path_factory.mktemp(request.param)
    f32 = save_gguf(_random(build_model(config).eval()), folder / "f32.gguf", tokenizer_metadata=TOKENIZER)
    return request.param, _quantize(f32, folder / f"{request.param}.gguf", ftype)


def test_the_experts_stay_in_their_blocks(moe_file):
    """Every expert's matrix is held in its file's blocks, and stands for what gguf-py (llama.cpp's own
    Python reader) dequantizes the file's stacked tensor to, exactly."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    name, path = moe_file
    f = read_gguf(path)
    expert_types = {t.type.name for n, t in f.tensors.items() if n.endswith("_exps.weight")}
    assert expert_types <= FILES[name][2] and expert_types, expert_types
    model = anatomy.load(path)
    experts = {n: m for n, m in model.named_modules() if isinstance(m, CompactExperts)}
    assert len(experts) == 2 * 2  # gate_up and down of both layers
    assert not any(p.dim() == 3 for p in model.parameters()), "no stacked float experts"
    in_file = sum(t.nbytes for n, t in f.tensors.items() if n.endswith("_exps.weight"))
    held = sum(m.compact.nbytes for m in experts.values())
    assert held <= 2.1 * in_file and held < sum(4 * np.prod(m.shape) for m in experts.values()) / 3
    theirs = {t.name: dequantize(t.data, t.tensor_type) for t in GGUFReader(path).tensors}
    down = experts["stack.blocks.1.ffn.down"].compact.dequantize()  # [E, D, F]
    assert torch.equal(down, torch.from_numpy(theirs["blk.1.ffn_down_exps.weight"]).float())
    gate_up = experts["stack.blocks.0.ffn.gate_up"].compact.dequantize()  # [E, 2F, D]: rows gate, up
    both = np.concatenate([theirs["blk.0.ffn_gate_exps.weight"], theirs["blk.0.ffn_up_exps.weight"]], axis=1)
    assert torch.equal(gate_up, torch.from_numpy(both).float())


@torch.no_grad()
def test_the_engine_gives_the_files_logits(moe_file):
    """Through the kernel plan, the compact experts give the logits of the model dequantized to f32 (the
    plan's kernels round activations to bf16 or 8 bits: 2% of the largest logit), and llama.cpp's on the
    same file (its Q8_K activations: 8%); the next token at each of the 20 positions agrees with the f32
    model's (anatomy: every one but a near-tie; llama.cpp: 9 in 10 measured)."""
    _, path = moe_file
    ids = PROMPT + [5, 77, 12, 200, 31, 90, 150, 8]
    reference = anatomy.load(path, weights="f32")(torch.tensor([ids]))[0]
    ours = anatomy.engine_for(anatomy.load(path), take_weights=True).logits(torch.tensor([ids]))[0]
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=128, verbose=False, n_threads=torch.get_num_threads(),
                          logits_all=True, type_k=0, type_v=0)  # f32 KV cache
    llm.eval(ids)
    theirs = torch.from_numpy(np.array(llm.scores[:len(ids)]))
    llm.close()
    scale = float(reference.abs().max())
    assert scale > 5
    assert (ours - reference).abs().max() <= 0.02 * scale
    assert (theirs - reference).abs().max() <= LOGIT_TOL * scale
    assert (ours.argmax(-1) == reference.argmax(-1)).sum() >= len(ids) - 1
    assert (theirs.argmax(-1) == reference.argmax(-1)).sum() >= 0.8 * len(ids)
