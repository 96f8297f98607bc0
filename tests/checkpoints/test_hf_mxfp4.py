"""gpt-oss HF checkpoints with MXFP4 experts, as openai/gpt-oss-20b and -120b are published: random uint8
blocks and e8m0 scales 118..126 (a block's values at most 6 * 2^-1) with config.json's quantization_config.
The reference is HF's GptOssForCausalLM (fp32) with the experts dequantized by HF's own
`convert_moe_packed_tensors`: anatomy.load's logits within 1e-4, the experts held as the int8-coded formats
a GGUF file's MXFP4 experts get, not floats (the engine's kernel plan runs them: 4% of the largest logit);
weights="f32" gives the same floats. llama.cpp's converter repacks the same directory into MXFP4 blocks that
its gguf-py dequantizes into exactly anatomy's experts; anatomy reads that file into the same logits (1e-4)
and llama.cpp runs it into them within its 8-bit activation rounding (test_gguf_moe_quantized's LOGIT_TOL).
Malformed blocks and scales are named."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import gguf
import llama_cpp
import numpy as np
import pytest
import torch

import anatomy
from anatomy.errors import CheckpointError
from anatomy.weights.formats import Int8GroupWeight
from anatomy.weights.modules import CompactExperts

from .test_gguf_moe_quantized import LOGIT_TOL

transformers = pytest.importorskip("transformers")
mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")
from safetensors.torch import save_file  # noqa: E402  (after transformers is known to be there)

TOL = 1e-4
QUANT = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                             "model.embed_tokens", "lm_head"]}
TEXT = "The capital of France is Paris, and the capital of Germany is Berlin; of Italy,"


def _mxfp4_checkpoint(directory, *, vocab_size: int, bos: int = 1, eos: int = 2):
    """Write a small gpt-oss HF directory with MXFP4 experts; return HF's fp32 model of it (the experts
    dequantized by HF) and the checkpoint's tensors."""
    config = transformers.GptOssConfig(
        vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=96, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=5,
        max_position_embeddings=64, pad_token_id=0, bos_token_id=bos, eos_token_id=eos,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    torch.manual_seed(0)
    hf = transformers.GptOssForCausalLM(config).eval()
    g = torch.Generator().manual_seed(1)
    tensors = {}
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.add_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() > 1 else 0.05))
            p.mul_(4 if "router" in name else 1)  # experts chosen by clear margins (llama.cpp's rounding keeps them)
            if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                tensors[name] = p.detach().clone()
                continue
            E, K, N = p.shape  # HF stores the experts [E, in, out]; MXFP4 blocks run along `in`
            blocks = torch.randint(0, 256, (E, N, K // 32, 16), generator=g, dtype=torch.uint8)
            scales = torch.randint(118, 127, (E, N, K // 32), generator=g, dtype=torch.uint8)
            tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
            p.copy_(mxfp4.convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    hf_config = {**config.to_dict(), "architectures": ["GptOssForCausalLM"], "quantization_config": QUANT}
    (directory / "config.json").write_text(json.dumps(hf_config))
    return hf, tensors


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gpt-oss-mxfp4")
    hf, tensors = _mxfp4_checkpoint(directory, vocab_size=101)
    return hf, tensors, directory


IDS = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(2))


@torch.no_grad()
def test_mxfp4_experts_load_compact_into_hfs_logits(checkpoint):
    hf, tensors, directory = checkpoint
    ours = anatomy.load(directory)
    assert (ours(IDS) - hf(IDS).logits).abs().max() <= TOL
    for layer in ours.stack.blocks:
        for which in ("gate_up", "down"):
            experts = getattr(layer.ffn, which)
            assert isinstance(experts, CompactExperts)
            assert all(isinstance(e.compact, Int8GroupWeight) for e in experts)
    experts = [m for m in ours.modules() if isinstance(m, CompactExperts)]
    held = sum(m.compact.nbytes for m in experts)
    blocks = sum(t.numel() for n, t in tensors.items() if n.endswith("_blocks"))  # bytes: 2 values a byte
    assert 0 < held <= 2.25 * blocks  # an int8 code a value and a scale (<= 4 bytes) a block: not 4 bytes a value
    assert not any(p.is_floating_point() and p.dim() == 3 for p in ours.parameters())
    # the engine's kernel plan rounds activations (bf16, int16 or int8): an expert meets a few of the prompt's
    # rows, the plan's batch phase, where l4 tiles take int8 ones (llama.cpp's 8-bit activations: LOGIT_TOL's
    # 0.034 and 0.057 measured); measured 0.033 of the largest logit (int16 there: within 0.02)
    reference = hf(IDS).logits
    planned = anatomy.engine_for(ours, take_weights=True).logits(IDS)
    assert (planned - reference).abs().max() <= 0.04 * reference.abs().max()


@torch.no_grad()
def test_mxfp4_experts_widen_on_request(checkpoint):
    hf, _, directory = checkpoint
    for weights, dtype, tol in (("f32", "f32", TOL), ("bf16", "f32", None)):
        ours = anatomy.load(directory, weights=weights, dtype=dtype)
        gate_up = ours.stack.blocks[0].ffn.gate_up
        if tol is not None:
            assert isinstance(gate_up, torch.nn.Parameter) and gate_up.dtype == torch.float32
            assert (ours(IDS) - hf(IDS).logits).abs().max() <= tol
        else:  # MXFP4's values are exact in bf16: the widened experts are HF's, in bf16 formats
            assert all(e.compact.weight.dtype == torch.bfloat16 for e in gate_up)
            assert torch.equal(gate_up.compact.dequantize(torch.float32)[:, :96],
                               hf.model.layers[0].mlp.experts.gate_up_proj[..., 0::2].transpose(1, 2))
    kept = anatomy.load(directory, weights="int8").stack.blocks[1].ffn.down  # the int8 codes are kept as they are
    assert isinstance(kept[0].compact, Int8GroupWeight)
    assert torch.equal(kept.compact.dequantize(), hf.model.layers[1].mlp.experts.down_proj.transpose(1, 2))


def _rewrite(tmp_path, checkpoint, *, drop=(), change=None, quant=QUANT):
    _, tensors, directory = checkpoint
    out = tmp_path / "bad"
    out.mkdir()
    save_file({n: t for n, t in {**tensors, **(change or {})}.items() if n not in drop}, out / "model.safetensors")
    config = json.loads((directory / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "quantization_config": quant}))
    return out


@pytest.mark.parametrize("case, match", [
    ("no scales", r"model.safetensors: tensor 'model.layers.0.mlp.experts.down_proj_blocks' has no "
                  r"'model.layers.0.mlp.experts.down_proj_scales' beside it"),
    ("shape", r"model.safetensors: tensor 'model.layers.1.mlp.experts.gate_up_proj_scales' is torch.uint8 "
              r"\[4, 192, 1\], the config calls for uint8 \[4, 192, 2\]"),
    ("dtype", r"tensor 'model.layers.1.mlp.experts.gate_up_proj_blocks' is torch.float32"),
    ("method", r"config.json: quantization_config.quant_method is 'fp8', but tensor "
               r"'model.layers.0.mlp.experts.gate_up_proj_blocks' is stored as MXFP4 blocks"),
    ("no method", r"quantization_config.quant_method is None"),
])
def test_malformed_mxfp4_experts_are_named(tmp_path, checkpoint, case, match):
    x = "model.layers.1.mlp.experts.gate_up_proj_"
    kwargs = {"no scales": dict(drop=("model.layers.0.mlp.experts.down_proj_scales",)),
              "shape": dict(change={x + "scales": torch.zeros(4, 192, 1, dtype=torch.uint8)}),
              "dtype": dict(change={x + "blocks": torch.zeros(4, 192, 2, 16)}),
              "method": dict(quant={"quant_method": "fp8"}),
              "no method": dict(quant=None)}[case]
    with pytest.raises(CheckpointError, match=match):
        anatomy.load(_rewrite(tmp_path, checkpoint, **kwargs))


@pytest.mark.slow  # the converter runs in a subprocess (~10 s)
@torch.no_grad()
def test_llama_cpps_converter_repacks_the_same_experts(tmp_path, smollm2_gguf_path):
    from benchmarks.llama_cpp import llama_sources

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(smollm2_gguf_path.parent),
                                                           gguf_file=smollm2_gguf_path.name)
    hf, _ = _mxfp4_checkpoint(tmp_path / "hf", vocab_size=len(tokenizer), bos=tokenizer.bos_token_id,
                              eos=tokenizer.eos_token_id)
    tokenizer.save_pretrained(tmp_path / "hf")
    gguf, sources = tmp_path / "gpt-oss.gguf", llama_sources()
    done = subprocess.run([sys.executable, str(sources / "convert_hf_to_gguf.py"), str(tmp_path / "hf"), "--outtype",
                           "f32", "--outfile", str(gguf)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(sources / "gguf-py")})
    assert done.returncode == 0, done.stderr[-3000:]
    ours = anatomy.load(tmp_path / "hf")
    _assert_gguf_py_reads_our_experts(gguf, ours)
    ids = tokenizer(TEXT)["input_ids"]
    from_hf = ours(torch.tensor([ids]))[0]
    from_gguf_model = anatomy.load(gguf)
    assert isinstance(from_gguf_model.stack.blocks[0].ffn.down[0].compact, Int8GroupWeight)
    from_gguf = from_gguf_model(torch.tensor([ids]))[0]
    assert (from_hf - hf(torch.tensor([ids])).logits[0]).abs().max() <= TOL
    assert (from_gguf - from_hf).abs().max() <= TOL
    llm = llama_cpp.Llama(model_path=str(gguf), logits_all=True, verbose=False, n_ctx=64, n_threads=1, type_k=0,
                          type_v=0)  # f32 KV cache
    llm.eval(ids)
    theirs = torch.from_numpy(np.array(llm.scores[:len(ids)]))
    llm.close()
    scale = from_hf.abs().max()
    assert scale > 5 and (from_hf - theirs).abs().max() <= LOGIT_TOL * scale


def _assert_gguf_py_reads_our_experts(path, model):
    """llama.cpp's gguf-py dequantizes the converter's MXFP4 experts into exactly the values anatomy holds."""
    for t in gguf.GGUFReader(path).tensors:
        layer, _, which = t.name.removeprefix("blk.").partition(".")
        if which.endswith("_exps.weight"):
            assert t.tensor_type == gguf.GGMLQuantizationType.MXFP4
            ffn = model.stack.blocks[int(layer)].ffn
            F = ffn.gate_up.shape[1] // 2
            ours = {"ffn_gate_exps.weight": ffn.gate_up.compact.dequantize()[:, :F],
                    "ffn_up_exps.weight": ffn.gate_up.compact.dequantize()[:, F:],
                    "ffn_down_exps.weight": ffn.down.compact.dequantize()}[which]
            assert torch.equal(torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type)), ours)
