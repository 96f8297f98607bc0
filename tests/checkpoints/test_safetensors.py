"""HF-layout checkpoints against HF transformers itself: HF builds random models and saves them,
anatomy.load reads them, logits / hidden states agree within fp32 max-abs 1e-4; anatomy.save
writes them back and HF's from_pretrained gets the same logits. Plus the loader's defences:
missing/unexpected/wrong-shape tensors and a hardened safetensors header."""

from __future__ import annotations

import json
import os
import struct

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save_file

import anatomy
from anatomy.checkpoints import safetensors_format
from anatomy.checkpoints.hf_config import config_to_hf
from anatomy.checkpoints.safetensors_format import read_tensors, write_tensors
from anatomy.errors import CheckpointError, ConfigError, InputError

transformers = pytest.importorskip("transformers")
TOL = 1e-4
V = 101


def _hf_models() -> dict:
    T = transformers
    small = dict(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96)
    bert = T.BertConfig(**small, max_position_embeddings=32, type_vocab_size=2)
    return {
        "llama": T.LlamaForCausalLM(T.LlamaConfig(**small, num_key_value_heads=2, rope_theta=5000.0,
                                                  rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)),
        "llama-bias-tied": T.LlamaForCausalLM(T.LlamaConfig(**small, num_key_value_heads=1, attention_bias=True,
                                                            mlp_bias=True, tie_word_embeddings=True)),
        "gpt2": T.GPT2LMHeadModel(T.GPT2Config(vocab_size=V, n_embd=64, n_layer=2, n_head=4, n_positions=32,
                                               bos_token_id=1, eos_token_id=2)),
        "bert": T.BertModel(bert),
        "bert-mlm": T.BertForMaskedLM(T.BertConfig(**bert.to_dict())),
        "marian": T.MarianMTModel(T.MarianConfig(
            vocab_size=V, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=96, decoder_ffn_dim=96, max_position_embeddings=32,
            pad_token_id=V - 1, decoder_start_token_id=V - 1, eos_token_id=0, scale_embedding=True,
            activation_function="swish")),
    }


def _perturb(model: torch.nn.Module) -> None:
    """HF initialises norms to (1, 0) and biases to 0, which would hide a swapped norm or bias:
    move every trained tensor (and Marian's logits bias) off its initial value."""
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.05)
        if hasattr(model, "final_logits_bias"):
            model.final_logits_bias.normal_()


@pytest.fixture(scope="module")
def hf_checkpoints(tmp_path_factory):
    """{family: (HF model in eval mode, the directory HF saved it to)}."""
    torch.manual_seed(1)
    out = {}
    for family, model in _hf_models().items():
        _perturb(model)
        directory = tmp_path_factory.mktemp(family)
        model.save_pretrained(directory)
        out[family] = (model.eval(), directory)
    return out


def _inputs(family: str, masked: bool) -> dict:
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, V - 1, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    if masked:
        mask[0, 8:] = 0  # right padding
        mask[2, 5:] = 0
        if family.startswith(("llama", "gpt2")):
            mask = mask.flip(1)  # decoders are padded on the left
    return {"ids": ids, "mask": mask if masked else None, "types": (ids % 2), "tgt": ids[:, :7].flip(1)}


def _run_hf(family: str, model, x: dict) -> torch.Tensor:
    with torch.no_grad():
        if family == "bert":
            return model(x["ids"], attention_mask=x["mask"], token_type_ids=x["types"]).last_hidden_state
        if family == "bert-mlm":
            return model(x["ids"], attention_mask=x["mask"], token_type_ids=x["types"]).logits
        if family == "marian":
            return model(input_ids=x["ids"], attention_mask=x["mask"], decoder_input_ids=x["tgt"]).logits
        return model(x["ids"], attention_mask=x["mask"]).logits


def _run_ours(family: str, model, x: dict) -> torch.Tensor:
    with torch.no_grad():
        if family.startswith("bert"):
            return model(x["ids"], attention_mask=x["mask"], token_type_ids=x["types"])
        if family == "marian":
            return model(x["ids"], x["tgt"], src_mask=x["mask"])
        return model(x["ids"], attention_mask=x["mask"])


def _valid(family: str, x: dict, t: torch.Tensor) -> torch.Tensor:
    """The positions that are not padding (Marian: every target position)."""
    if family == "marian" or x["mask"] is None:
        return t
    return t[x["mask"].bool()]


FAMILIES = ["llama", "llama-bias-tied", "gpt2", "bert", "bert-mlm", "marian"]
CLASSES = {"llama": "DecoderLM", "llama-bias-tied": "DecoderLM", "gpt2": "DecoderLM", "bert": "Encoder",
           "bert-mlm": "MaskedLM", "marian": "EncoderDecoder"}


@pytest.mark.parametrize("masked", [False, True], ids=["no-padding", "padding"])
@pytest.mark.parametrize("family", FAMILIES)
def test_load_matches_hf(hf_checkpoints, family, masked):
    hf_model, directory = hf_checkpoints[family]
    ours = anatomy.load(directory)
    assert type(ours).__name__ == CLASSES[family] and not ours.training
    x = _inputs(family, masked)
    expected, got = _run_hf(family, hf_model, x), _run_ours(family, ours, x)
    assert got.shape == expected.shape
    assert (_valid(family, x, got) - _valid(family, x, expected)).abs().max() <= TOL


def test_bert_pooler_matches_hf(hf_checkpoints):
    hf_model, directory = hf_checkpoints["bert"]
    x = _inputs("bert", masked=True)
    ours = anatomy.load(directory)
    with torch.no_grad():
        expected = hf_model(x["ids"], attention_mask=x["mask"], token_type_ids=x["types"]).pooler_output
        got = ours.pool(ours(x["ids"], attention_mask=x["mask"], token_type_ids=x["types"]))
    assert (got - expected).abs().max() <= TOL


@pytest.mark.parametrize("family", FAMILIES)
def test_save_then_hf_from_pretrained(hf_checkpoints, tmp_path, family):
    hf_model, directory = hf_checkpoints[family]
    ours = anatomy.load(directory)
    anatomy.save(ours, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    reloaded = getattr(transformers, config["architectures"][0]).from_pretrained(tmp_path / "out").eval()
    x = _inputs(family, masked=True)
    got, expected = _run_hf(family, reloaded, x), _run_ours(family, ours, x)
    assert (_valid(family, x, got) - _valid(family, x, expected)).abs().max() <= TOL


def test_fresh_model_round_trips_through_hf(tmp_path):
    """A model anatomy built (not loaded) saves in HF layout that HF reads with the same logits."""
    config = anatomy.get_preset("gpt2", d_model=32, n_layers=2, n_heads=4, d_ff=64, vocab_size=V, max_seq_len=16,
                                bos_token_id=1, eos_token_id=2)
    model = anatomy.build_model(config).eval()
    anatomy.save(model, tmp_path / "gpt2")
    hf_model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "gpt2").eval()
    ids = torch.randint(0, V, (2, 9))
    with torch.no_grad():
        assert (hf_model(ids).logits - model(ids)).abs().max() <= TOL
    assert anatomy.load(tmp_path / "gpt2").config == config


def test_sharded_checkpoint(hf_checkpoints, tmp_path):
    hf_model, _ = hf_checkpoints["llama"]
    hf_model.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").exists() and not (tmp_path / "model.safetensors").exists()
    x = _inputs("llama", masked=False)
    got = _run_ours("llama", anatomy.load(tmp_path), x)
    assert (got - _run_hf("llama", hf_model, x)).abs().max() <= TOL


def test_bf16_file_loads_as_float32_or_as_is(hf_checkpoints, tmp_path):
    hf_model, _ = hf_checkpoints["gpt2"]
    hf_model.to(torch.bfloat16).save_pretrained(tmp_path)
    hf_model.float()
    as_f32 = anatomy.load(tmp_path)
    as_is = anatomy.load(tmp_path, dtype=None)
    expected = hf_model.transformer.wte.weight.to(torch.bfloat16)
    assert as_f32.token_embedding.weight.dtype == torch.float32 and as_is.token_embedding.weight.dtype == torch.bfloat16
    assert torch.equal(as_is.token_embedding.weight, expected)
    assert torch.equal(as_f32.token_embedding.weight, expected.float())


def test_loaded_weights_are_views_of_the_file(hf_checkpoints):
    """Unfused tensors are borrowed from the memory map (a non-resizable storage), not copied."""
    ours = anatomy.load(hf_checkpoints["llama"][1])
    assert not ours.token_embedding.weight.untyped_storage().resizable()
    assert not ours.stack.blocks[0].attn.out.weight.untyped_storage().resizable()
    assert ours.lm_head.weight.data_ptr() != ours.token_embedding.weight.data_ptr()  # untied in this config


def test_save_float16(hf_checkpoints, tmp_path):
    ours = anatomy.load(hf_checkpoints["llama"][1])
    anatomy.save(ours, tmp_path / "f16", dtype=torch.float16)
    assert json.loads((tmp_path / "f16" / "config.json").read_text())["dtype"] == "float16"
    with safe_open(tmp_path / "f16" / "model.safetensors", "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F16"}
        assert torch.equal(f.get_tensor("model.embed_tokens.weight"), ours.token_embedding.weight.half())


# -- a checkpoint that does not fit ------------------------------------------------------------------
def _rewrite(directory, change) -> None:
    path = directory / "model.safetensors"
    tensors = dict(read_tensors(path))
    change(tensors)
    save_file({k: v.clone() for k, v in tensors.items()}, path, metadata={"format": "pt"})


@pytest.fixture()
def llama_copy(hf_checkpoints, tmp_path):
    hf_checkpoints["llama"][0].save_pretrained(tmp_path)
    return tmp_path


def test_missing_and_unexpected_tensors_are_listed(llama_copy):
    def change(t):
        del t["model.layers.1.mlp.up_proj.weight"]
        del t["model.norm.weight"]
        t["model.layers.0.extra.weight"] = torch.zeros(2)
    _rewrite(llama_copy, change)
    with pytest.raises(CheckpointError) as e:
        anatomy.load(llama_copy)
    message = str(e.value)
    assert "missing tensors ['model.layers.1.mlp.up_proj.weight', 'model.norm.weight']" in message
    assert "unexpected tensors ['model.layers.0.extra.weight']" in message
    assert "model.safetensors" in message


def test_wrong_shape_names_tensor_and_both_shapes(llama_copy):
    _rewrite(llama_copy, lambda t: t.update({"model.layers.0.self_attn.k_proj.weight": torch.zeros(16, 64)}))
    with pytest.raises(CheckpointError, match=r"'model.layers.0.self_attn.k_proj.weight' has shape \[16, 64\], "
                                              r"the config calls for \[32, 64\]"):
        anatomy.load(llama_copy)


def test_integer_tensor_is_refused(llama_copy):
    _rewrite(llama_copy, lambda t: t.update({"model.norm.weight": torch.zeros(64, dtype=torch.int32)}))
    with pytest.raises(CheckpointError, match="'model.norm.weight' has dtype torch.int32"):
        anatomy.load(llama_copy)


def test_recomputed_buffers_in_the_file_are_ignored(hf_checkpoints, tmp_path):
    """Older HF files carry buffers anatomy recomputes (BERT position_ids): not an error."""
    hf_checkpoints["bert"][0].save_pretrained(tmp_path)
    _rewrite(tmp_path, lambda t: t.update({"embeddings.position_ids": torch.arange(32)[None]}))
    assert anatomy.load(tmp_path).config.pooler


def test_original_gpt2_layout_without_prefix(hf_checkpoints, tmp_path):
    """OpenAI's GPT-2 files have no "transformer." prefix and carry the causal-mask buffers."""
    hf_model, _ = hf_checkpoints["gpt2"]
    hf_model.save_pretrained(tmp_path)

    def change(t):
        for name in list(t):
            t[name.removeprefix("transformer.")] = t.pop(name)
        t["h.0.attn.bias"] = torch.ones(1, 1, 32, 32).tril()
    _rewrite(tmp_path, change)
    x = _inputs("gpt2", masked=False)
    assert (_run_ours("gpt2", anatomy.load(tmp_path), x) - _run_hf("gpt2", hf_model, x)).abs().max() <= TOL


def test_config_hf_cannot_express_writes_nothing(tmp_path):
    model = anatomy.build_model(anatomy.get_preset("gpt2", position="alibi", n_layers=1, d_model=16, n_heads=2,
                                                   d_ff=32, vocab_size=V, bos_token_id=1, eos_token_id=2))
    with pytest.raises(ConfigError, match="the closest, GPT2LMHeadModel, needs: position='alibi'"):
        anatomy.save(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(InputError, match="no HF layout for Linear"):
        anatomy.save(torch.nn.Linear(2, 2), tmp_path / "out")


def test_unsupported_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5", "vocab_size": 10}))
    with pytest.raises(ConfigError, match=r"config.json: model_type='t5' is not supported \(supported: llama"):
        anatomy.load(tmp_path)


def test_directory_without_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(config_to_hf(anatomy.get_preset("gpt2"))))
    with pytest.raises(CheckpointError, match="neither model.safetensors nor model.safetensors.index.json"):
        anatomy.load(tmp_path)


def test_shard_outside_the_directory_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(config_to_hf(anatomy.get_preset("gpt2"))))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "../x.safetensors"}}))
    with pytest.raises(CheckpointError, match="not in this directory"):
        anatomy.load(tmp_path)


# -- atomic writes -------------------------------------------------------------------------------------
def _tiny_model():
    config = anatomy.get_preset("llama-7b", vocab_size=16, d_model=8, n_layers=1, n_heads=2, d_ff=16,
                                bos_token_id=1, eos_token_id=2)
    return anatomy.build_model(config).eval()


def test_failed_save_leaves_the_good_files(tmp_path, monkeypatch):
    model = _tiny_model()
    anatomy.save(model, tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    calls = []

    def failing(t):
        calls.append(1)
        if len(calls) > 2:
            raise OSError("disk full")
        return memoryview(b"\0" * t.numel() * t.element_size())
    monkeypatch.setattr(safetensors_format, "_bytes_of", failing)
    with pytest.raises(OSError, match="disk full"):
        anatomy.save(model, tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no temp file left either


def test_failed_save_to_new_directory_leaves_nothing(tmp_path, monkeypatch):
    def failing(t):
        raise OSError("disk full")
    monkeypatch.setattr(safetensors_format, "_bytes_of", failing)
    with pytest.raises(OSError):
        anatomy.save(_tiny_model(), tmp_path / "new")
    assert list(tmp_path.iterdir()) == []


# -- the safetensors header ------------------------------------------------------------------------------
def _file(path, header: dict | bytes, data: bytes = b"\0" * 24, n: int | None = None):
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if n is None else n) + raw + data)
    return path


GOOD = {"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
        "b": {"dtype": "I16", "shape": [4], "data_offsets": [16, 24]}}


def _entry(**change):
    return {"a": {**GOOD["a"], **change}}


@pytest.mark.parametrize("header, n, pattern", [
    (GOOD, 10**12, r"header length 1000000000000 does not fit the file"),
    (b"{not json", None, r"the header is not valid UTF-8 JSON"),
    (b"\xff\xfe{}", None, r"the header is not valid UTF-8 JSON"),
    (b"[1, 2]", None, r"the header is a JSON list, not an object"),
    (_entry(dtype="F33"), None, r"tensor 'a': field dtype='F33' is not one of F64, F32"),
    (_entry(shape=[2, -2]), None, r"tensor 'a': field shape=\[2, -2\] is not a list of non-negative integers"),
    (_entry(shape=[2, True]), None, r"field shape=\[2, True\]"),
    (_entry(shape=[3, 2]), None, r"tensor 'a': shape \[3, 2\] of F32 needs 24 bytes, data_offsets=\[0, 16\] hold 16"),
    (_entry(data_offsets=[0, 16, 3]), None, r"field data_offsets=\[0, 16, 3\] is not a pair"),
    (_entry(data_offsets=[16, 32], shape=[4]), None, r"data_offsets=\[16, 32\] lies outside the data section"),
    (_entry(extra=1), None, r"tensor 'a': entry has fields \['data_offsets', 'dtype', 'extra', 'shape'\]"),
    ({**GOOD, "b": {**GOOD["b"], "data_offsets": [8, 16]}}, None,
     r"tensor 'b' data_offsets \[8, 16\] overlap tensor 'a'"),
    ({**GOOD, "__metadata__": {"format": 1}}, None, r"field __metadata__=\{'format': 1\}"),
])
def test_bad_headers_are_named(tmp_path, header, n, pattern):
    path = _file(tmp_path / "bad.safetensors", header, n=n)
    with pytest.raises(CheckpointError, match=pattern) as e:
        read_tensors(path)
    assert str(path) in str(e.value)


def test_truncated_file(tmp_path):
    (tmp_path / "t.safetensors").write_bytes(b"\x10\0\0")
    with pytest.raises(CheckpointError, match="too short for the 8-byte header length"):
        read_tensors(tmp_path / "t.safetensors")


def test_write_then_read_every_dtype(tmp_path):
    """Our writer's files are read by the reference library, and ours reads them back bit-exactly."""
    tensors = {f"t_{d}": (torch.arange(6) % 2).to(d).reshape(2, 3)
               for d in (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int8, torch.bool)}
    tensors["scalar"], tensors["empty"] = torch.tensor(3.5), torch.zeros(0, 4)
    write_tensors(tmp_path / "x.safetensors", tensors, metadata={"format": "pt"})
    with safe_open(tmp_path / "x.safetensors", "pt") as f:
        assert all(torch.equal(f.get_tensor(k), v) for k, v in tensors.items())
    back = read_tensors(tmp_path / "x.safetensors")
    assert back.keys() == tensors.keys() and all(torch.equal(back[k], v) for k, v in tensors.items())


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny")
    anatomy.save(_tiny_model(), directory)
    raw = (directory / "model.safetensors").read_bytes()
    return directory, raw, 8 + struct.unpack("<Q", raw[:8])[0]


@pytest.mark.slow
@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_mutated_header_loads_cleanly_or_raises_checkpoint_error(tiny_checkpoint, data):
    """Any change to the header bytes (length prefix included): a model, or a CheckpointError.
    Half the new bytes are digits, which keep the JSON valid and change shapes and offsets."""
    directory, raw, header_end = tiny_checkpoint
    mutated = bytearray(raw)
    new_byte = st.one_of(st.integers(0, 255), st.sampled_from(b"0123456789"))
    for _ in range(data.draw(st.integers(1, 4))):
        mutated[data.draw(st.integers(0, header_end - 1))] = data.draw(new_byte)
    path = directory / "model.safetensors"
    path.write_bytes(bytes(mutated))
    try:
        model = anatomy.load(directory)
    except CheckpointError:
        return
    finally:
        path.write_bytes(raw)
    with torch.no_grad():
        assert model(torch.tensor([[1, 2, 3]])).shape == (1, 3, 16)  # a clean load runs


def test_temp_files_use_the_target_folder(tmp_path):
    write_tensors(tmp_path / "a.safetensors", {"x": torch.zeros(2)})
    assert os.listdir(tmp_path) == ["a.safetensors"]
