"""The parameter ledger against the seed tables, the meta-device count and HF's count."""

from __future__ import annotations

import pytest
import torch

from anatomy.analysis.memory import weights_bytes
from anatomy.analysis.params import parameter_ledger
from anatomy.checkpoints.hf_config import config_to_hf
from anatomy.layers import Block
from anatomy.models import build_model
from anatomy.presets import get_preset, preset_names


def _by_name(ledger, *words):
    return sum(c.per_copy for c in ledger.components if c.layer and any(w in c.name for w in words))


def test_bert_base_layer_matches_seed_004():
    ledger = parameter_ledger(get_preset("bert-base"))
    assert ledger.per_layer() == 7_087_872
    assert _by_name(ledger, "attention Q/K/V", "attention output") == 2_362_368 == 4 * 768 ** 2 + 4 * 768
    assert _by_name(ledger, "FFN up") == 4_722_432
    assert _by_name(ledger, "norm") == 3_072
    assert ledger.total == 109_482_240  # BertModel, pooler included
    assert weights_bytes(ledger.total, "f32") == 437_928_960  # the seed's ~440 MB


@pytest.mark.parametrize("name, exact, approx_billions", [
    ("llama-7b", 6_738_415_616, 6.44), ("llama-13b", 13_015_864_320, 12.58), ("llama-70b", 68_976_648_192, 64.42),
    ("llama-3-8b", 8_030_261_248, None),
])
def test_llama_table_of_seed_000(name, exact, approx_billions):
    ledger = parameter_ledger(get_preset(name))
    assert ledger.total == exact
    if approx_billions is not None:
        assert round(ledger.approx_12ld2 / 1e9, 2) == approx_billions


@pytest.mark.parametrize("name", preset_names())
def test_ledger_equals_meta_device_count(name):
    config = get_preset(name)
    for head in ("auto", "mlm") if config.is_encoder else ("auto",):
        model = build_model(config, device="meta", head=head)
        ledger = parameter_ledger(config, head=head)
        assert ledger.total == sum(p.numel() for p in model.parameters())
        blocks = [m for m in model.modules() if isinstance(m, Block)]
        main = blocks[:config.n_layers]  # the main stack's (a seq2seq model's encoder comes first)
        assert ledger.per_layer() == sum(p.numel() for b in main for p in b.parameters()) // len(main)  # the mean
        if config.is_seq2seq:
            assert ledger.per_layer("decoder") == sum(p.numel() for p in blocks[-1].parameters())


@pytest.mark.parametrize("name", preset_names())
def test_difference_from_12ld2_is_fully_explained(name):
    ledger = parameter_ledger(get_preset(name))
    assert sum(ledger.explain_difference().values()) == ledger.total - ledger.approx_12ld2


def test_llama_7b_difference_causes():
    parts = parameter_ledger(get_preset("llama-7b")).explain_difference()
    assert parts["embedding"] == parts["head"] == 32000 * 4096  # untied head
    assert parts["norm"] == (2 * 32 + 1) * 4096
    assert parts["ffn_not_8D2"] == 32 * (3 * 4096 * 11008 - 8 * 4096 ** 2)  # d_ff = 11008, not 8D/3
    assert parts["bias"] == parts["attention_not_4D2"] == 0


def test_head_dim_decoupled_from_d_model_counts_head_dim():
    config = get_preset("llama-7b", d_model=256, n_heads=4, n_kv_heads=2, head_dim=96, d_ff=512, n_layers=2,
                        vocab_size=100, bos_token_id=None, eos_token_id=None)
    ledger = parameter_ledger(config)
    qkv = next(c for c in ledger.components if c.name == "attention Q/K/V")
    assert qkv.weights == 256 * (4 + 2 * 2) * 96
    assert ledger.total == sum(p.numel() for p in build_model(config, device="meta").parameters())


@pytest.mark.parametrize("name", ["llama-70b", "bert-base", "gpt2"])
def test_ledger_equals_hf_transformers_count(name):
    transformers = pytest.importorskip("transformers")
    config = get_preset(name)
    hf = config_to_hf(config)
    hf_config = transformers.AutoConfig.for_model(**hf)
    model_class = {"llama": transformers.LlamaForCausalLM, "gpt2": transformers.GPT2LMHeadModel,
                   "bert": transformers.BertModel}[hf["model_type"]]
    with torch.device("meta"):
        model = model_class(hf_config)
    assert parameter_ledger(config).total == sum(p.numel() for p in model.parameters())
