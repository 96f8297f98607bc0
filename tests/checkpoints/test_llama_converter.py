"""GGUF files as llama.cpp's own converter writes them (convert_hf_to_gguf.py from the llama.cpp sources
`make test` unpacks), from small random HF checkpoints of the 2026 families with SmolLM2's tokenizer:
Gemma 3 (5 windowed layers with their own RoPE base, linear x4 on the global one), SmolLM3 (no RoPE on
layer 3), gpt-oss (sinks, 4 experts with biases, a window of 8 on every other layer), DeepSeek-V3 (latent
attention with a q bottleneck, YaRN x4 with its log multiplier, sigmoid routing in groups, a shared
expert) and DeepSeek-V2-Lite's shape (27 layers, no q bottleneck, softmax routing). anatomy reads each
file into HF's logits (fp32, 1e-4; 2e-4 over V2-Lite's 27 layers, where anatomy's absorbed latent
products and HF's expanded keys sum in different orders), and llama.cpp's logits on the same file are
anatomy's (SmolLM3, gpt-oss and DeepSeek-V3 1e-4, V2-Lite 3e-4; Gemma 3 5e-3: llama.cpp's GELU reads
an f16 table)."""

from __future__ import annotations

import os
import subprocess
import sys

import llama_cpp
import numpy as np
import pytest
import torch

import anatomy
from benchmarks.llama_cpp import llama_sources

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # the converter runs in a subprocess (~10 s each)
TEXT = "The capital of France is Paris, and the capital of Germany is Berlin; of Italy,"


def _configs(tokenizer) -> dict:
    T = transformers
    small = dict(vocab_size=len(tokenizer), hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=96, pad_token_id=0, bos_token_id=tokenizer.bos_token_id,
                 eos_token_id=tokenizer.eos_token_id)
    gemma3 = T.Gemma3TextConfig(**small, num_hidden_layers=6, head_dim=32, sliding_window=8, query_pre_attn_scalar=32,
                                rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0,
                                                                    "rope_theta": 1e6},
                                                 "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    smollm3 = T.SmolLM3Config(**small, num_hidden_layers=4, rope_parameters={"rope_type": "default", "rope_theta": 2e6})
    latent = dict(small, num_key_value_heads=4, moe_intermediate_size=32, kv_lora_rank=32, qk_rope_head_dim=8,
                  v_head_dim=16, qk_nope_head_dim=16, n_routed_experts=8, num_experts_per_tok=2, first_k_dense_replace=1)
    v3 = T.DeepseekV3Config(**latent, num_hidden_layers=3, q_lora_rank=48, n_shared_experts=1, routed_scaling_factor=2.5,
                            n_group=4, topk_group=2, max_position_embeddings=256,
                            scoring_func="sigmoid", topk_method="noaux_tc",  # as DeepSeek-V3's config.json has them
                            rope_parameters={"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0, "mscale": 1.0,
                                             "mscale_all_dim": 1.0, "original_max_position_embeddings": 64})
    v2_lite = T.DeepseekV2Config(**latent, num_hidden_layers=27, q_lora_rank=None, n_shared_experts=2)
    gpt_oss = T.GptOssConfig(**small, num_hidden_layers=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                             sliding_window=8, rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    return {"gemma3": (T.Gemma3ForCausalLM, gemma3, 5e-3), "smollm3": (T.SmolLM3ForCausalLM, smollm3, 1e-4),
            "gpt-oss": (T.GptOssForCausalLM, gpt_oss, 1e-4),
            "deepseek-v3": (T.DeepseekV3ForCausalLM, v3, 1e-4), "deepseek-v2-lite": (T.DeepseekV2ForCausalLM, v2_lite, 3e-4)}


@pytest.fixture(scope="module")
def hf_tokenizer(smollm2_gguf_path):
    return transformers.AutoTokenizer.from_pretrained(str(smollm2_gguf_path.parent), gguf_file=smollm2_gguf_path.name)


@pytest.mark.parametrize("family", ["gemma3", "smollm3", "gpt-oss", "deepseek-v3", "deepseek-v2-lite"])
@torch.no_grad()
def test_the_converters_file_gives_hfs_and_llama_cpps_logits(tmp_path, hf_tokenizer, family):
    cls, config, tol = _configs(hf_tokenizer)[family]
    torch.manual_seed(0)
    hf = cls(config).eval()
    for p in hf.parameters():
        p.add_(torch.randn_like(p) * (0.3 if p.dim() > 1 else 0.05))
    hf.save_pretrained(tmp_path / "hf")
    hf_tokenizer.save_pretrained(tmp_path / "hf")
    gguf = tmp_path / f"{family}.gguf"
    sources = llama_sources()
    done = subprocess.run([sys.executable, str(sources / "convert_hf_to_gguf.py"), str(tmp_path / "hf"), "--outtype",
                           "f32", "--outfile", str(gguf)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(sources / "gguf-py")})
    assert done.returncode == 0, done.stderr[-3000:]
    ids = hf_tokenizer(TEXT)["input_ids"]
    ours = anatomy.load(gguf)(torch.tensor([ids]))[0]
    reference = hf(torch.tensor([ids])).logits[0]
    assert (ours - reference).abs().max() <= (2e-4 if family == "deepseek-v2-lite" else 1e-4)
    llm = llama_cpp.Llama(model_path=str(gguf), logits_all=True, verbose=False, n_ctx=64, n_threads=1, type_k=0,
                          type_v=0)  # f32 KV cache
    llm.eval(ids)
    theirs = torch.from_numpy(np.array(llm.scores[:len(ids)]))
    llm.close()
    assert ours.abs().max() > 5 and (ours - theirs).abs().max() <= tol
