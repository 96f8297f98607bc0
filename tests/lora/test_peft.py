"""LoRA adapters against HF PEFT itself, both ways: an adapter PEFT makes (random A and B) gives
anatomy PEFT's logits unmerged and after merge_lora; an adapter anatomy writes loads in
`PeftModel.from_pretrained` unchanged with the same logits (fp32, 1e-4)."""

from __future__ import annotations

import json

import pytest
import torch

import anatomy
from anatomy.lora import LoraConfig, apply_lora, lora_layers, merge_lora, save_adapter

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
TOL = 1e-4


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny random LLaMA-style decoder (GQA) saved as an HF directory."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("lora") / "base"
    anatomy.save(anatomy.build_model(anatomy.get_preset("llama-7b", vocab_size=96, d_model=64, n_layers=3, n_heads=4,
                                                        n_kv_heads=2, d_ff=128, max_seq_len=32)), path)
    return path


def _hf(path):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _ours(path):
    return anatomy.load(path, dtype="f32").eval()


IDS = torch.tensor([[3, 17, 42, 5, 88, 61, 9, 30, 2], [40, 41, 7, 7, 12, 95, 0, 64, 33]])


@pytest.mark.parametrize("options", [
    dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    dict(r=2, lora_alpha=5, use_rslora=True, target_modules=["k_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
         layers_to_transform=[0, 2]),
    dict(r=3, lora_alpha=3, target_modules=r".*\.(q_proj|down_proj)"),
])
def test_a_peft_adapter_gives_pefts_logits_unmerged_and_merged(base, tmp_path, options):
    torch.manual_seed(1)
    reference = peft.get_peft_model(_hf(base), peft.LoraConfig(init_lora_weights=False, **options)).eval()
    reference.save_pretrained(tmp_path / "adapter")
    with torch.no_grad():
        expected = reference(IDS).logits
        with reference.disable_adapter():
            plain = reference(IDS).logits
        unmerged = apply_lora(_ours(base), tmp_path / "adapter")(IDS)
        merged = merge_lora(_ours(base), tmp_path / "adapter")(IDS)
    assert (expected - plain).abs().max() > 0.05  # the adapter changes the logits
    assert (unmerged - expected).abs().max() < TOL
    assert (merged - expected).abs().max() < TOL


def test_an_anatomy_adapter_loads_in_peft_unchanged(base, tmp_path):
    torch.manual_seed(2)
    ours = apply_lora(_ours(base), LoraConfig(rank=4, alpha=8, targets="q,k,v,o,gate,up,down",
                                              base_model=str(base)))
    with torch.no_grad():
        for layer in lora_layers(ours).values():
            for b in layer.lora_B.values():
                b.normal_(0, 0.1)  # a fresh adapter's B is zero: make it change something
    save_adapter(ours, tmp_path / "adapter")
    written = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert written["r"] == 4 and written["lora_alpha"] == 8 and written["base_model_name_or_path"] == str(base)
    assert set(written["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                              "down_proj"}
    reference = peft.PeftModel.from_pretrained(_hf(base), tmp_path / "adapter").eval()
    with torch.no_grad():
        expected = reference(IDS).logits
        assert (ours(IDS) - expected).abs().max() < TOL
        assert (merge_lora(ours)(IDS) - expected).abs().max() < TOL
    assert not lora_layers(ours) and set(ours.state_dict()) == set(_ours(base).state_dict())


def test_a_fresh_adapter_changes_nothing_and_only_it_trains(base, tmp_path):
    model = _ours(base)
    with torch.no_grad():
        before = model(IDS)
    apply_lora(model, LoraConfig(rank=2, targets=("q", "v")))
    with torch.no_grad():
        assert torch.equal(model(IDS), before)  # B = 0
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f"stack.blocks.{i}.attn.qkv.lora_{p}.{t}" for i in range(3) for p in "AB" for t in "qv"}
    with pytest.raises(anatomy.InputError, match="merge_lora"):  # not a half-named HF checkpoint
        anatomy.save(model, tmp_path / "saved")
    with pytest.raises(anatomy.InputError, match="already holds LoRA layers"):
        apply_lora(model, LoraConfig())


def test_generate_runs_an_adapter_unmerged_as_merged(base, tmp_path):
    torch.manual_seed(3)
    reference = peft.get_peft_model(_hf(base), peft.LoraConfig(r=4, lora_alpha=16, init_lora_weights=False,
                                                                target_modules=["q_proj", "v_proj", "up_proj"]))
    reference.save_pretrained(tmp_path / "adapter")
    prompt = [3, 17, 42, 5]

    def tokens(model) -> list[int]:
        return anatomy.generate(model.eval(), prompt, max_new_tokens=12, temperature=0).token_ids

    unmerged = tokens(apply_lora(_ours(base), tmp_path / "adapter"))
    assert unmerged == tokens(merge_lora(_ours(base), tmp_path / "adapter"))
    assert unmerged != tokens(_ours(base))
