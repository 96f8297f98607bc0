"""A Gemma 3 GGUF as people download it: Q4_K_M, made by llama.cpp's own quantizer (llama-cpp-python's
llama_model_quantize) from an F32 file of a small random Gemma 3 (5 sliding layers of window 8 with a
RoPE base of their own, then a global one; rows of 256 so that the K-quants apply). anatomy runs the
file in its own blocks through the engine and gives llama.cpp's greedy tokens on the same file (where
they are not a near-tie of random weights)."""

from __future__ import annotations

import collections
import ctypes

import llama_cpp
import numpy as np
import pytest
import torch
from gguf import LlamaFileType

import anatomy
from anatomy import build_model, get_preset
from anatomy.checkpoints.gguf import save_gguf
from anatomy.checkpoints.gguf_reader import read_gguf

V = 256
TOKENIZER = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default",
             "tokenizer.ggml.tokens": [f"t{i}" for i in range(V)], "tokenizer.ggml.token_type": [1] * V,
             "tokenizer.ggml.merges": ["t 0"], "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 1}
PROMPT = [2, 17, 80, 33, 141, 9, 250, 64, 12, 99, 5, 77]
LOGIT_TOL = 0.25  # llama.cpp's Q8_K activations against anatomy's: 0.10-0.15 measured


def _quantize(src, dst, ftype: int):
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread = ftype, torch.get_num_threads()
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params)) == 0
    return dst


@pytest.fixture(scope="module")
def q4_k_m(tmp_path_factory):
    torch.manual_seed(0)
    config = get_preset("gemma-3-1b", vocab_size=V, d_model=256, n_layers=6, n_heads=4, n_kv_heads=1, head_dim=64,
                        d_ff=512, max_seq_len=256, sliding_window=8, sliding_window_layers=(0, 1, 2, 3, 4),
                        attn_scale=64 ** -0.5)
    model = build_model(config).eval()
    for name, p in model.named_parameters():  # norms away from their initial values; the blocks, not the tied
        std = 0.07 if "embed" in name else 0.3  # table (x sqrt(D)), choose the next token: no copying of the last
        p.data.normal_(0, std) if p.dim() >= 2 else p.data.uniform_(-0.5, 0.5)
    folder = tmp_path_factory.mktemp("gemma3")
    f32 = save_gguf(model, folder / "gemma3-f32.gguf", tokenizer_metadata=TOKENIZER)
    return _quantize(f32, folder / "gemma3-Q4_K_M.gguf", LlamaFileType.MOSTLY_Q4_K_M)


def test_llama_cpp_wrote_k_quants(q4_k_m):
    f = read_gguf(q4_k_m)
    assert f.metadata["general.architecture"] == "gemma3"
    types = collections.Counter(t.type.name for t in f.tensors.values())
    assert types["Q4_K"] > 0 and types["Q6_K"] + types["Q8_0"] + types["Q5_0"] > 0, types


@torch.no_grad()
def test_greedy_tokens_are_llama_cpps(q4_k_m):
    """llama.cpp's 32 greedy tokens, and the margin of each over its runner-up. llama.cpp rounds the
    activations to 8 bits (Q8_K) where anatomy does not (~0.1 on logits of ~8 here): anatomy's logits
    of the same sequence are within LOGIT_TOL, pick llama.cpp's token wherever its margin exceeds twice
    that, and anatomy's own greedy decode gives llama.cpp's tokens up to the first closer call."""
    llm = llama_cpp.Llama(model_path=str(q4_k_m), n_ctx=128, verbose=False, n_threads=torch.get_num_threads(),
                          logits_all=True, type_k=0, type_v=0)  # f32 KV cache
    ids, margins = list(PROMPT), []
    for _ in range(32):
        llm.reset()
        llm.eval(ids)
        top2 = np.sort(np.array(llm.scores[len(ids) - 1]))[-2:]
        margins.append(float(top2[1] - top2[0]))
        ids.append(int(np.argmax(llm.scores[len(ids) - 1])))
    theirs = torch.from_numpy(np.array(llm.scores[len(PROMPT) - 1:len(ids) - 1]))  # [32, V]
    llm.close()
    engine = anatomy.engine_for(anatomy.load(q4_k_m), take_weights=True)
    ours = engine.logits(torch.tensor([ids[:-1]]))[0, len(PROMPT) - 1:]  # teacher-forced on llama.cpp's tokens
    assert (ours - theirs).abs().max() <= LOGIT_TOL and theirs.abs().max() > 5
    clear = torch.tensor(margins) > 2 * LOGIT_TOL
    assert clear.sum() >= 24 and torch.equal(ours.argmax(-1)[clear], theirs.argmax(-1)[clear])
    decoded = anatomy.generate(engine, [PROMPT], max_new_tokens=32, ignore_eos=True)[0].token_ids
    first_close = int((~clear).nonzero()[0]) if not clear.all() else 32
    assert first_close >= 6 and decoded[:first_close] == ids[len(PROMPT):len(PROMPT) + first_close]
