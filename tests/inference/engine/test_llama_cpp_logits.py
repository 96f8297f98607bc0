"""The default decode path against llama.cpp: the shipped SmolLM2 Q4_1 file with its own weights, the fused
decode blocks forced, fed a README prompt and an answer one token a step through the engine's step; every
step's logits against llama.cpp's on the same file for the same tokens, and against fp32 on the file's
dequantized weights, within bounds derived from llama.cpp's own activation rounding."""

from __future__ import annotations

import llama_cpp
import numpy as np
import pytest
import torch

import anatomy
from anatomy.inference.engine import Chunk, DecoderEngine
from anatomy.kernels.decode_block import NativeBlock

pytestmark = pytest.mark.slow  # the real checkpoint three ways

QUESTION = "What is the capital of France?"  # the README's first prompt
ANSWER = "The capital of France is Paris, a city on the Seine known for the Eiffel Tower, the Louvre and its cafés."
INT16_SHARE = 127 / 32767  # int16's rounding step per group of 32 over int8's: max / 32767 against max / 127
# bf16 keeps 8 significant bits: a K or V value's rounding (2^-9 of it, uniform) is about a quarter of what
# an 8-bit group step (a 32-value group's max, ~2.1 sigma, over 127, uniform) does to a value of its size
CACHE_SHARE = {"f32": 0.0, "bf16": 0.25}
# each of the 4 x 30 + 1 products on a token's path rounds its input to 8 bits (~0.5% rms, as above):
# sqrt(121) of them ~5%; a model read otherwise (RoPE, norms, the Q4_1 dequantization) is much farther
LLAMA_CPP_DISTANCE = 0.10


@pytest.fixture(scope="module")
def tokens(smollm2_tokenizer) -> list[int]:
    tok = smollm2_tokenizer
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": QUESTION}]), add_special_tokens=False)
    return prompt + tok.encode(ANSWER, add_special_tokens=False)


@pytest.fixture(scope="module")
def fp32_logits(smollm2, tokens) -> torch.Tensor:
    with torch.no_grad():
        return smollm2(torch.tensor([tokens]))[0].double()  # [S, V]


@pytest.fixture(scope="module")
def llama_cpp_logits(smollm2_gguf_path, tokens) -> torch.Tensor:
    """llama.cpp's logits [S, V], one token per eval (its decode step), over a float32 KV cache."""
    llm = llama_cpp.Llama(model_path=str(smollm2_gguf_path), logits_all=True, n_ctx=128, verbose=False,
                          n_threads=torch.get_num_threads(), type_k=0, type_v=0)  # GGML_TYPE_F32
    for token in tokens:
        llm.eval([token])
    logits = torch.from_numpy(np.array(llm.scores[:len(tokens)])).double()
    llm.close()
    return logits


def decode_logits(engine: DecoderEngine, tokens: list[int], computed: list[bool]) -> torch.Tensor:
    """The engine's logits [S, V], one token per step over a paged cache; every block of every step run
    eagerly goes through the fused operator (`computed`: the fused_steps fixture; the later steps replay
    a captured graph of it)."""
    cache = engine.paged_cache(num_blocks=8, block_size=16)
    rows = []
    for i, token in enumerate(tokens):
        rows.append(engine.step(cache, [Chunk([token], i, list(range(8)))])[0].double())
    assert computed and all(computed) and engine.captured_graphs >= 1
    return torch.stack(rows)


def kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per position [S] of the softmax of each row."""
    lp, lq = p_logits.log_softmax(-1), q_logits.log_softmax(-1)
    return (lp.exp() * (lp - lq)).sum(-1)


def anatomy_share(engine: DecoderEngine) -> float:
    """alpha: anatomy's own error as a share of llama.cpp's, from the rounding its decode step takes (2x slack)."""
    blocks = engine.model.stack.blocks
    assert all(isinstance(b, NativeBlock) for b in blocks)
    activations = 1.0 if any(b.int8 for b in blocks) else INT16_SHARE  # int8 bits: llama.cpp's rounding
    return 2 * (activations + CACHE_SHARE[engine.kv_dtype])


@pytest.mark.parametrize("kv_dtype", [None, "f32"])  # the plan's (bf16 branches here) and an exact cache
def test_decode_steps_agree_with_llama_cpp_and_fp32(smollm2_gguf_path, tokens, fp32_logits, llama_cpp_logits,
                                                    kv_dtype, native_forced, fused_steps):
    """llama.cpp rounds every product's input to 8 bits per group of 32 (Q8_1 against Q4_1 weights, Q8_0
    against the Q8_0 head) and computes the rest in float32 (its KV cache asked for in float32): its
    distance from fp32, E, is what 8-bit activations do. anatomy rounds them to int16 per group on q4 tiles
    (AVX-512 VNNI: a step 127/32767 of int8's) or to int8 (other CPUs: llama.cpp's rounding), and may store
    the cache in bf16: its own error is at most a share alpha of E (anatomy_share), and

        |anatomy - llama.cpp| <= (1 + alpha) E                    the triangle through fp32
        |anatomy - fp32|      <= alpha E
        mean KL(fp32 || anatomy) <= alpha^2 llama.cpp's mean KL   KL grows as a small error's square
        top-1 = fp32's where fp32's lead exceeds 2 alpha x llama.cpp's largest logit error there

    (|.| the Frobenius norm over every position's logits, KL per position). Here E is 0.043 of fp32's norm;
    int16 activations are 0.0043 E from fp32 over a float32 cache (alpha 0.0078), 0.12 E over bf16 (alpha
    0.51); int8 ones (ANATOMY_NATIVE_ISA=avx2) 0.99 E (alpha 2). One group scale of one matrix off by half
    (stack.blocks.10.ffn.down, row 7) puts the float32-cache run 0.054 E from fp32 and 1.024 E from
    llama.cpp: it fails the distance and KL bounds."""
    engine = DecoderEngine(anatomy.load(smollm2_gguf_path), kv_dtype=kv_dtype)
    ours, theirs, fp32 = decode_logits(engine, tokens, fused_steps), llama_cpp_logits, fp32_logits
    alpha = anatomy_share(engine)
    E = float((theirs - fp32).norm())
    assert E <= LLAMA_CPP_DISTANCE * float(fp32.norm()), f"llama.cpp is {E / float(fp32.norm()):.3f} of fp32 away"
    from_llama_cpp, from_fp32 = float((ours - theirs).norm()), float((ours - fp32).norm())
    assert from_llama_cpp <= (1 + alpha) * E, f"{from_llama_cpp / E:.4f} E from llama.cpp, alpha {alpha:.4f}"
    assert from_fp32 <= alpha * E, f"{from_fp32 / E:.4f} E from fp32, alpha {alpha:.4f}"
    ours_kl, theirs_kl = float(kl(fp32, ours).mean()), float(kl(fp32, theirs).mean())
    assert ours_kl <= alpha ** 2 * theirs_kl, f"mean KL {ours_kl:.2e} against llama.cpp's {theirs_kl:.2e}"
    top2 = fp32.topk(2, dim=-1).values
    clear = top2[:, 0] - top2[:, 1] > 2 * alpha * (theirs - fp32).abs().amax(-1)  # [S]
    flipped = (ours.argmax(-1) != fp32.argmax(-1)) & clear
    assert not flipped.any(), f"top-1 differs from fp32's at positions {flipped.nonzero().flatten().tolist()}"
