"""The LoRA report against the adapter itself: its parameters counted on a model apply_lora made,
its FLOPs per token counted by FlopCounterMode, the training state from memory.training_state; and
`anatomy inspect --lora-rank` prints it."""

from __future__ import annotations

import json

import pytest
import torch

import anatomy
from anatomy.analysis.flops import count_flops
from anatomy.analysis.lora import lora_report
from anatomy.cli import main
from anatomy.errors import InputError
from anatomy.lora import LoraConfig, apply_lora

CONFIG = anatomy.get_preset("llama-7b", vocab_size=96, d_model=64, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=96,
                            max_seq_len=32)


@pytest.mark.parametrize("targets", ["q,v", "all", "k,o,up"])
def test_the_report_counts_what_the_adapter_holds_and_computes(targets):
    lora = LoraConfig(rank=4, targets=targets)
    model = anatomy.build_model(CONFIG).eval()
    total = sum(p.numel() for p in model.parameters())
    ids = torch.zeros(2, 5, dtype=torch.long)
    base_flops = count_flops(lambda: model(ids))
    apply_lora(model, lora)
    report = lora_report(CONFIG, lora, total_params=total, dtype="f32", compute_dtype="f32")
    assert report["params"] == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert report["flops_per_token"] * ids.numel() == count_flops(lambda: model(ids)) - base_flops
    assert report["bytes_f32"] == 4 * report["params"]
    assert report["training_state_full_bytes"] == 16 * total
    assert report["training_state_lora_bytes"] == 4 * total + 16 * report["params"]


def test_inspect_prints_the_adapter(capsys):
    assert main(["inspect", "--model", "smollm2-135m", "--lora-rank", "8", "--lora-targets", "q,k,v,o", "--json"]) == 0
    lora = json.loads(capsys.readouterr().out)["lora"]
    # SmolLM2-135M: 30 layers, D = 576, q and o 576 x 576, k and v 192 x 576
    assert lora["params_by_target"] == {"q": 30 * 8 * 1152, "k": 30 * 8 * 768, "v": 30 * 8 * 768, "o": 30 * 8 * 1152}
    assert lora["training_state_ratio"] > 7
    assert main(["inspect", "--model", "smollm2-135m", "--lora-rank", "8", "--seq-len", "8", "--context", "16"]) == 0
    assert "LoRA adapter: rank 8 on q, v of 30 layers" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--lora-targets", "q"], "--lora-targets needs --lora-rank R"),
    (["--lora-rank", "0"], "--lora-rank 0 must be a positive integer"),
    (["--lora-rank", "4", "--lora-targets", "q,x"], "LoRA target 'x' is not one of"),
])
def test_bad_lora_options_are_named(capsys, args, message):
    assert main(["inspect", "--model", "smollm2-135m", *args]) == 2
    assert message in capsys.readouterr().err


def test_a_model_without_the_target_is_named():
    with pytest.raises(InputError, match="LoRA target 'gate' is not in this model"):
        lora_report(anatomy.get_preset("gpt2"), LoraConfig(targets="gate"), total_params=1, dtype="f32",
                    compute_dtype="f32")
