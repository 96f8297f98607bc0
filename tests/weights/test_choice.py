"""The weights= choice of anatomy.load: which format each matrix gets, from a GGUF file (its own
blocks kept) or an HF checkpoint (converted); the model's forward is the exact product of what
it stores; bad choices and shapes a format cannot take are one-line InputErrors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

import anatomy
from anatomy import build_model, get_preset
from anatomy.checkpoints.gguf import read_gguf, save_gguf
from anatomy.checkpoints.gguf_types import TENSOR_TYPES_BY_NAME
from anatomy.checkpoints.gguf_writer import TensorEntry, write_gguf
from anatomy.errors import InputError
from anatomy.weights.choice import CHOICES, parse_weights
from anatomy.weights.formats import FloatWeight, Int4Weight, Int8GroupWeight, Int8Weight
from anatomy.weights.modules import CompactEmbedding, CompactLinear, float_state_dict, stored_bytes

TINY = dict(vocab_size=96, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128, max_seq_len=32)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A tiny untied llama saved in the HF layout (f32)."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("hf") / "llama"
    anatomy.save(build_model(get_preset("llama-7b", **TINY)), path)
    return path


def _compact(model, name):
    return model.get_submodule(name).compact


def test_auto_keeps_the_shipped_files_blocks(smollm2_gguf_path, smollm2):
    """Q4_1 matrices stay int4, the Q8_0 token table int8g and the tied head shares it; the model reads
    ~5 bits a weight; its forward is exactly the fp32 model's (the same dequantized values)."""
    model = anatomy.load(smollm2_gguf_path)
    assert isinstance(_compact(model, "stack.blocks.0.attn.qkv"), Int4Weight)
    assert isinstance(model.stack.embed.tokens, CompactEmbedding)
    assert isinstance(_compact(model, "stack.embed.tokens"), Int8GroupWeight)
    assert model.lm_head.compact is model.stack.embed.tokens.compact
    stored = stored_bytes(model)
    assert stored < 0.2 * stored_bytes(smollm2) and stored <= smollm2_gguf_path.stat().st_size
    ids = torch.tensor([[1, 504, 3575, 282, 4649, 314]])
    with torch.no_grad():
        assert torch.equal(model(ids), smollm2(ids))


@pytest.mark.parametrize("choice, kind", [("f16", FloatWeight), ("bf16", FloatWeight), ("int8", Int8Weight),
                                          ("int4", Int4Weight)])
def test_each_choice_converts_an_hf_checkpoint(hf_dir, choice, kind):
    dense = anatomy.load(hf_dir)
    model = anatomy.load(hf_dir, weights=choice)
    qkv = _compact(model, "stack.blocks.1.attn.qkv")
    assert isinstance(qkv, kind) and isinstance(model.lm_head, CompactLinear)
    table = _compact(model, "stack.embed.tokens")
    assert isinstance(table, Int8Weight if choice == "int4" else kind)  # int4 keeps the table and head at 8 bits
    state, reference = float_state_dict(model), dense.state_dict()
    assert set(state) == set(reference)
    step = {"f16": 1e-3, "bf16": 8e-3, "int8": 1e-2, "int4": 0.1}[choice]  # relative to each matrix's largest value
    for name, t in state.items():
        assert (t - reference[name]).abs().max() <= step * reference[name].abs().max(), name
    ids = torch.randint(0, 96, (2, 7))
    exact = build_model(dense.config)  # a dense model holding exactly what the compact one stores
    exact.load_state_dict(state, strict=False)
    with torch.no_grad():
        torch.testing.assert_close(model(ids), exact(ids), rtol=1e-5, atol=1e-5)


def test_f32_and_auto_keep_an_f32_checkpoint_dense(hf_dir):
    for choice in ("auto", "f32"):
        model = anatomy.load(hf_dir, weights=choice)
        assert not any(isinstance(m, (CompactLinear, CompactEmbedding)) for m in model.modules())


def test_saving_a_compact_model_writes_the_values_it_holds(hf_dir, tmp_path):
    """An HF directory and a GGUF file written from an int8 model load back (dense) to the same logits."""
    model = anatomy.load(hf_dir, weights="int8")
    anatomy.save(model, tmp_path / "back")
    ids = torch.randint(0, 96, (1, 9))
    with torch.no_grad():
        expected = model(ids)
        torch.testing.assert_close(anatomy.load(tmp_path / "back")(ids), expected, rtol=1e-5, atol=1e-5)


def test_choices_and_their_spellings():
    assert CHOICES == ("auto", "f32", "f16", "bf16", "int8", "int4")
    assert parse_weights(torch.float16) == "f16" and parse_weights("int4") == "int4"
    with pytest.raises(InputError, match=r"weights='int3' is not one of f32, f16, bf16, int8, int4"):
        parse_weights("int3")


def test_bad_choice_and_a_shape_int4_cannot_take(hf_dir, tmp_path):
    with pytest.raises(InputError, match="weights='q4_1'"):
        anatomy.load(hf_dir, weights="q4_1")
    odd = tmp_path / "odd"
    anatomy.save(build_model(get_preset("llama-7b", **{**TINY, "d_model": 48, "n_heads": 4, "n_kv_heads": 2})), odd)
    with pytest.raises(InputError, match=r"K=48 must be a multiple of the group size 32"):
        anatomy.load(odd, weights="int4")


# GGUF type -> (byte offsets of its float16 d, |d| at most): random blocks with weights of a sane size
RANDOM_BLOCKS = {"Q8_0": ([0], 1e-3), "IQ4_NL": ([0], 1e-3), "IQ4_XS": ([0], 3e-5), "MXFP4": ([], 0)}
MIXED_TYPES = {"attn_q": "IQ4_NL", "attn_k": "MXFP4", "attn_v": "Q8_0", "attn_output": "IQ4_XS",
               "ffn_gate": "IQ4_XS", "ffn_up": "IQ4_NL", "ffn_down": "MXFP4", "token_embd": "Q8_0",
               "output": "MXFP4"}


def _random_blocks(type_name: str, n_elements: int, rng) -> np.ndarray:
    ttype = TENSOR_TYPES_BY_NAME[type_name]
    blocks = rng.integers(0, 256, size=(n_elements // ttype.block_size, ttype.type_size), dtype=np.uint8)
    offsets, size = RANDOM_BLOCKS[type_name]
    for offset in offsets:
        d = rng.uniform(-size, size, size=len(blocks)).astype(np.float16)
        blocks[:, offset:offset + 2] = d.view(np.uint8).reshape(-1, 2)
    if type_name == "MXFP4":
        blocks[:, 0] = rng.integers(118, 123, size=len(blocks))  # 2^-10 .. 2^-6 (times levels up to 12)
    return blocks.reshape(-1)


@pytest.fixture(scope="module")
def mixed_gguf(tmp_path_factory):
    """A tiny llama whose matrices are IQ4_NL, IQ4_XS, MXFP4 and Q8_0 blocks of random bytes (q, k, v of
    three types: one fused matrix)."""
    torch.manual_seed(0)
    config = get_preset("llama-7b", **{**TINY, "d_model": 256, "d_ff": 512})
    tokens = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": [f"t{i}" for i in range(96)]}
    folder = tmp_path_factory.mktemp("mixed")
    f = read_gguf(save_gguf(build_model(config), folder / "f32.gguf", tokenizer_metadata=tokens))
    rng = np.random.default_rng(0)
    entries = []
    for t in f.tensors.values():
        kind = MIXED_TYPES.get(t.name.split(".")[-2]) if len(t.shape) == 2 else None
        raw = _random_blocks(kind, t.n_elements, rng) if kind else f.raw(t.name)
        entries.append(TensorEntry(name=t.name, type=TENSOR_TYPES_BY_NAME[kind] if kind else t.type, shape=t.shape,
                                   data=lambda raw=raw: raw))
    metadata = [(k, f.value_types[k], v) for k, v in f.metadata.items()]
    return write_gguf(folder / "mixed.gguf", metadata=metadata, tensors=entries)


def test_auto_keeps_iq4_and_mxfp4_blocks_as_int8_codes(mixed_gguf):
    """IQ4_NL, IQ4_XS and MXFP4 matrices stay int8g (their levels as codes, per-32 scales), q|k|v fused across
    three types; every value and the forward are exactly the fp32 model's (gguf-py's dequantization)."""
    dense = anatomy.load(mixed_gguf, weights="f32")
    model = anatomy.load(mixed_gguf)
    for name in ("stack.blocks.0.attn.qkv", "stack.blocks.1.attn.out", "stack.blocks.0.ffn.down", "lm_head"):
        assert isinstance(_compact(model, name), Int8GroupWeight), name
    state, reference = float_state_dict(model), dense.state_dict()
    assert all(torch.equal(t, reference[name]) for name, t in state.items())
    f = read_gguf(mixed_gguf)
    down = quants.dequantize(f.raw("blk.1.ffn_down.weight").reshape(256, -1), GGMLQuantizationType.MXFP4)
    assert torch.equal(reference["stack.blocks.1.ffn.down.weight"], torch.from_numpy(down))
    ids = torch.randint(0, 96, (2, 7))
    with torch.no_grad():
        assert torch.equal(model(ids), dense(ids))
