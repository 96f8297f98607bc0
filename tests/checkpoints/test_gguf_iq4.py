"""IQ4_NL and IQ4_XS files as llama.cpp's own quantizer writes them: each weight's codes are 4-bit indices
into a table of 16 int8 levels, which anatomy reads as int8 codes that carry the table (`levels`) and,
where AVX-512 VNNI runs, holds as l4 tiles: the indices in 4 bits beside a float32 scale per 32 (5.25
bits a weight against the file's 4.25-4.5, not the 8.5 of int8 codes), every decode block fused on them,
and the logits llama.cpp's on the same file."""

from __future__ import annotations

import ctypes

import llama_cpp
import pytest
import torch
from gguf import LlamaFileType

import anatomy
from anatomy import build_model, get_preset
from anatomy.checkpoints.gguf import save_gguf
from anatomy.inference.engine import Chunk, DecoderEngine
from anatomy.kernels import native
from anatomy.kernels.candidates import L4T
from anatomy.kernels.decode_block import NativeBlock
from anatomy.kernels.planned_linear import PlannedLinear
from anatomy.weights.formats import Int8GroupWeight

from .test_gguf_split_rows import TOKENIZER, TOKENS, V, llama_cpp_steps

LAYERS = 4
# of the largest logit: llama.cpp rounds every product's activations to 8 bits, so the float32 forward of
# the stored weights is itself 0.049 (IQ4_NL) and 0.086 (IQ4_XS) from its logits; the l4 tiles round them
# to 16 bits and stay within 3e-4 of that float32 forward (2.6e-4 and 1.7e-4 measured)
LLAMA_CPP_DISTANCE, EXACT_DISTANCE = 0.12, 0.002
TYPES = {"IQ4_NL": LlamaFileType.MOSTLY_IQ4_NL, "IQ4_XS": LlamaFileType.MOSTLY_IQ4_XS}

pytestmark = pytest.mark.skipif(not native.runs("avx512-vnni"),
                                reason="l4 tiles need AVX-512 VNNI, which this CPU lacks")


@pytest.fixture(scope="module", params=sorted(TYPES))
def iq4_file(request, tmp_path_factory):
    torch.manual_seed(0)
    config = get_preset("llama-3.2-1b", vocab_size=V, d_model=256, n_layers=LAYERS, n_heads=4, n_kv_heads=2,
                        head_dim=64, d_ff=512, max_seq_len=128, tie_embeddings=False, bos_token_id=2,
                        eos_token_id=1)
    model = build_model(config).eval()
    for p in model.parameters():
        p.data.normal_(0, 0.08) if p.dim() >= 2 else p.data.uniform_(0.5, 1.5)
    folder = tmp_path_factory.mktemp("iq4")
    f32 = save_gguf(model, folder / "llama-f32.gguf", tokenizer_metadata=TOKENIZER)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread = TYPES[request.param], torch.get_num_threads()
    out = folder / f"llama-{request.param}.gguf"
    assert llama_cpp.llama_model_quantize(str(f32).encode(), str(out).encode(), ctypes.byref(params)) == 0
    return out


def test_the_engine_holds_the_codes_in_four_bits_and_gives_llama_cpps_logits(iq4_file, fused_steps, native_forced):
    model = anatomy.load(iq4_file)
    lookups = {name for name, m in model.named_modules() if isinstance(getattr(m, "compact", None), Int8GroupWeight)
               and m.compact.levels is not None}
    assert len(lookups) >= 4 * LAYERS  # the blocks' matrices (llama.cpp keeps the head and table in other types)
    with torch.no_grad():
        exact = model(torch.tensor([TOKENS]))[0].double()  # the stored weights' own products
    engine = DecoderEngine(model, take_weights=True)
    layers = {name: m for name, m in engine.model.named_modules() if isinstance(m, PlannedLinear)}
    held = [sorted(layer.layouts) for name, layer in layers.items() if name.replace(".parts.0", "") in lookups]
    assert held and all(forms == [L4T.name] for forms in held)  # 4-bit indices only: no int8 layout beside
    assert engine.native_blocks == LAYERS and all(isinstance(b, NativeBlock) for b in engine.model.stack.blocks)
    cache = engine.paged_cache(num_blocks=2, block_size=32)
    fused_steps.clear()
    ours = torch.stack([engine.step(cache, [Chunk([t], j, [0, 1])])[0] for j, t in enumerate(TOKENS)]).double()
    assert len(fused_steps) == LAYERS * len(TOKENS) and all(fused_steps)
    theirs = llama_cpp_steps(iq4_file)
    scale = theirs.abs().max()
    assert (ours - theirs).abs().max() < LLAMA_CPP_DISTANCE * scale
    assert (ours - exact).abs().max() < EXACT_DISTANCE * scale
    clear = exact.topk(2).values.diff().abs()[:, 0] > 2 * EXACT_DISTANCE * scale  # not near-ties of the float forward
    assert clear.sum() >= 14 and torch.equal(ours.argmax(-1)[clear], exact.argmax(-1)[clear])
