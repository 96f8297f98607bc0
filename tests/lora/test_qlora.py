"""QLoRA: `anatomy train --qlora` trains an adapter over a base kept in int4 blocks. The frozen
compact layer's backward (it dequantizes again instead of keeping the float weight) gives autograd's
gradient; the adapter trained over int4 gives, in HF PEFT over the same int4 weights written out
as floats, anatomy's logits (fp32, 1e-4); and the held-out loss falls as with a float base."""

from __future__ import annotations

import json

import pytest
import torch

import anatomy
from anatomy.cli import main
from anatomy.weights.formats import Int4Weight
from anatomy.weights.modules import CompactLinear

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")


def test_the_frozen_compact_backward_is_autograds():
    torch.manual_seed(0)
    fmt = Int4Weight.from_float(torch.randn(48, 64), group=32)
    layer = CompactLinear(fmt, bias=torch.randn(48))
    x = torch.randn(3, 5, 64, requires_grad=True)
    grad = torch.randn(3, 5, 48)
    layer(x).backward(grad)
    ours = x.grad.clone()
    x.grad = None
    torch.nn.functional.linear(x, fmt.dequantize(), layer.bias).backward(grad)
    assert torch.allclose(ours, x.grad, atol=1e-5, rtol=0)
    with torch.no_grad():
        assert torch.equal(layer(x), torch.nn.functional.linear(x, fmt.dequantize(), layer.bias))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(an HF checkpoint of a tiny random LLaMA-style decoder, the run `anatomy train --qlora` made over it)."""
    root = tmp_path_factory.mktemp("qlora")
    torch.manual_seed(0)
    base = root / "base"
    anatomy.save(anatomy.build_model(anatomy.get_preset(
        "llama-7b", vocab_size=96, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128, max_seq_len=64)), base)
    text = root / "text.txt"
    text.write_text("\n".join(f"the {w} of the {v} said all men must love" for w in ("king", "queen", "fool", "land")
                              for v in ("sea", "hill", "town", "field", "road")) * 20 + "\n")
    assert main(["train", "--data", str(text), "--model", str(base), "--qlora", "--lora-rank", "4", "--lora-targets",
                 "all", "--seq-len", "32", "--batch-size", "8", "--lr", "1e-2", "--warmup", "2", "--steps", "10",
                 "--eval-every", "10", "--eval-steps", "2", "--quiet", "--out", str(root / "run")]) == 0
    return base, root / "run"


def test_a_qlora_adapter_gives_pefts_logits_over_the_same_int4_weights(trained, tmp_path):
    base, run = trained
    val = [json.loads(line)["val_loss"] for line in (run / "metrics.jsonl").read_text().splitlines()
           if "val_loss" in line]
    assert val[-1] < val[0] - 0.3
    adapter = run / "checkpoints" / "step-000010"

    int4 = anatomy.load(base, weights="int4").eval()
    assert isinstance(int4.stack.blocks[0].attn.qkv, CompactLinear)
    anatomy.save(int4, tmp_path / "int4-as-floats")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "int4-as-floats", dtype=torch.float32).eval()
    ids = torch.tensor([[5, 9, 13, 2, 30, 7, 11, 4, 8, 21]])
    with torch.no_grad():
        plain = hf(ids).logits
        expected = peft.PeftModel.from_pretrained(hf, adapter).eval()(ids).logits
        ours = anatomy.apply_lora(int4, adapter)(ids)
    assert (expected - plain).abs().max() > 0.1
    assert (ours - expected).abs().max() < 1e-4


def test_the_engine_runs_the_adapter_over_its_planned_int4_kernels(trained):
    """The engine swaps each int4 base for its measured kernel (bf16 activations) and the LoRA product
    is added to it: its logits within the plan's error of the model's own, generate runs."""
    from anatomy.inference.engine import DecoderEngine
    from anatomy.kernels.planned_linear import PlannedLinear
    from anatomy.lora import lora_layers

    base, run = trained
    model = anatomy.apply_lora(anatomy.load(base, weights="int4").eval(), run / "checkpoints" / "step-000010")
    engine = DecoderEngine(model)
    layers = lora_layers(engine.model)
    assert len(layers) == 2 * 4 and all(isinstance(layer.base, PlannedLinear) for layer in layers.values())
    ids = torch.randint(0, 96, (3, 11))
    with torch.no_grad():
        ref, got = model(ids), engine.model(ids)
        plain = anatomy.load(base, weights="int4").eval()(ids)
    assert (got - ref).norm() / ref.norm() < 1e-2
    assert (ref - plain).norm() / ref.norm() > 0.05  # the adapter's share is far above that error
    assert len(anatomy.generate(model, [5, 9, 13, 2], max_new_tokens=4, temperature=0).token_ids) == 4
