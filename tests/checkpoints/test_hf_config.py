"""HF config.json <-> ModelConfig, checked against the dicts HF's own config classes write."""

from __future__ import annotations

import pytest

from anatomy import ModelConfig, get_preset
from anatomy.errors import ConfigError
from anatomy.checkpoints.hf_config import config_from_hf, config_to_hf

transformers = pytest.importorskip("transformers")


def hf_dict(model_type: str, **values) -> dict:
    """The config.json HF itself writes for these values (defaults filled in by HF)."""
    return transformers.AutoConfig.for_model(model_type, **values).to_dict()


def test_llama_from_hf():
    c = config_from_hf(hf_dict("llama", vocab_size=1000, hidden_size=128, num_hidden_layers=3, num_attention_heads=8,
                               num_key_value_heads=2, intermediate_size=344, rope_theta=500000.0, rms_norm_eps=1e-5,
                               tie_word_embeddings=True, max_position_embeddings=4096))
    assert (c.architecture, c.d_model, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.d_ff) == \
        ("decoder", 128, 3, 8, 2, 16, 344)
    assert (c.norm, c.ffn, c.activation, c.position, c.rope_theta, c.norm_eps) == \
        ("rmsnorm", "glu", "silu", "rope", 500000.0, 1e-5)
    assert c.tie_embeddings and not c.qkv_bias and c.max_seq_len == 4096
    assert (c.bos_token_id, c.eos_token_id) == (1, 2)


def test_llama_legacy_rope_theta_and_eos_list():
    hf = {"model_type": "llama", "vocab_size": 200, "hidden_size": 64, "num_hidden_layers": 1,
          "num_attention_heads": 4, "intermediate_size": 96, "rope_theta": 1e6, "eos_token_id": [5, 7]}
    c = config_from_hf(hf)
    assert c.rope_theta == 1e6 and c.eos_token_id == 5 and c.n_kv_heads == 4


def test_gpt2_from_hf_defaults():
    c = config_from_hf(hf_dict("gpt2"))
    assert c == get_preset("gpt2", dropout=0.1)
    assert c.d_ff == 4 * 768 and c.activation == "gelu_tanh"


def test_bert_from_hf_is_bert_base():
    assert config_from_hf(hf_dict("bert", architectures=["BertModel"])) == get_preset("bert-base")
    mlm = config_from_hf(hf_dict("bert", architectures=["BertForMaskedLM"]))
    assert not mlm.pooler


def test_marian_from_hf():
    c = config_from_hf(hf_dict("marian", vocab_size=500, d_model=64, encoder_layers=2, decoder_layers=3,
                               encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=96,
                               decoder_ffn_dim=96, pad_token_id=499, decoder_start_token_id=499, eos_token_id=0,
                               scale_embedding=True, activation_function="swish", max_position_embeddings=64))
    assert (c.architecture, c.n_layers, c.n_decoder_layers, c.norm_position, c.position) == \
        ("encoder-decoder", 2, 3, "post", "sinusoidal")
    assert c.activation == "silu" and c.embedding_scale and c.lm_head_bias and not c.final_norm
    assert (c.pad_token_id, c.decoder_start_token_id, c.eos_token_id, c.norm_eps) == (499, 499, 0, 1e-5)


@pytest.mark.parametrize("name", ["llama-3-8b", "smollm2-135m", "gpt2-xl", "bert-large", "transformer-big"])
def test_round_trip_through_hf_config_class(name):
    """ours -> config.json -> HF's config class -> its config.json -> ours gives the same config
    (Marian always has its logits bias: lm_head_bias comes back True)."""
    config = get_preset(name)
    hf = config_to_hf(config)
    via_hf = hf_dict(hf["model_type"], **{k: v for k, v in hf.items() if k != "model_type"})
    expected = config.replace(lm_head_bias=True) if config.is_seq2seq else config
    assert config_from_hf(via_hf) == expected


@pytest.mark.parametrize("config, architecture", [
    (get_preset("llama-7b"), "LlamaForCausalLM"),
    (get_preset("gpt2"), "GPT2LMHeadModel"),
    (get_preset("bert-base"), "BertModel"),
    (get_preset("bert-base", pooler=False), "BertForMaskedLM"),
    (get_preset("transformer-base"), "MarianMTModel"),
])
def test_architectures_are_chosen_by_fields(config, architecture):
    assert config_to_hf(config)["architectures"] == [architecture]


def test_unsupported_model_type_lists_the_supported():
    with pytest.raises(ConfigError, match=r"model_type='t5' is not supported \(supported: llama, mistral, mixtral, "
                                          r"qwen2, qwen3, qwen2_moe, qwen3_moe, gemma, gemma2, gemma3_text, smollm3, "
                                          r"gpt_oss, deepseek_v2, deepseek_v3, phi3, gemma3, gpt2, bert, marian\)"):
        config_from_hf({"model_type": "t5"})
    with pytest.raises(ConfigError, match="model_type=None is not supported"):
        config_from_hf({"vocab_size": 5})


def test_missing_fields_are_listed():
    with pytest.raises(ConfigError, match="llama config lacks required field.s. hidden_size, intermediate_size"):
        config_from_hf({"model_type": "llama", "vocab_size": 10, "num_hidden_layers": 1, "num_attention_heads": 1})


@pytest.mark.parametrize("hf, message", [
    ({"rope_scaling": {"rope_type": "ntk", "factor": 8.0}}, "rope_type='ntk' is not supported"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_type='llama3'.* lacks 'low_freq_factor'"),
    ({"hidden_act": "relu2"}, "hidden_act='relu2' is not supported"),
])
def test_unsupported_llama_features(hf, message):
    base = {"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 2, "intermediate_size": 16}
    with pytest.raises(ConfigError, match=message):
        config_from_hf({**base, **hf})


def test_unsupported_bert_and_marian_features():
    with pytest.raises(ConfigError, match="position_embedding_type='relative_key' is not supported"):
        config_from_hf(hf_dict("bert", position_embedding_type="relative_key"))
    with pytest.raises(ConfigError, match="decoder_ffn_dim=128 differs from encoder_ffn_dim=96"):
        config_from_hf(hf_dict("marian", encoder_ffn_dim=96, decoder_ffn_dim=128))
    with pytest.raises(ConfigError, match="scale_attn_by_inverse_layer_idx=True is not supported"):
        config_from_hf(hf_dict("gpt2", scale_attn_by_inverse_layer_idx=True))


def test_config_hf_cannot_express_is_refused():
    alibi = get_preset("gpt2", position="alibi")
    expected = r"no HF class can express this config; the closest, GPT2LMHeadModel, needs: position='alibi' \(needs 'learned'\)"
    with pytest.raises(ConfigError, match=expected):
        config_to_hf(alibi)
    with pytest.raises(ConfigError, match=r"LlamaForCausalLM, needs: norm='layernorm' \(needs 'rmsnorm'\)"):
        config_to_hf(get_preset("llama-7b", norm="layernorm"))
    with pytest.raises(ConfigError, match=r"BertModel .* norm_position='pre' \(needs 'post'\)"):
        config_to_hf(get_preset("bert-base", norm_position="pre"))


def test_out_of_vocabulary_special_ids_are_dropped():
    """HF only warns about them (its GPT-2 default bos 50256 with a small vocabulary)."""
    c = config_from_hf(hf_dict("gpt2", vocab_size=100))
    assert c.bos_token_id is None and c.eos_token_id is None
