"""llama.cpp's GGUF LoRA adapters: an adapter made by HF PEFT (random A and B, every target), converted
by llama.cpp's own convert_lora_to_gguf.py, reads as the same adapter as its PEFT directory (exactly:
q's and k's rows put back in HF's order) and gives llama.cpp's logits with it (llama-cpp-python's
lora_path, f32 KV cache; 1e-4); anatomy serve takes it too. A broken file is one InputError."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import anatomy
from anatomy.errors import InputError
from anatomy.inference.engine import Chunk, DecoderEngine
from anatomy.lora import apply_lora, load_adapter
from benchmarks.llama_cpp import llama_sources

from ..conftest import tiny_chat_model

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
llama_cpp = pytest.importorskip("llama_cpp")
pytestmark = pytest.mark.slow  # the converter runs in a subprocess
IDS = [1, 504, 3012, 314, 253, 9690, 28, 4403, 378]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(the base GGUF, the PEFT directory, the adapter as llama.cpp's converter writes it)."""
    root = tmp_path_factory.mktemp("gguf_lora")
    tiny_chat_model(root / "hf", root / "base.gguf", d_model=64)
    torch.manual_seed(5)
    hf = transformers.AutoModelForCausalLM.from_pretrained(root / "hf", dtype=torch.float32)
    options = dict(r=4, lora_alpha=12, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                       "down_proj"])
    peft.get_peft_model(hf, peft.LoraConfig(init_lora_weights=False, **options)).save_pretrained(root / "peft")
    sources = llama_sources()
    done = subprocess.run([sys.executable, str(sources / "convert_lora_to_gguf.py"), "--base", str(root / "hf"),
                           "--outtype", "f32", "--outfile", str(root / "lora.gguf"), str(root / "peft")],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(sources / "gguf-py")})
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "base.gguf", root / "peft", root / "lora.gguf"


def test_the_converters_file_is_the_peft_adapter(converted):
    base, directory, gguf = converted
    model = anatomy.load(base, dtype="f32")
    ours, theirs = load_adapter(gguf, model), load_adapter(directory, model)
    assert ours.config.targets == theirs.config.targets and ours.config.scale == theirs.config.scale
    assert ours.weights.keys() == theirs.weights.keys()
    assert all(torch.equal(ours.weights[k], theirs.weights[k]) for k in theirs.weights)


@torch.no_grad()
def test_llama_cpps_logits_with_the_adapter(converted):
    base, _, gguf = converted
    plain = anatomy.load(base, dtype="f32").eval()(torch.tensor([IDS]))[0]
    ours = apply_lora(anatomy.load(base, dtype="f32").eval(), gguf)(torch.tensor([IDS]))[0]
    llm = llama_cpp.Llama(model_path=str(base), lora_path=str(gguf), logits_all=True, verbose=False, n_ctx=64,
                          n_threads=1, type_k=0, type_v=0)  # f32 KV cache
    llm.eval(IDS)
    theirs = torch.from_numpy(np.array(llm.scores[:len(IDS)]))
    llm.close()
    assert (ours - plain).abs().max() > 0.3, "the adapter changes the logits"
    assert (ours - theirs).abs().max() <= 1e-4


@torch.no_grad()
def test_served_from_the_gguf_file(converted):
    base, _, gguf = converted
    engine = DecoderEngine(anatomy.load(base, dtype="f32").eval())
    ref = engine.serve_adapters(max_loras=1, max_rank=4).load("g", gguf)
    logits = engine.step(engine.paged_cache(num_blocks=4, block_size=16), [Chunk(IDS, 0, [0], adapter=ref.slot)])
    expected = apply_lora(anatomy.load(base, dtype="f32").eval(), gguf)(torch.tensor([IDS]))[0, -1]
    assert (logits[0] - expected).abs().max() < 1e-4


def test_a_broken_gguf_adapter_is_one_error(converted, tmp_path):
    base, _, gguf = converted
    model = anatomy.load(base, dtype="f32")
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(gguf.read_bytes()[:len(gguf.read_bytes()) // 2])
    with pytest.raises(InputError, match="truncated.gguf"):
        load_adapter(truncated, model)
    with pytest.raises(InputError, match="not a LoRA adapter"):
        load_adapter(base, model)  # a model, not an adapter
    other = anatomy.build_model(anatomy.get_preset("llama-7b", vocab_size=model.config.vocab_size, d_model=32,
                                                   n_heads=2, n_kv_heads=1, n_layers=2, d_ff=64, max_seq_len=128))
    with pytest.raises(InputError, match=r"lora.gguf: tensor 'blk\.0\..*' has shape"):
        load_adapter(gguf, other)
