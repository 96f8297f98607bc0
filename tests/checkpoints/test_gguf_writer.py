"""save_gguf: llama.cpp (llama-cpp-python) runs what anatomy writes and computes the same logits
and greedy tokens; gguf-py reads it; the write is atomic."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gguf import GGUFReader

import anatomy
from anatomy import build_model, get_preset
from anatomy.checkpoints import gguf_writer
from anatomy.checkpoints.gguf import load_gguf, read_gguf, save_gguf, tokenizer_metadata
from anatomy.errors import CheckpointError, InputError

llama_cpp = pytest.importorskip("llama_cpp")

V = 64
TOKENIZER = {  # a minimal byte-level BPE vocabulary: llama.cpp refuses a file without one
    "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default",
    "tokenizer.ggml.tokens": [f"t{i}" for i in range(V)], "tokenizer.ggml.token_type": [1] * V,
    "tokenizer.ggml.merges": ["t 0"], "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
}
IDS = [1, 5, 9, 13, 40, 22, 7, 63, 0, 31]
F32 = 0  # ggml type of llama.cpp's KV cache: f32 instead of its default f16, for a tight comparison
# llama.cpp's worker threads spin at barriers: on a busy 2-core machine one thread is several times faster


def _tiny(preset: str, **overrides):
    torch.manual_seed(0)
    config = get_preset(preset, vocab_size=V, d_model=64, n_layers=2, n_heads=4, d_ff=96, max_seq_len=128,
                        bos_token_id=1, eos_token_id=2, **overrides)
    model = build_model(config).eval()
    for p in model.parameters():  # larger weights than the default init: logits of order 10
        if p.dim() == 2:
            p.data.normal_(0, 0.3)
        else:
            p.data.uniform_(0.5, 1.5)
    return model


@pytest.fixture(scope="module")
def tiny_llama():
    """A random GQA llama with an untied head (so `output.weight` is written too)."""
    return _tiny("llama-7b", n_kv_heads=2)


def _llama_cpp_logits(path, ids: list[int]) -> torch.Tensor:
    llm = llama_cpp.Llama(model_path=str(path), logits_all=True, verbose=False, n_ctx=256, n_threads=1,
                          type_k=F32, type_v=F32)
    llm.eval(ids)
    return torch.tensor(np.array(llm.scores[:len(ids)]))  # [S, V]


@torch.no_grad()
def test_llama_cpp_computes_the_same_logits_f32(tiny_llama, tmp_path):
    path = save_gguf(tiny_llama, tmp_path / "tiny.gguf", tokenizer_metadata=TOKENIZER)
    ours = tiny_llama(torch.tensor([IDS]))[0]  # [S, V]
    theirs = _llama_cpp_logits(path, IDS)
    assert ours.abs().max() > 5
    assert (ours - theirs).abs().max().item() < 1e-4


@torch.no_grad()
@torch.no_grad()
def test_llama_cpp_computes_the_same_logits_gpt2(tmp_path):
    model = _tiny("gpt2")
    path = save_gguf(model, tmp_path / "gpt2.gguf", tokenizer_metadata=TOKENIZER)
    ours = model(torch.tensor([IDS]))[0]  # [S, V]
    # llama.cpp's CPU GELU reads a float16 lookup table: errors of ~1e-3 on logits of size ~10
    assert (ours - _llama_cpp_logits(path, IDS)).abs().max().item() < 5e-3
    reloaded = load_gguf(path)
    assert reloaded.config == model.config
    assert torch.equal(reloaded(torch.tensor([IDS]))[0], ours)


def test_f16_file_holds_f16_weights_and_llama_cpp_runs_it(tiny_llama, tmp_path):
    path = save_gguf(tiny_llama, tmp_path / "tiny16.gguf", dtype="f16", tokenizer_metadata=TOKENIZER)
    reloaded = load_gguf(path)
    for name, p in tiny_llama.state_dict().items():
        expected = p if p.dim() == 1 else p.half().float()  # norms stay f32
        assert torch.equal(reloaded.state_dict()[name], expected), name
    types = {t.name: t.tensor_type.name for t in GGUFReader(path).tensors}
    assert types["blk.0.attn_q.weight"] == "F16" and types["blk.0.attn_norm.weight"] == "F32"
    ours = reloaded(torch.tensor([IDS]))[0]
    # llama.cpp's CPU f16 matmul rounds the activations to f16 too: ~0.5% of logits of size ~6
    assert (ours - _llama_cpp_logits(path, IDS)).abs().max().item() < 5e-2


def test_round_trip_is_exact_and_gguf_py_reads_it(tiny_llama, tmp_path):
    path = save_gguf(tiny_llama, tmp_path / "tiny.gguf", tokenizer_metadata=TOKENIZER)
    reloaded = load_gguf(path)
    assert reloaded.config == tiny_llama.config
    for name, p in tiny_llama.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], p), name
    reader = GGUFReader(path)
    assert reader.fields["llama.attention.head_count_kv"].contents() == 2
    assert reader.fields["tokenizer.ggml.tokens"].contents() == TOKENIZER["tokenizer.ggml.tokens"]
    names = {t.name for t in reader.tensors}
    assert {"token_embd.weight", "output.weight", "blk.1.ffn_gate.weight", "blk.1.attn_k.weight"} <= names
    # what a tokenizer read from the file carries (its gguf_metadata) is written back as it was
    carrier = SimpleNamespace(source=str(path), gguf_metadata=tokenizer_metadata(read_gguf(path)))
    again = save_gguf(reloaded, tmp_path / "again.gguf", tokenizer=carrier)
    assert GGUFReader(again).fields["tokenizer.ggml.merges"].contents() == ["t 0"]
    with pytest.raises(InputError, match="has no GGUF vocabulary"):
        save_gguf(reloaded, tmp_path / "x.gguf", tokenizer=SimpleNamespace(source="tokenizer.json", gguf_metadata=None))


def test_failed_write_leaves_the_old_file(tiny_llama, tmp_path, monkeypatch):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"old contents")

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(gguf_writer, "_write_data", broken)
    with pytest.raises(OSError, match="disk full"):
        save_gguf(tiny_llama, path)
    assert path.read_bytes() == b"old contents"
    assert [p.name for p in tmp_path.iterdir()] == ["m.gguf"]  # no temporary file left


def test_unsupported_models_and_options(tiny_llama, tmp_path):
    encoder = build_model(get_preset("bert-base", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=50))
    with pytest.raises(CheckpointError, match="no GGUF architecture llama.cpp runs expresses this config; the "
                                              "closest, .*, needs: architecture='encoder'"):
        save_gguf(encoder, tmp_path / "bert.gguf")
    with pytest.raises(InputError, match="needs an anatomy model"):
        save_gguf(torch.nn.Linear(2, 2), tmp_path / "x.gguf")
    with pytest.raises(InputError, match="dtype='q4_0'"):
        save_gguf(tiny_llama, tmp_path / "x.gguf", dtype="q4_0")
    with pytest.raises(InputError, match="must start with 'tokenizer.'"):
        save_gguf(tiny_llama, tmp_path / "x.gguf", tokenizer_metadata={"general.name": "x"})


@pytest.mark.slow
@torch.no_grad()
def test_llama_cpp_greedy_tokens_match_on_smollm2(smollm2, smollm2_gguf_path, hf_smollm2_tokenizer, greedy, tmp_path):
    """SmolLM2 loaded from the Q4_1 GGUF, written back as f32: llama.cpp's greedy continuation of a
    chat prompt is anatomy's."""
    text = hf_smollm2_tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                                    tokenize=False, add_generation_prompt=True)
    ids = hf_smollm2_tokenizer.encode(text, add_special_tokens=False)
    path = save_gguf(smollm2, tmp_path / "smollm2-f32.gguf", tokenizer=anatomy.load_tokenizer(smollm2_gguf_path))
    llm = llama_cpp.Llama(model_path=str(path), logits_all=True, verbose=False, n_ctx=256, n_threads=1,
                          type_k=F32, type_v=F32)
    theirs = []
    llm.eval(ids)
    for _ in range(16):
        theirs.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([theirs[-1]])
    assert greedy(smollm2, ids, 16) == theirs
    assert "Paris" in hf_smollm2_tokenizer.decode(theirs)


def test_a_quantized_files_mapping_is_not_kept_for_its_norms(tiny_llama, tmp_path, smollm2_gguf_path):
    """The Q4_1 file's matrices are copied out of the mapping into their formats; its float32 norms, read
    as views of it, are copied too (0.1 MB), so the 92 MB mapping is released with the file. An f32
    file's tensors are most of it: they stay views of the mapping (no copy at all)."""
    from anatomy.checkpoints.gguf import _own_small_views

    q4 = read_gguf(smollm2_gguf_path)
    norms = {name: torch.from_numpy(q4.raw(name).view(np.float32)) for name in q4.tensors if name.endswith("norm.weight")}
    assert norms and all(q4.holds(t) for t in norms.values())
    assert not any(q4.holds(t) for t in _own_small_views(q4, norms).values())
    path = save_gguf(tiny_llama, tmp_path / "f32.gguf", dtype="f32")
    f32 = read_gguf(path)
    views = {name: torch.from_numpy(f32.raw(name).view(np.float32)) for name in f32.tensors}
    assert all(f32.holds(t) for t in _own_small_views(f32, views).values())
