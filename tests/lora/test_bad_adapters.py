"""Bad PEFT adapters: each problem is one InputError naming the file and the field or tensor,
raised before the model is touched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import anatomy
from anatomy.errors import InputError
from anatomy.lora import LoraConfig, apply_lora, load_adapter, lora_layers, merge_lora, save_adapter

Q0 = "base_model.model.model.layers.0.self_attn.q_proj"


@pytest.fixture(scope="module")
def model_config():
    return anatomy.get_preset("llama-7b", vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64,
                              max_seq_len=16)


@pytest.fixture
def adapter(tmp_path, model_config) -> Path:
    """A good adapter of q and v, rank 4."""
    torch.manual_seed(0)
    save_adapter(apply_lora(anatomy.build_model(model_config), LoraConfig(rank=4, targets="q,v")), tmp_path / "a")
    return tmp_path / "a"


def _edit_tensors(adapter: Path, edit) -> None:
    tensors = load_file(adapter / "adapter_model.safetensors")
    edit(tensors)
    save_file(tensors, adapter / "adapter_model.safetensors")


def _edit_config(adapter: Path, **values) -> None:
    path = adapter / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **values}))


def _truncate(adapter: Path) -> None:
    path = adapter / "adapter_model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])


BAD = {
    "wrong rank": (lambda a: _edit_config(a, r=8),
                   r"adapter_model\.safetensors: tensor '.*lora_A\.weight' has rank 4, the adapter's r is 8"),
    "wrong shape": (lambda a: _edit_tensors(a, lambda t: t.update({f"{Q0}.lora_A.weight": torch.zeros(4, 16)})),
                    rf"adapter_model\.safetensors: tensor '{Q0}\.lora_A\.weight' has shape \(4, 16\), the model needs \(4, 32\)"),
    "unknown target": (lambda a: _edit_config(a, target_modules=["q_proj", "c_attn"]),
                       r"adapter_config\.json: target module 'c_attn' is not a projection of this model"),
    "missing tensor": (lambda a: _edit_tensors(a, lambda t: t.pop(f"{Q0}.lora_B.weight")),
                       rf"adapter_model\.safetensors: tensor '{Q0}\.lora_B\.weight' is missing"),
    "extra tensor": (lambda a: _edit_tensors(a, lambda t: t.update({f"{Q0}.lora_C.weight": torch.zeros(1)})),
                     rf"adapter_model\.safetensors: tensor '{Q0}\.lora_C\.weight' is not a LoRA weight"),
    "truncated file": (_truncate, r"adapter_model\.safetensors"),
    "non-finite": (lambda a: _edit_tensors(a, lambda t: t[f"{Q0}.lora_A.weight"].__setitem__((0, 0), float("nan"))),
                   rf"adapter_model\.safetensors: tensor '{Q0}\.lora_A\.weight' holds non-finite values"),
    "DoRA": (lambda a: _edit_config(a, use_dora=True), r"adapter_config\.json: use_dora=True is set"),
    "not LoRA": (lambda a: _edit_config(a, peft_type="IA3"), r"adapter_config\.json: peft_type 'IA3' is not 'LORA'"),
    "bad alpha": (lambda a: _edit_config(a, lora_alpha="x"), r"adapter_config\.json: LoRA alpha 'x' must be"),
    "broken JSON": (lambda a: (a / "adapter_config.json").write_text("{"), r"adapter_config\.json: not readable JSON"),
    "no weights": (lambda a: (a / "adapter_model.safetensors").unlink(), r"adapter_model\.safetensors: missing"),
}


@pytest.mark.parametrize("case", BAD)
def test_a_bad_adapter_is_one_error_naming_the_file_and_tensor(adapter, model_config, case):
    spoil, message = BAD[case]
    spoil(adapter)
    with pytest.raises(InputError, match=message):
        load_adapter(adapter, model_config)
    model = anatomy.build_model(model_config)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for use in (apply_lora, merge_lora):
        with pytest.raises(InputError, match=message):
            use(model, adapter)
    assert not lora_layers(model)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_an_adapter_for_another_model_names_the_tensor(adapter):
    wider = anatomy.get_preset("llama-7b", vocab_size=64, d_model=48, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64,
                               max_seq_len=16)
    with pytest.raises(InputError, match=rf"tensor '{Q0}\.lora_A\.weight' has shape \(4, 32\), the model needs \(4, 48\)"):
        load_adapter(adapter, wider)


@pytest.mark.parametrize("targets, message", [
    ("q,x", r"LoRA target 'x' is not one of q, k, v, o, gate, up, down"),
    ("", r"LoRA target '\(none\)'"),
])
def test_bad_targets_are_named(targets, message):
    with pytest.raises(InputError, match=message):
        LoraConfig(targets=targets)


def test_a_target_gpt2_fuses_is_refused_by_name():
    model = anatomy.build_model(anatomy.get_preset("gpt2", d_model=32, n_layers=1, n_heads=2, d_ff=64,
                                                   max_seq_len=16))
    with pytest.raises(InputError, match=r"LoRA target 'q': HF transformer\.h\.0\.attn\.c_attn"):
        apply_lora(model, LoraConfig(targets="q"))
