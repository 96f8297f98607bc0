"""Hugging Face config.json <-> ModelConfig for the HF families anatomy reads and writes.

The LLaMA-like decoders (checkpoints/hf_decoders.py, one table entry each), GPT-2 (GPT2LMHeadModel),
BERT (BertModel, BertForMaskedLM, BertForSequenceClassification) and Marian (MarianMTModel).

Reading fills fields a config.json leaves out with the HF class's own defaults; a feature anatomy
does not implement (an unknown RoPE type, relative positions, ...) is a ConfigError, never
silently dropped. Writing picks the HF class from the fields (the first class in `WRITE_ORDER`
that can express the config) and refuses a config no class can express.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from anatomy.checkpoints.hf_decoders import ACTIVATIONS_IN as _ACTIVATIONS_IN
from anatomy.checkpoints.hf_decoders import ACTIVATIONS_OUT as _ACTIVATIONS_OUT
from anatomy.checkpoints.hf_decoders import FAMILIES, problems, read_decoder, token_ids, write_decoder
from anatomy.config import ModelConfig
from anatomy.errors import ConfigError

DECODERS = tuple(FAMILIES)
SUPPORTED = (*DECODERS, "gemma3", "gpt2", "bert", "marian")

# The HF layouts anatomy reads and writes, and the HF class of each: a layout is a model_type,
# except BERT's three (the base model, with its pooler, the masked-LM model and the classifier).
ARCHITECTURES = {**{family: spec.hf_class for family, spec in FAMILIES.items()}, "gpt2": "GPT2LMHeadModel",
                 "bert": "BertModel", "bert-mlm": "BertForMaskedLM", "bert-cls": "BertForSequenceClassification",
                 "marian": "MarianMTModel",
                 "gemma3": "Gemma3ForConditionalGeneration"}
# Layouts read for their language model only, and the layout that model is written as
LANGUAGE_MODEL_OF = {"gemma3": "gemma3_text"}
# Gemma3TextConfig's defaults for the sizes a Gemma 3 text_config may leave out
GEMMA3_TEXT_SIZES = dict(vocab_size=262208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                         num_attention_heads=8)
# The decoder classes a config is written as, first fit first: the plainest class that expresses it.
WRITE_ORDER = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gemma3_text", "smollm3", "mixtral",
               "qwen3_moe", "qwen2_moe", "gpt_oss", "deepseek_v2", "deepseek_v3", "gpt2")
MARIAN_NORM_EPS = 1e-5  # HF Marian uses nn.LayerNorm's default and has no config field for it


# -- reading ---------------------------------------------------------------------------------------
def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """The ModelConfig of an HF config.json dict of model_type llama, gpt2, bert or marian."""
    if not isinstance(hf, dict):
        raise ConfigError(f"an HF config must be a JSON object, got {type(hf).__name__}")
    model_type = hf.get("model_type")
    reader = _READERS.get(model_type)
    if reader is None:
        raise ConfigError(f"model_type={model_type!r} is not supported (supported: {', '.join(SUPPORTED)})")
    return reader(hf)


def _from_gpt2(hf: dict[str, Any]) -> ModelConfig:
    _require(hf, "gpt2", ("vocab_size", "n_embd", "n_layer", "n_head"))
    _refuse(hf, "gpt2", {"scale_attn_by_inverse_layer_idx": True, "scale_attn_weights": False,
                         "add_cross_attention": True})
    return ModelConfig(
        architecture="decoder", vocab_size=hf["vocab_size"], d_model=hf["n_embd"], n_layers=hf["n_layer"],
        n_heads=hf["n_head"], d_ff=hf.get("n_inner") or 4 * hf["n_embd"], norm="layernorm",
        norm_eps=hf.get("layer_norm_epsilon", 1e-5), norm_position="pre", ffn="mlp",
        activation=_activation(hf, "activation_function", "gelu_new"), position="learned",
        max_seq_len=hf.get("n_positions", 1024), qkv_bias=True, attn_out_bias=True, ffn_bias=True,
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)), dropout=hf.get("resid_pdrop", 0.1),
        **_token_ids(hf, ("pad_token_id", "bos_token_id", "eos_token_id")),
    )


def _from_bert(hf: dict[str, Any]) -> ModelConfig:
    _require(hf, "bert", ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                          "intermediate_size"))
    _refuse(hf, "bert", {"is_decoder": True, "add_cross_attention": True})
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise ConfigError(f"bert position_embedding_type={hf['position_embedding_type']!r} is not supported "
                          "(only 'absolute')")
    architectures = hf.get("architectures") or ["BertModel"]
    return ModelConfig(
        architecture="encoder", vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
        n_layers=hf["num_hidden_layers"], n_heads=hf["num_attention_heads"], d_ff=hf["intermediate_size"],
        norm="layernorm", norm_eps=hf.get("layer_norm_eps", 1e-12), norm_position="post", final_norm=False,
        embedding_norm=True, ffn="mlp", activation=_activation(hf, "hidden_act", "gelu"), position="learned",
        max_seq_len=hf.get("max_position_embeddings", 512), qkv_bias=True, attn_out_bias=True, ffn_bias=True,
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)), type_vocab_size=hf.get("type_vocab_size", 2),
        pooler="BertForMaskedLM" not in architectures, dropout=hf.get("hidden_dropout_prob", 0.1),
        n_labels=_labels(hf) if "BertForSequenceClassification" in architectures else 0,
        **_token_ids(hf, ("pad_token_id", "bos_token_id", "eos_token_id")),
    )


def _labels(hf: dict[str, Any]) -> int:
    """A classifier's labels: num_labels, else id2label's size, else HF's default of 2."""
    if "num_labels" in hf:
        return hf["num_labels"]
    labels = hf.get("id2label")
    return len(labels) if isinstance(labels, dict) and labels else 2


def _from_marian(hf: dict[str, Any]) -> ModelConfig:
    _require(hf, "marian", ("vocab_size", "d_model", "encoder_layers", "decoder_layers",
                            "encoder_attention_heads", "encoder_ffn_dim", "pad_token_id"))
    _same(hf, "encoder_attention_heads", "decoder_attention_heads")
    _same(hf, "encoder_ffn_dim", "decoder_ffn_dim")
    _same(hf, "vocab_size", "decoder_vocab_size")
    _refuse(hf, "marian", {"share_encoder_decoder_embeddings": False})
    ids = _token_ids(hf, ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"))
    if ids["decoder_start_token_id"] is None:
        ids["decoder_start_token_id"] = ids["pad_token_id"]
    return ModelConfig(
        architecture="encoder-decoder", vocab_size=hf["vocab_size"], d_model=hf["d_model"],
        n_layers=hf["encoder_layers"], n_decoder_layers=hf["decoder_layers"], n_heads=hf["encoder_attention_heads"],
        d_ff=hf["encoder_ffn_dim"], norm="layernorm", norm_eps=hf.get("layer_norm_eps", MARIAN_NORM_EPS),
        norm_position="post", final_norm=False, ffn="mlp", activation=_activation(hf, "activation_function", "gelu"),
        position="sinusoidal", max_seq_len=hf.get("max_position_embeddings", 1024), qkv_bias=True,
        attn_out_bias=True, ffn_bias=True, tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        embedding_scale=bool(hf.get("scale_embedding", False)), lm_head_bias=True, dropout=hf.get("dropout", 0.1),
        **ids,
    )


def _from_gemma3(hf: dict[str, Any]) -> ModelConfig:
    """Gemma3ForConditionalGeneration: its language model (text_config, a Gemma 3 text model); the
    vision tower and projector are not read."""
    text = hf.get("text_config")
    if not isinstance(text, dict):
        raise ConfigError(f"gemma3 text_config={text!r} must be an object (the language model's config)")
    tied = {"tie_word_embeddings": hf["tie_word_embeddings"]} if "tie_word_embeddings" in hf else {}
    return _decoder_reader("gemma3_text")({**GEMMA3_TEXT_SIZES, **tied, **text, "model_type": "gemma3_text"})


def _decoder_reader(family: str) -> Callable[[dict[str, Any]], ModelConfig]:
    def read(hf: dict[str, Any]) -> ModelConfig:
        try:
            return ModelConfig(**read_decoder(hf, family))
        except ConfigError as e:
            keys = [key for field, key in HF_KEYS.items() if str(e).startswith(f"{field}=") or f" {field}=" in str(e)]
            raise ConfigError(f"{e} (config.json: {', '.join(keys)})" if keys else str(e)) from None

    return read


# the config.json keys each ModelConfig field is read from, for error messages
HF_KEYS = {"vocab_size": "vocab_size", "d_model": "hidden_size", "n_layers": "num_hidden_layers",
           "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads", "head_dim": "head_dim",
           "d_ff": "intermediate_size", "n_experts": "num_local_experts / num_experts",
           "n_experts_per_token": "num_experts_per_tok", "d_ff_expert": "moe_intermediate_size",
           "d_ff_shared_expert": "shared_expert_intermediate_size", "sliding_window": "sliding_window",
           "rotary_dim": "partial_rotary_factor", "norm_eps": "rms_norm_eps", "rope_theta": "rope_theta",
           "max_seq_len": "max_position_embeddings", "attn_softcap": "attn_logit_softcapping",
           "logit_softcap": "final_logit_softcapping", "moe_layers": "mlp_only_layers / decoder_sparse_step",
           "router_aux_loss_coef": "router_aux_loss_coef"}


_READERS: dict[str, Callable[[dict[str, Any]], ModelConfig]] = {
    **{family: _decoder_reader(family) for family in DECODERS},
    "gpt2": _from_gpt2, "bert": _from_bert, "marian": _from_marian, "gemma3": _from_gemma3,
}


def _require(hf: dict[str, Any], model_type: str, names: tuple[str, ...]) -> None:
    missing = [name for name in names if hf.get(name) is None]
    if missing:
        raise ConfigError(f"{model_type} config lacks required field(s) {', '.join(missing)}")


def _refuse(hf: dict[str, Any], model_type: str, unsupported: dict[str, Any]) -> None:
    """Raise for a field set to a value whose behaviour anatomy does not implement."""
    for name, value in unsupported.items():
        if name in hf and hf[name] == value:
            raise ConfigError(f"{model_type} {name}={value!r} is not supported")


def _same(hf: dict[str, Any], name: str, other: str) -> None:
    """anatomy's encoder and decoder stacks share sizes: a field and its twin must agree."""
    if hf.get(other) is not None and hf[other] != hf[name]:
        raise ConfigError(f"marian {other}={hf[other]} differs from {name}={hf[name]} (anatomy needs them equal)")


def _activation(hf: dict[str, Any], name: str, default: str) -> str:
    value = hf.get(name, default)
    if value not in _ACTIVATIONS_IN:
        raise ConfigError(f"{name}={value!r} is not supported (supported: {', '.join(_ACTIVATIONS_IN)})")
    return _ACTIVATIONS_IN[value]


def _token_ids(hf: dict[str, Any], names: tuple[str, ...]) -> dict[str, int | None]:
    return token_ids(hf, hf.get, names)


# -- writing ---------------------------------------------------------------------------------------
def hf_family(config: ModelConfig) -> str:
    """The HF model_type a config is written as: decided by fields, never by a name. A decoder is
    written as the first class of WRITE_ORDER that can express it; when none can, the error lists
    what the closest one needs."""
    if config.is_seq2seq:
        return "marian"
    if config.is_encoder:
        return "bert"
    found = {family: _problems(config, family) for family in WRITE_ORDER}
    fits = [family for family, listed in found.items() if not listed]
    if fits:
        return fits[0]
    closest = min(WRITE_ORDER, key=lambda family: len(found[family]))
    raise ConfigError(f"no HF class can express this config; the closest, {ARCHITECTURES[closest]}, needs: "
                      f"{'; '.join(found[closest])}")


def hf_architecture(config: ModelConfig) -> str:
    return ARCHITECTURES[bert_layout(config, hf_family(config))]


def bert_layout(config: ModelConfig, family: str) -> str:
    """The layout of a config of `family`: BERT's by its head (classifier, pooler or masked-LM)."""
    if family != "bert":
        return family
    return "bert-cls" if config.n_labels else "bert" if config.pooler else "bert-mlm"


def layout_of(hf: dict[str, Any]) -> str:
    """The layout (key of ARCHITECTURES) of a config.json dict that config_from_hf accepted."""
    if hf["model_type"] == "bert":
        architectures = hf.get("architectures") or []
        if "BertForSequenceClassification" in architectures:
            return "bert-cls"
        return "bert-mlm" if "BertForMaskedLM" in architectures else "bert"
    return hf["model_type"]


def config_to_hf(config: ModelConfig, family: str | None = None) -> dict[str, Any]:
    """An HF config.json dict from which HF transformers builds the same model (with `architectures`),
    as `family` (a model_type; default: the one the fields choose)."""
    family = family or hf_family(config)
    _check_representable(config, family)
    architecture = ARCHITECTURES[bert_layout(config, family)]
    hf = {"model_type": family, "architectures": [architecture], **_WRITERS[family](config)}
    hf.update({name: getattr(config, name) for name in ("pad_token_id", "bos_token_id", "eos_token_id")})
    hf["tie_word_embeddings"] = config.tie_embeddings
    return hf


def _to_gpt2(c: ModelConfig) -> dict[str, Any]:
    return {
        "vocab_size": c.vocab_size, "n_embd": c.d_model, "n_layer": c.n_layers, "n_head": c.n_heads,
        "n_inner": c.d_ff, "activation_function": _ACTIVATIONS_OUT[c.activation], "n_positions": c.max_seq_len,
        "layer_norm_epsilon": c.norm_eps, "resid_pdrop": c.dropout, "embd_pdrop": c.dropout, "attn_pdrop": c.dropout,
    }


def _to_bert(c: ModelConfig) -> dict[str, Any]:
    return {
        "vocab_size": c.vocab_size, "hidden_size": c.d_model, "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads, "intermediate_size": c.d_ff, "hidden_act": _ACTIVATIONS_OUT[c.activation],
        "max_position_embeddings": c.max_seq_len, "type_vocab_size": c.type_vocab_size, "layer_norm_eps": c.norm_eps,
        "position_embedding_type": "absolute", "hidden_dropout_prob": c.dropout,
        "attention_probs_dropout_prob": c.dropout,
        **({"id2label": {str(i): f"LABEL_{i}" for i in range(c.n_labels)},
            "label2id": {f"LABEL_{i}": i for i in range(c.n_labels)}} if c.n_labels else {}),
    }


def _to_marian(c: ModelConfig) -> dict[str, Any]:
    hf = {
        "vocab_size": c.vocab_size, "decoder_vocab_size": c.vocab_size, "d_model": c.d_model,
        "encoder_layers": c.n_layers, "decoder_layers": c.n_decoder_layers, "encoder_attention_heads": c.n_heads,
        "decoder_attention_heads": c.n_heads, "encoder_ffn_dim": c.d_ff, "decoder_ffn_dim": c.d_ff,
        "activation_function": _ACTIVATIONS_OUT[c.activation], "max_position_embeddings": c.max_seq_len,
        "scale_embedding": c.embedding_scale, "share_encoder_decoder_embeddings": True, "dropout": c.dropout,
        "attention_dropout": 0.0, "activation_dropout": 0.0, "is_encoder_decoder": True,
        "decoder_start_token_id": c.decoder_start_token_id,
    }
    if not math.isclose(c.norm_eps, MARIAN_NORM_EPS):
        hf["layer_norm_eps"] = c.norm_eps  # read back by anatomy; HF Marian always uses 1e-5
    return hf


def _decoder_writer(family: str) -> Callable[[ModelConfig], dict[str, Any]]:
    return lambda config: write_decoder(config, family)


_WRITERS: dict[str, Callable[[ModelConfig], dict[str, Any]]] = {
    **{family: _decoder_writer(family) for family in DECODERS},
    "gpt2": _to_gpt2, "bert": _to_bert, "marian": _to_marian,
}

_COMMON_POST_LN = dict(norm="layernorm", norm_bias=True, norm_position="post", final_norm=False, ffn="mlp",
                       qkv_bias=True, attn_out_bias=True, ffn_bias=True)
# Field values each HF class hard-codes: a config with another value has no HF equivalent.
_NEW_PARTS_OFF = dict(sliding_window=None, qk_norm=False, norm_unit_offset=False, branch_output_norm=False,
                      attn_scale=None, attn_softcap=None, logit_softcap=None, rope_scaling=None, n_experts=0,
                      sliding_rope_theta=None, nope_layers=None, attn_sinks=False, router_bias=False,
                      swiglu_limit=None, kv_lora_rank=0)
_FIXED: dict[str, dict[str, Any]] = {
    "gpt2": dict(norm="layernorm", norm_bias=True, norm_position="pre", final_norm=True, embedding_norm=False,
                 ffn="mlp", position="learned", qkv_bias=True, attn_out_bias=True, ffn_bias=True,
                 lm_head_bias=False, embedding_scale=False, type_vocab_size=0),
    "bert": dict(_COMMON_POST_LN, embedding_norm=True, position="learned", lm_head_bias=False,
                 embedding_scale=False),
    "marian": dict(_COMMON_POST_LN, embedding_norm=False, position="sinusoidal", type_vocab_size=0),
}


def _problems(c: ModelConfig, family: str) -> list[str]:
    if family in FAMILIES:
        return problems(c, family) if c.is_decoder else [f"architecture={c.architecture!r} (needs 'decoder')"]
    found = [f"{name}={getattr(c, name)!r} (needs {value!r})"
             for name, value in {**_FIXED[family], **_NEW_PARTS_OFF}.items() if getattr(c, name) != value]
    if c.n_kv_heads != c.n_heads:
        found.append(f"n_kv_heads={c.n_kv_heads} (needs n_heads={c.n_heads})")
    if c.head_dim * c.n_heads != c.d_model:
        found.append(f"head_dim={c.head_dim} (needs d_model / n_heads)")
    if family == "bert" and c.type_vocab_size < 1:
        found.append("type_vocab_size=0 (BERT always has segment embeddings)")
    if family == "marian" and c.pad_token_id is None:
        found.append("pad_token_id=None (Marian needs a padding token)")
    return found


def _check_representable(c: ModelConfig, family: str) -> None:
    found = _problems(c, family)
    if found:
        arch = ARCHITECTURES[bert_layout(c, family)]
        raise ConfigError(f"HF {arch} cannot express this config: {'; '.join(found)}")
