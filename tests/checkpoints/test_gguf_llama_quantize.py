"""Every block type anatomy runs, written by llama.cpp's own quantizer (llama-cpp-python's
llama_model_quantize, from the shipped file): anatomy loads each tensor to exactly the float32 values
llama.cpp's own dequantization writes (the same file quantized to F32), and its logits are llama.cpp's
on that F32 file."""

from __future__ import annotations

import collections
import ctypes
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf import LlamaFileType

import anatomy
from anatomy.checkpoints.gguf_reader import read_gguf

pytestmark = pytest.mark.slow  # two 135M-parameter files written by llama.cpp, three loads

# SmolLM2's rows of 1536 (ffn_down) take the 256-value super-blocks; the others have rows of 576
OVERRIDES = [(r"blk\.[0-5]\.ffn_down", T.Q2_K), (r"blk\.[6-9]\.ffn_down", T.Q3_K), (r"blk\.1[0-4]\.ffn_down", T.Q5_K),
             (r"blk\.1[5-9]\.ffn_down", T.IQ4_XS), (r"attn_q", T.MXFP4), (r"ffn_gate", T.IQ4_NL)]


def quantize(src: Path, dst: Path, ftype: int, overrides=()) -> Path:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize, params.nthread = ftype, True, torch.get_num_threads()
    table = (llama_cpp.llama_model_tensor_override * (len(overrides) + 1))()  # ends with a null pattern
    for entry, (pattern, ttype) in zip(table, overrides, strict=False):
        entry.pattern, entry.type = pattern.encode(), int(ttype)
    if overrides:
        params.tt_overrides = table
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params)) == 0
    return dst


@pytest.fixture(scope="module")
def files(smollm2_gguf_path, tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama-quantize")
    mixed = quantize(smollm2_gguf_path, folder / "mixed.gguf", LlamaFileType.MOSTLY_Q8_0, OVERRIDES)
    yield mixed, quantize(mixed, folder / "mixed-f32.gguf", LlamaFileType.ALL_F32)
    for f in folder.iterdir():
        f.unlink()  # ~650 MB


def test_llama_cpp_made_every_new_block_type(files):
    types = collections.Counter(t.type.name for t in read_gguf(files[0]).tensors.values())
    assert {"Q2_K", "Q3_K", "Q5_K", "IQ4_NL", "IQ4_XS", "MXFP4"} <= set(types), types


def test_every_tensor_is_llama_cpps_dequantization_bit_for_bit(files):
    ours = anatomy.load(files[0], weights="f32").state_dict()
    theirs = anatomy.load(files[1], weights="f32").state_dict()  # F32: views of the values llama.cpp wrote
    assert set(ours) == set(theirs)
    differ = [n for n in ours if not np.array_equal(ours[n].numpy().view(np.uint32), theirs[n].numpy().view(np.uint32))]
    assert not differ


def test_logits_are_llama_cpps_on_its_f32_file(files, smollm2_tokenizer):
    tok = smollm2_tokenizer
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}]),
                     add_special_tokens=False)
    with torch.no_grad():
        ours = anatomy.load(files[0], weights="f32")(torch.tensor([ids]))[0].double()  # [S, V]
    llm = llama_cpp.Llama(model_path=str(files[1]), logits_all=True, n_ctx=64, verbose=False,
                          n_threads=torch.get_num_threads(), type_k=0, type_v=0)  # f32 weights and KV cache
    llm.eval(ids)
    theirs = torch.from_numpy(np.array(llm.scores[:len(ids)])).double()
    llm.close()
    lp, lq = theirs.log_softmax(-1), ours.log_softmax(-1)
    kl = (lp.exp() * (lp - lq)).sum(-1)  # [S]: float32 sums in another order only
    assert kl.max() < 1e-6 and torch.equal(ours.argmax(-1), theirs.argmax(-1))
