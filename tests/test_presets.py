"""Presets: parameter counts on the meta device equal HF transformers' for the same configs, and
the published figures."""

from __future__ import annotations

import pytest
import torch

import anatomy
from anatomy import build_model, get_preset, preset_names
from anatomy.checkpoints.hf_config import config_from_hf, config_to_hf
from anatomy.errors import ConfigError


def count(model: torch.nn.Module, *, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


# Published counts (HF model cards / the papers' own tables, exact where the source is exact).
@pytest.mark.parametrize("name, expected", [
    ("bert-base", 109_482_240),  # BertModel, bert-base-uncased
    ("gpt2", 124_439_808),  # GPT2LMHeadModel, "124M"
    ("llama-7b", 6_738_415_616),
    ("llama-2-7b", 6_738_415_616),
    ("llama-3-8b", 8_030_261_248),
    ("smollm2-135m", 134_515_008),
    ("llama-3.1-8b", 8_030_261_248),
    ("mistral-7b", 7_241_732_096),  # v0.1
    ("mixtral-8x7b", 46_702_792_704),  # "46.7B total"
    ("qwen2.5-7b", 7_615_616_512),
    ("qwen3-8b", 8_190_735_360),
    ("gemma-2-9b", 9_241_705_984),
    ("phi-3-mini", 3_821_079_552),
    ("gemma-3-270m", 268_098_176),
    ("gemma-3-1b", 999_885_952),  # KerasHub's gemma3_1b
    # the text model in HF's config (262,208 rows); KerasHub's gemma3_4b_text, 3,880,099,328, has 262,144
    ("gemma-3-4b", 3_880_099_328 + 64 * 2560),
    ("smollm3-3b", 3_075_098_624),
    ("gpt-oss-20b", 20_914_757_184),  # the model card's 20.9B, exactly
    ("gpt-oss-120b", 116_829_156_672),
    ("deepseek-v3", 671_026_419_200),  # "671B": the main model, its balancing biases included, no MTP module
    ("deepseek-v2-lite", 15_706_484_224),  # "15.7B"
])
def test_published_parameter_counts(name, expected):
    assert count(build_model(get_preset(name), device="meta")) == expected


@pytest.mark.parametrize("name, millions", [("transformer-base", 65), ("transformer-big", 213)])
def test_vaswani_table_3_within_rounding(name, millions):
    """Table 3 of Vaswani et al. gives 65M and 213M (shared 37k vocabulary): within 5%."""
    n = count(build_model(get_preset(name), device="meta"))
    assert abs(n / 1e6 - millions) / millions < 0.05


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_matches_hf_on_meta(name):
    """Through config_to_hf -> HF's config class -> HF's model built on the meta device. HF counts
    Marian's fixed sinusoid tables as (frozen) parameters, anatomy DeepSeek-V3's balancing bias (HF: a
    buffer): compare trainable ones."""
    transformers = pytest.importorskip("transformers")
    config = get_preset(name)
    hf = config_to_hf(config)
    values = {k: v for k, v in hf.items() if k != "model_type"}
    hf_config = transformers.AutoConfig.for_model(hf["model_type"], **values)
    with torch.device("meta"):
        hf_model = getattr(transformers, hf["architectures"][0])(hf_config)
    assert count(build_model(config, device="meta"), trainable_only=True) == count(hf_model, trainable_only=True)


def test_meta_build_allocates_and_patches_nothing():
    """Nothing of llama-70b is allocated or initialised on meta, and no process-wide function is
    swapped to skip the initialisation (the skip is a thread-local TorchFunctionMode)."""
    normal = torch.nn.init.normal_
    model = build_model(get_preset("llama-70b"), device="meta")
    assert all(p.is_meta for p in model.parameters()) and count(model) == 68_976_648_192
    assert torch.nn.init.normal_ is normal


def test_overrides_and_unknown_names():
    assert get_preset("gpt2", n_layers=2).n_layers == 2
    with pytest.raises(ConfigError, match="unknown preset 'llama-8b'; did you mean"):
        get_preset("llama-8b")
    with pytest.raises(ConfigError, match="n_heads=12 is not divisible by n_kv_heads=5"):
        get_preset("gpt2", n_kv_heads=5)
    with pytest.raises(ConfigError, match=r"unknown ModelConfig field\(s\) \['heads'\]"):
        get_preset("gpt2", heads=5)
    with pytest.raises(ConfigError, match="a preset name is a string, got int"):
        get_preset(7)


def test_presets_are_only_field_values():
    """A preset is data: its config alone (not its name) decides the HF class."""
    assert config_to_hf(get_preset("smollm2-135m"))["architectures"] == ["LlamaForCausalLM"]
    assert config_to_hf(get_preset("bert-base", pooler=False))["architectures"] == ["BertForMaskedLM"]
    assert config_from_hf(config_to_hf(get_preset("llama-70b"))) == get_preset("llama-70b")


def test_mixtral_active_parameters_are_12_9b():
    """Mixtral 8x7B: 46.7B parameters stored, 12.9B used per token (2 of 8 experts in every layer)."""
    from anatomy.analysis.params import parameter_ledger

    ledger = parameter_ledger(get_preset("mixtral-8x7b"))
    assert ledger.total == 46_702_792_704 and ledger.active == 12_879_925_248
    expert = 3 * 4096 * 14336
    assert ledger.total - ledger.active == 32 * 6 * expert
