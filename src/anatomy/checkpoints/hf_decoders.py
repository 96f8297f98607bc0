"""HF config.json <-> ModelConfig for the LLaMA-like decoder families HF transformers has classes for:
llama, mistral, mixtral, qwen2, qwen3, qwen2_moe, qwen3_moe, gemma, gemma2, gemma3_text, smollm3,
phi3, gpt_oss, deepseek_v2 and deepseek_v3 (what each adds: docs/foundation.md, "ModelConfig").

Every family is one table entry (`FAMILIES`): the keys it reads and writes and the field values its
class hard-codes. A key a config.json leaves out takes the HF class's own default (`defaults`).
A value anatomy does not implement is a ConfigError naming it, never dropped; a config a class
cannot express is a ConfigError listing each field and what the class needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from anatomy.config import ModelConfig, RopeScaling
from anatomy.errors import ConfigError
from anatomy.layers.rope_scaling import longrope_attention_factor, yarn_attention_factor, yarn_mscale

# HF activation names -> ours. gelu_new and gelu_pytorch_tanh are the same tanh approximation.
ACTIVATIONS_IN = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                  "relu": "relu", "silu": "silu", "swish": "silu"}
ACTIVATIONS_OUT = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}


@dataclass(frozen=True)
class Family:
    """One HF decoder class: its defaults, what it can vary, what it fixes.

    bias     "flag": one attention_bias for q, k, v and o; "qkv": q/k/v always, o never;
             "qkv_flag": q/k/v by qkv_bias, o never; "none": no attention biases; "experts": attention_bias
             for q, k, v and o, and biases on every expert's projections (gpt-oss)
    windows  "none", "all" (config.sliding_window applies to every layer), "layer_types" (per layer)
    moe      "", "mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss", "deepseek_v2" or "deepseek_v3"
    rope     "one": one rope_parameters for every layer; "per_type": one per layer type (Gemma 3:
             full_attention, sliding_attention); "nope": one, and no_rope_layers (SmolLM3)
    """

    hf_class: str
    defaults: dict[str, Any]
    fixed: dict[str, Any] = field(default_factory=dict)
    bias: str = "flag"
    windows: str = "none"
    moe: str = ""
    act_key: str = "hidden_act"
    partial_rotary: bool = False
    rope: str = "one"


def _merged(*bases: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """The bases' items, later ones (and then `changes`) overriding earlier ones."""
    out: dict[str, Any] = {}
    for base in bases:
        out.update(base)
    return {**out, **changes}


_BASE = dict(rms_norm_eps=1e-6, max_position_embeddings=2048, tie_word_embeddings=False, hidden_act="silu",
             rope_theta=10000.0, head_dim=None, bos_token_id=None, eos_token_id=None, pad_token_id=None,
             num_key_value_heads=None, attention_dropout=0.0)
_QWEN = _merged(_BASE, max_position_embeddings=32768, use_sliding_window=False, sliding_window=4096,
             max_window_layers=28)
_GEMMA = _merged(_BASE, max_position_embeddings=8192, tie_word_embeddings=True, hidden_act="gelu_pytorch_tanh",
              head_dim=256, bos_token_id=2, eos_token_id=1, pad_token_id=0)
_QWEN_MOE = dict(decoder_sparse_step=1, norm_topk_prob=False, router_aux_loss_coef=0.001, mlp_only_layers=[])
_DEEPSEEK = _merged(_BASE, bos_token_id=0, eos_token_id=1, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64,
                   qk_nope_head_dim=128, v_head_dim=128, routed_scaling_factor=1.0, norm_topk_prob=False,
                   num_experts_per_tok=None, n_group=None, topk_group=None, attention_bias=False)
GPT_OSS_ROPE = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": 4096}  # the class's default

FAMILIES: dict[str, Family] = {
    "llama": Family("LlamaForCausalLM", _merged(_BASE, bos_token_id=1, eos_token_id=2)),
    "mistral": Family("MistralForCausalLM", _merged(_BASE, max_position_embeddings=131072, bos_token_id=1,
                                                 eos_token_id=2, num_key_value_heads=8, sliding_window=4096),
                      bias="none", windows="all"),
    "mixtral": Family("MixtralForCausalLM", _merged(_BASE, rms_norm_eps=1e-5, max_position_embeddings=131072,
                                                 rope_theta=1e6, bos_token_id=1, eos_token_id=2,
                                                 num_key_value_heads=8, sliding_window=None, num_local_experts=8,
                                                 num_experts_per_tok=2, router_aux_loss_coef=0.001,
                                                 router_jitter_noise=0.0),
                      bias="none", windows="all", moe="mixtral"),
    "qwen2": Family("Qwen2ForCausalLM", _merged(_QWEN, num_key_value_heads=32), bias="qkv", windows="layer_types"),
    "qwen3": Family("Qwen3ForCausalLM", _merged(_QWEN, num_key_value_heads=32, head_dim=128, attention_bias=False),
                    fixed={"qk_norm": True}, windows="layer_types"),
    "qwen2_moe": Family("Qwen2MoeForCausalLM", _merged(_QWEN, _QWEN_MOE, num_key_value_heads=16, num_experts=60,
                                                    num_experts_per_tok=4, moe_intermediate_size=1408,
                                                    shared_expert_intermediate_size=5632, qkv_bias=True),
                        bias="qkv_flag", windows="layer_types", moe="qwen2_moe"),
    "qwen3_moe": Family("Qwen3MoeForCausalLM", _merged(_QWEN, _QWEN_MOE, num_key_value_heads=4, head_dim=None,
                                                    attention_bias=False, num_experts=128, num_experts_per_tok=8,
                                                    moe_intermediate_size=768),
                        fixed={"qk_norm": True}, windows="all", moe="qwen3_moe"),
    "gemma": Family("GemmaForCausalLM", _merged(_GEMMA, num_key_value_heads=16),
                    fixed={"norm_unit_offset": True, "embedding_scale": True}),
    "gemma2": Family("Gemma2ForCausalLM", _merged(_GEMMA, num_key_value_heads=4, hidden_activation="gelu_pytorch_tanh",
                                               sliding_window=4096, query_pre_attn_scalar=256,
                                               final_logit_softcapping=30.0, attn_logit_softcapping=50.0),
                     fixed={"norm_unit_offset": True, "embedding_scale": True, "branch_output_norm": True},
                     windows="layer_types", act_key="hidden_activation"),
    "gemma3_text": Family("Gemma3ForCausalLM", _merged(_GEMMA, num_key_value_heads=4, max_position_embeddings=131072,
                                                    hidden_activation="gelu_pytorch_tanh", sliding_window=4096,
                                                    query_pre_attn_scalar=256, final_logit_softcapping=None,
                                                    attn_logit_softcapping=None, rope_theta=1e6,
                                                    rope_local_base_freq=10000.0, sliding_window_pattern=6),
                          fixed={"norm_unit_offset": True, "embedding_scale": True, "branch_output_norm": True,
                                 "qk_norm": True},
                          windows="layer_types", act_key="hidden_activation", rope="per_type"),
    "smollm3": Family("SmolLM3ForCausalLM", _merged(_BASE, max_position_embeddings=32768, tie_word_embeddings=True,
                                                 rope_theta=2e6, bos_token_id=128000, eos_token_id=128001,
                                                 pad_token_id=128004, num_key_value_heads=4, use_sliding_window=False,
                                                 sliding_window=None, no_rope_layer_interval=4),
                      windows="layer_types", rope="nope"),
    "gpt_oss": Family("GptOssForCausalLM", _merged(_BASE, rms_norm_eps=1e-5, max_position_embeddings=131072,
                                                 rope_theta=150000.0, num_key_value_heads=8, head_dim=64,
                                                 sliding_window=128, num_local_experts=128, num_experts_per_tok=4,
                                                 swiglu_alpha=1.702, swiglu_limit=7.0, router_aux_loss_coef=0.001,
                                                 attention_bias=True, rope_parameters=GPT_OSS_ROPE),
                      fixed={"attn_sinks": True, "router_bias": True}, bias="experts", windows="layer_types",
                      moe="gpt_oss"),
    "deepseek_v2": Family("DeepseekV2ForCausalLM", _merged(_DEEPSEEK, max_position_embeddings=2048, vocab_size=102400,
                                                         n_routed_experts=64, n_shared_experts=2, topk_method="greedy",
                                                         moe_intermediate_size=1407, first_k_dense_replace=0),
                          bias="flag", moe="deepseek_v2"),
    "deepseek_v3": Family("DeepseekV3ForCausalLM", _merged(_DEEPSEEK, max_position_embeddings=4096, vocab_size=129280,
                                                         n_routed_experts=256, n_shared_experts=1, n_group=8,
                                                         topk_group=4, num_experts_per_tok=8, norm_topk_prob=True,
                                                         routed_scaling_factor=2.5, moe_intermediate_size=2048,
                                                         first_k_dense_replace=3, rope_interleave=True),
                          bias="flag", moe="deepseek_v3"),
    "phi3": Family("Phi3ForCausalLM", _merged(_BASE, rms_norm_eps=1e-5, max_position_embeddings=4096, bos_token_id=1,
                                           eos_token_id=32000, pad_token_id=32000, sliding_window=None,
                                           original_max_position_embeddings=4096),
                   bias="none", windows="all", partial_rotary=True),
}
MLP_BIAS = ("llama", "smollm3")  # the classes whose mlp_bias puts biases on the FFN's projections
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope")


def defaults(family: str) -> dict[str, Any]:
    return FAMILIES[family].defaults


# -- reading ---------------------------------------------------------------------------------------
def read_decoder(hf: dict[str, Any], family: str) -> dict[str, Any]:
    """The ModelConfig field values of an HF config.json of one of the FAMILIES."""
    spec = FAMILIES[family]
    get = _getter(hf, spec.defaults)
    _require(hf, family, ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                          "intermediate_size"))
    if get("use_bidirectional_attention"):
        raise ConfigError(f"{family} use_bidirectional_attention=True is not supported (anatomy's decoders are causal)")
    n_heads = hf["num_attention_heads"]
    head_dim = get("head_dim") or hf["hidden_size"] // n_heads
    theta, scaling, rotary_dim = read_rope(hf, family, head_dim, _main_rope(hf, spec))
    values = dict(
        architecture="decoder", vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
        n_layers=hf["num_hidden_layers"], n_heads=n_heads, n_kv_heads=get("num_key_value_heads") or n_heads,
        head_dim=get("head_dim"), d_ff=hf["intermediate_size"], norm="rmsnorm", norm_eps=get("rms_norm_eps"),
        norm_position="pre", ffn="glu", activation=_activation(hf, family), position="rope",
        max_seq_len=get("max_position_embeddings"), rope_theta=theta, rope_scaling=scaling, rotary_dim=rotary_dim,
        tie_embeddings=bool(get("tie_word_embeddings")), dropout=get("attention_dropout") or 0.0,
        **spec.fixed, **_biases(get, spec, family), **_windows(hf, get, spec, family),
        **token_ids(hf, get, ("pad_token_id", "bos_token_id", "eos_token_id")),
    )
    if family in ("gemma2", "gemma3_text"):
        values.update(attn_scale=get("query_pre_attn_scalar") ** -0.5, attn_softcap=get("attn_logit_softcapping"),
                      logit_softcap=get("final_logit_softcapping"))
    if spec.rope == "per_type" and values.get("sliding_window") is not None:
        sliding_theta, sliding_scaling, _ = read_rope(hf, family, head_dim, _sliding_rope(hf, spec))
        if (sliding_theta, sliding_scaling) != (theta, scaling):
            values.update(sliding_rope_theta=sliding_theta, sliding_rope_scaling=sliding_scaling)
    if spec.rope == "nope":
        values["nope_layers"] = _nope_layers(hf, get, family)
    if spec.moe.startswith("deepseek"):
        values.update(_latent(hf, get, family))
    if spec.moe:
        values.update(_moe(hf, get, spec, family))
    return values


def _main_rope(hf: dict[str, Any], spec: Family) -> dict[str, Any] | None:
    """The RoPE parameters of the (full-attention) layers; None: read_rope's own lookup."""
    if spec.rope != "per_type":
        return None
    params = hf.get("rope_parameters") or {}
    if isinstance(params, dict) and "full_attention" in params:
        return params["full_attention"]
    legacy = dict(hf.get("rope_scaling") or {})  # transformers 4.x: rope_theta and rope_scaling for the global layers
    return {"rope_theta": hf.get("rope_theta", spec.defaults["rope_theta"]), **legacy}


def _sliding_rope(hf: dict[str, Any], spec: Family) -> dict[str, Any]:
    """The RoPE parameters of the sliding-window layers (Gemma 3: their own base, unscaled in 4.x configs)."""
    params = hf.get("rope_parameters") or {}
    if isinstance(params, dict) and "sliding_attention" in params:
        return params["sliding_attention"]
    return {"rope_type": "default", "rope_theta": hf.get("rope_local_base_freq", spec.defaults["rope_local_base_freq"])}


def _nope_layers(hf: dict[str, Any], get, family: str) -> tuple[int, ...] | None:
    """The layers no_rope_layers marks 0 (SmolLM3: 1 rotates, 0 does not), by default every interval-th."""
    n = hf["num_hidden_layers"]
    flags = hf.get("no_rope_layers")
    if flags is None:
        interval = get("no_rope_layer_interval")
        if isinstance(interval, bool) or not isinstance(interval, int) or interval <= 0:
            raise ConfigError(f"{family} no_rope_layer_interval={interval!r} must be a positive integer")
        flags = [int((i + 1) % interval != 0) for i in range(n)]
    if not isinstance(flags, list) or len(flags) != n or any(f not in (0, 1) or isinstance(f, float) for f in flags):
        raise ConfigError(f"{family} no_rope_layers={flags!r} must list 1 (RoPE) or 0 (none) for each of the {n} layers")
    nope = tuple(i for i, f in enumerate(flags) if not f)
    return nope or None


def _latent(hf: dict[str, Any], get, family: str) -> dict[str, Any]:
    """DeepSeek's latent attention: heads of qk_nope + qk_rope dims (RoPE on the last, pairs interleaved),
    every head its own keys; YaRN's mscale_all_dim also scales the scores (HF's yarn_apply_mscale)."""
    nope, rope = get("qk_nope_head_dim"), get("qk_rope_head_dim")
    scale = (nope + rope) ** -0.5
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if params.get("rope_type", params.get("type", "default")) != "default" and params.get("mscale_all_dim"):
        scale *= yarn_mscale(params["factor"], params["mscale_all_dim"]) ** 2
    return dict(head_dim=nope + rope, rotary_dim=rope, n_kv_heads=hf["num_attention_heads"],
                kv_lora_rank=get("kv_lora_rank"), q_lora_rank=get("q_lora_rank") or 0, v_head_dim=get("v_head_dim"),
                rope_interleaved=family == "deepseek_v2" or bool(get("rope_interleave")), attn_scale=scale)


def _getter(hf: dict[str, Any], family_defaults: dict[str, Any]):
    """A key's value in the file, else the HF class's default (an explicit null stays None)."""
    return lambda key: hf[key] if key in hf else family_defaults.get(key)


def _require(hf: dict[str, Any], family: str, names: tuple[str, ...]) -> None:
    missing = [name for name in names if hf.get(name) is None]
    if missing:
        raise ConfigError(f"{family} config lacks required field(s) {', '.join(missing)}")


def _activation(hf: dict[str, Any], family: str) -> str:
    key = FAMILIES[family].act_key
    value = hf.get(key, defaults(family)[key])
    if family in ("gemma", "gemma2", "gemma3_text") and value == "gelu":
        value = "gelu_pytorch_tanh"  # HF Gemma reads the legacy "gelu" as the tanh approximation
    if value not in ACTIVATIONS_IN:
        raise ConfigError(f"{key}={value!r} is not supported (supported: {', '.join(ACTIVATIONS_IN)})")
    return ACTIVATIONS_IN[value]


def _biases(get, spec: Family, family: str) -> dict[str, bool]:
    if spec.bias == "none":
        return dict(qkv_bias=False, attn_out_bias=False, ffn_bias=False)
    if spec.bias == "qkv":
        return dict(qkv_bias=True, attn_out_bias=False, ffn_bias=False)
    if spec.bias == "qkv_flag":
        return dict(qkv_bias=bool(get("qkv_bias")), attn_out_bias=False, ffn_bias=False)
    bias = bool(get("attention_bias"))
    if spec.bias == "experts":
        return dict(qkv_bias=bias, attn_out_bias=bias, ffn_bias=True)
    return dict(qkv_bias=bias, attn_out_bias=bias, ffn_bias=bool(get("mlp_bias")) if family in MLP_BIAS else False)


def _windows(hf: dict[str, Any], get, spec: Family, family: str) -> dict[str, Any]:
    """sliding_window and the layers that use it: every layer, or the ones layer_types names."""
    if spec.windows == "none":
        return {}
    if spec.windows == "all":
        window = get("sliding_window")
        if family == "qwen3_moe" and not get("use_sliding_window"):
            window = None
        return dict(sliding_window=_window_size(window, family))
    types = hf.get("layer_types") or _default_layer_types(hf, get, family)
    if not isinstance(types, list) or len(types) != hf["num_hidden_layers"]:
        raise ConfigError(f"{family} layer_types must list one type per layer ({hf['num_hidden_layers']})")
    unknown = sorted({t for t in types if t not in ("full_attention", "sliding_attention")})
    if unknown:
        raise ConfigError(f"{family} layer_types {unknown} are not supported "
                          "(supported: 'full_attention', 'sliding_attention')")
    sliding = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    if not sliding:
        return {}
    window = get("sliding_window")
    if family in ("qwen2", "qwen3", "qwen2_moe") and not get("use_sliding_window"):
        raise ConfigError(f"{family} layer_types has sliding layers but use_sliding_window=False (HF then "
                          "drops the window size): ambiguous")
    if family == "smollm3" and not get("use_sliding_window"):
        return {}  # SmolLM3 slides a layer only when use_sliding_window is set
    window = _window_size(window, family)
    if window is None:
        raise ConfigError(f"{family} layer_types has sliding layers but sliding_window is null")
    return dict(sliding_window=window, sliding_window_layers=None if len(sliding) == len(types) else sliding)


def _window_size(value: Any, family: str) -> int | None:
    if value is None or value == 0:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{family} sliding_window={value!r} must be a positive integer or null")
    return value


def _default_layer_types(hf: dict[str, Any], get, family: str) -> list[str]:
    """What the HF class computes when config.json has no layer_types."""
    n_layers = hf["num_hidden_layers"]
    if family == "gemma2":
        return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n_layers)]
    if family == "gpt_oss":
        return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n_layers)]
    if family == "gemma3_text":
        pattern = get("sliding_window_pattern")
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n_layers)]
    if family == "smollm3":  # the NoPE layers slide, when use_sliding_window and a window are set
        nope = _nope_layers(hf, get, family) or ()
        return ["sliding_attention" if i in nope and get("sliding_window") else "full_attention"
                for i in range(n_layers)]
    if not get("use_sliding_window") or not get("sliding_window"):
        return ["full_attention"] * n_layers
    if family == "qwen2_moe":
        return ["sliding_attention" if i % 2 == 0 and i < get("max_window_layers") else "full_attention"
                for i in range(n_layers)]
    return ["sliding_attention" if i >= get("max_window_layers") else "full_attention" for i in range(n_layers)]


def _moe(hf: dict[str, Any], get, spec: Family, family: str) -> dict[str, Any]:
    if spec.moe.startswith("deepseek"):
        return _deepseek_moe(hf, get, spec)
    if spec.moe == "gpt_oss":  # softmax over the top-k logits: the renormalised top-k of the softmax
        return dict(n_experts=get("num_local_experts"), n_experts_per_token=get("num_experts_per_tok"),
                    d_ff_expert=hf["intermediate_size"], moe_renormalize=True,
                    router_aux_loss_coef=get("router_aux_loss_coef"), swiglu_limit=get("swiglu_limit"),
                    swiglu_alpha=get("swiglu_alpha"))
    if spec.moe == "mixtral":
        if get("router_jitter_noise"):
            raise ConfigError(f"mixtral router_jitter_noise={get('router_jitter_noise')} is not supported "
                              "(anatomy's router adds no noise)")
        return dict(n_experts=get("num_local_experts"), n_experts_per_token=get("num_experts_per_tok"),
                    moe_renormalize=True, router_aux_loss_coef=get("router_aux_loss_coef"))
    n_experts = hf.get("num_experts", hf.get("num_local_experts", get("num_experts")))  # 5.x: an alias pair
    if not n_experts:
        return {}
    step, dense = get("decoder_sparse_step"), get("mlp_only_layers") or []
    if isinstance(step, bool) or not isinstance(step, int) or step <= 0:
        raise ConfigError(f"{family} decoder_sparse_step={step!r} must be a positive integer")
    layers = [i for i in range(hf["num_hidden_layers"]) if i not in dense and (i + 1) % step == 0]
    values = dict(n_experts=n_experts, n_experts_per_token=get("num_experts_per_tok"),
                  d_ff_expert=get("moe_intermediate_size"), moe_renormalize=bool(get("norm_topk_prob")),
                  moe_layers=None if len(layers) == hf["num_hidden_layers"] else tuple(layers),
                  router_aux_loss_coef=get("router_aux_loss_coef"))
    if spec.moe == "qwen2_moe":
        shared = get("shared_expert_intermediate_size")
        if not shared:
            raise ConfigError(f"qwen2_moe shared_expert_intermediate_size={shared!r}: the gated shared expert "
                              "needs a width > 0")
        values.update(d_ff_shared_expert=shared, shared_expert_gate=True)
    return values


def _deepseek_moe(hf: dict[str, Any], get, spec: Family) -> dict[str, Any]:
    """Routed experts after the first first_k_dense_replace (dense) layers, n_shared_experts always on."""
    n_layers, dense = hf["num_hidden_layers"], get("first_k_dense_replace") or 0
    values = dict(n_experts=get("n_routed_experts"), n_experts_per_token=get("num_experts_per_tok"),
                  d_ff_expert=get("moe_intermediate_size"),
                  d_ff_shared_expert=(get("n_shared_experts") or 0) * get("moe_intermediate_size"),
                  moe_layers=None if not dense else tuple(range(dense, n_layers)),
                  routed_scaling=float(get("routed_scaling_factor")))
    if spec.moe == "deepseek_v2":  # softmax, greedy top-k, never renormalised (HF's DeepseekV2TopkRouter)
        if get("topk_method") != "greedy":
            raise ConfigError(f"deepseek_v2 topk_method={get('topk_method')!r} is not supported (supported: "
                              "'greedy')")
        return values | dict(moe_renormalize=False)
    groups = get("n_group") or 1
    return values | dict(moe_renormalize=bool(get("norm_topk_prob")), router_scoring="sigmoid", router_groups=groups,
                         router_topk_groups=get("topk_group") or 1, router_score_bias=True)


def read_rope(hf: dict[str, Any], family: str, head_dim: int,
              params: dict[str, Any] | None = None) -> tuple[float, RopeScaling | None, int]:
    """(rope_theta, scaling, rotary dims) from rope_parameters (transformers 5) or rope_theta +
    rope_scaling (4.x), or from `params` (one layer type's); partial_rotary_factor where the class reads it."""
    if params is None:
        params = hf.get("rope_parameters") or hf.get("rope_scaling") or defaults(family).get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise ConfigError(f"{family} rope_parameters={params!r} must be an object")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "su":
        rope_type = "longrope"  # the name older Phi-3 configs use
    if rope_type not in ROPE_TYPES:
        raise ConfigError(f"{family} rope_parameters.rope_type={rope_type!r} is not supported "
                          f"(supported: {', '.join(ROPE_TYPES)})")
    theta = float(params.get("rope_theta", hf.get("rope_theta", defaults(family)["rope_theta"])))
    factor = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if factor != 1.0 and not FAMILIES[family].partial_rotary:
        raise ConfigError(f"{family} partial_rotary_factor={factor} is not supported by HF "
                          f"{FAMILIES[family].hf_class} (it rotates all head dims)")
    rotary_dim = int(head_dim * factor)
    if rope_type == "default":
        return theta, None, rotary_dim
    return theta, _scaling(hf, params, rope_type, family), rotary_dim


def _scaling(hf: dict[str, Any], p: dict[str, Any], kind: str, family: str) -> RopeScaling:
    """The RopeScaling with the values HF transformers computes from these parameters."""
    max_pos = hf.get("max_position_embeddings", defaults(family)["max_position_embeddings"])
    orig = hf.get("original_max_position_embeddings") if family == "phi3" else None
    orig = orig or p.get("original_max_position_embeddings") or max_pos
    try:
        if kind == "linear":
            return RopeScaling(kind=kind, factor=p["factor"])
        if kind == "dynamic":  # HF's dynamic NTK takes max_position_embeddings as the original context
            return RopeScaling(kind=kind, factor=p["factor"], original_max_seq_len=max_pos)
        if kind == "llama3":
            return RopeScaling(kind=kind, factor=p["factor"], original_max_seq_len=orig,
                               low_freq_factor=p["low_freq_factor"], high_freq_factor=p["high_freq_factor"])
        factor = p.get("factor") or max_pos / orig
        if kind == "yarn":
            attention = p.get("attention_factor") or yarn_attention_factor(factor, p.get("mscale"),
                                                                            p.get("mscale_all_dim"))
            return RopeScaling(kind=kind, factor=factor, original_max_seq_len=orig, beta_fast=p.get("beta_fast") or 32.0,
                               beta_slow=p.get("beta_slow") or 1.0, truncate=p.get("truncate", True),
                               attention_factor=attention)
        attention = p.get("attention_factor") or longrope_attention_factor(factor, orig)
        return RopeScaling(kind=kind, factor=factor, original_max_seq_len=orig, attention_factor=attention,
                           short_factor=p["short_factor"], long_factor=p["long_factor"])
    except KeyError as e:
        raise ConfigError(f"{family} rope_parameters (rope_type={kind!r}) lacks {e.args[0]!r}") from None


def token_ids(hf: dict[str, Any], get, names: tuple[str, ...]) -> dict[str, int | None]:
    """Special token ids; a list (several eos ids) gives its first; an id outside the vocabulary,
    which HF tolerates with a warning, becomes None."""
    ids = {}
    for name in names:
        value = get(name)
        if isinstance(value, list):
            value = value[0] if value else None
        valid = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < hf["vocab_size"]
        ids[name] = value if valid else None
    return ids


# -- writing ---------------------------------------------------------------------------------------
def write_decoder(c: ModelConfig, family: str) -> dict[str, Any]:
    """The config.json keys (model_type and architectures aside) of `c` as HF `family`."""
    spec = FAMILIES[family]
    hf = {
        "vocab_size": c.vocab_size, "hidden_size": c.d_model, "intermediate_size": c.d_ff,
        "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads,
        "head_dim": c.head_dim, spec.act_key: _activation_out(c, family), "max_position_embeddings": c.max_seq_len,
        "rms_norm_eps": c.norm_eps, "rope_parameters": write_rope(c, family), "attention_dropout": c.dropout,
    }
    if spec.bias in ("flag", "experts"):
        hf["attention_bias"] = c.qkv_bias
    if spec.bias == "qkv_flag":
        hf["qkv_bias"] = c.qkv_bias
    if family in MLP_BIAS:
        hf["mlp_bias"] = c.ffn_bias
    if family == "phi3" and c.rope_scaling is not None:
        hf["original_max_position_embeddings"] = c.rope_scaling.original_max_seq_len
    if spec.rope == "per_type":
        hf["rope_parameters"] = {"full_attention": write_rope(c, family), "sliding_attention": _write_sliding_rope(c)}
    if spec.rope == "nope":
        hf["no_rope_layers"] = [int(c.layer_rotates(i)) for i in range(c.n_layers)]
    if family in ("gemma2", "gemma3_text"):
        hf.update(query_pre_attn_scalar=_query_pre_attn_scalar(c), attn_logit_softcapping=c.attn_softcap,
                  final_logit_softcapping=c.logit_softcap)
    hf.update(_write_windows(c, spec))
    hf.update(_write_moe(c, spec))
    if spec.moe.startswith("deepseek"):
        hf.update(_write_latent(c, spec))
        hf["rope_parameters"].update(_score_gain(c))
    return hf


def _score_gain(c: ModelConfig) -> dict[str, float]:
    """YaRN's mscale_all_dim that gives c.attn_scale (HF's yarn_apply_mscale), when it differs from
    1/sqrt(head_dim)."""
    s = c.rope_scaling
    ratio = (c.attn_scale or c.head_dim ** -0.5) * c.head_dim ** 0.5
    if s is None or s.kind != "yarn" or s.factor <= 1 or math.isclose(ratio, 1.0, rel_tol=1e-12):
        return {}
    return {"mscale_all_dim": (math.sqrt(ratio) - 1.0) / (0.1 * math.log(s.factor))}


def _write_latent(c: ModelConfig, spec: Family) -> dict[str, Any]:
    out = {"kv_lora_rank": c.kv_lora_rank, "q_lora_rank": c.q_lora_rank or None, "v_head_dim": c.v_head_dim,
           "qk_rope_head_dim": c.rotary_dim, "qk_nope_head_dim": c.head_dim - c.rotary_dim,
           "n_routed_experts": c.n_experts, "num_experts_per_tok": c.n_experts_per_token,
           "moe_intermediate_size": c.d_ff_expert, "n_shared_experts": c.d_ff_shared_expert // c.d_ff_expert,
           "first_k_dense_replace": c.n_layers - c.n_moe_layers, "routed_scaling_factor": c.routed_scaling,
           "norm_topk_prob": c.moe_renormalize, "head_dim": c.rotary_dim}
    if spec.moe == "deepseek_v3":
        out.update(n_group=c.router_groups, topk_group=c.router_topk_groups, rope_interleave=c.rope_interleaved)
    else:
        out["topk_method"] = "greedy"
    return out


def _write_sliding_rope(c: ModelConfig) -> dict[str, Any]:
    """The sliding-window layers' rope_parameters: their own base and scaling, else the main ones."""
    if c.sliding_rope_theta is None:
        return write_rope(c, "gemma3_text")
    own = c.replace(rope_theta=c.sliding_rope_theta, rope_scaling=c.sliding_rope_scaling)
    return write_rope(own, "gemma3_text")


def _activation_out(c: ModelConfig, family: str) -> str:
    if family in ("gemma", "gemma2", "gemma3_text") and c.activation == "gelu_tanh":
        return "gelu_pytorch_tanh"
    return ACTIVATIONS_OUT[c.activation]


def _query_pre_attn_scalar(c: ModelConfig) -> int | float:
    """The HF value whose power -1/2 is c.attn_scale (an integer when one gives it exactly)."""
    if c.attn_scale is None:
        return c.head_dim
    value = c.attn_scale ** -2
    return round(value) if round(value) ** -0.5 == c.attn_scale else value


def _write_windows(c: ModelConfig, spec: Family) -> dict[str, Any]:
    if spec.windows == "all":
        out = {"sliding_window": c.sliding_window}
        if spec.moe == "qwen3_moe":
            out["use_sliding_window"] = c.sliding_window is not None
        return out
    if spec.windows != "layer_types":
        return {}
    types = ["sliding_attention" if c.layer_window(i) else "full_attention" for i in range(c.n_layers)]
    out: dict[str, Any] = {"layer_types": types, "sliding_window": c.sliding_window}
    if spec.hf_class.startswith("Qwen"):
        out.update(use_sliding_window=c.sliding_window is not None, max_window_layers=c.n_layers)
    if spec.rope == "nope":
        out["use_sliding_window"] = c.sliding_window is not None
        if c.sliding_window is None and spec.moe == "qwen2_moe":
            out["sliding_window"] = 0
    return out


def _write_moe(c: ModelConfig, spec: Family) -> dict[str, Any]:
    if spec.moe == "gpt_oss":
        return {"num_local_experts": c.n_experts, "num_experts_per_tok": c.n_experts_per_token,
                "router_aux_loss_coef": c.router_aux_loss_coef, "swiglu_limit": c.swiglu_limit,
                "swiglu_alpha": c.swiglu_alpha, "intermediate_size": c.d_ff_expert}
    if spec.moe == "mixtral":
        return {"num_local_experts": c.n_experts, "num_experts_per_tok": c.n_experts_per_token,
                "router_aux_loss_coef": c.router_aux_loss_coef, "router_jitter_noise": 0.0}
    if not spec.moe:
        return {}
    out = {"num_experts": c.n_experts, "num_experts_per_tok": c.n_experts_per_token or 1,
           "moe_intermediate_size": c.d_ff_expert or c.d_ff, "norm_topk_prob": c.moe_renormalize,
           "decoder_sparse_step": 1, "router_aux_loss_coef": c.router_aux_loss_coef,
           "mlp_only_layers": [i for i in range(c.n_layers) if not c.layer_is_moe(i)]}
    if spec.moe == "qwen2_moe":
        out["shared_expert_intermediate_size"] = c.d_ff_shared_expert
    return out


def write_rope(c: ModelConfig, family: str) -> dict[str, Any]:
    s = c.rope_scaling
    out: dict[str, Any] = {"rope_type": "default" if s is None else s.kind, "rope_theta": c.rope_theta}
    if FAMILIES[family].partial_rotary:
        out["partial_rotary_factor"] = partial_rotary_factor(c.rotary_dim, c.head_dim)
    if s is None:
        return out
    if s.kind in ("linear", "dynamic", "llama3", "yarn", "longrope"):
        out["factor"] = s.factor
    if s.kind in ("llama3", "yarn", "longrope"):
        out["original_max_position_embeddings"] = s.original_max_seq_len
    if s.kind == "llama3":
        out.update(low_freq_factor=s.low_freq_factor, high_freq_factor=s.high_freq_factor)
    if s.kind == "yarn":
        out.update(beta_fast=s.beta_fast, beta_slow=s.beta_slow, truncate=s.truncate, attention_factor=s.attention_factor)
    if s.kind == "longrope":
        out.update(short_factor=list(s.short_factor), long_factor=list(s.long_factor),
                   attention_factor=s.attention_factor)
    return out


def partial_rotary_factor(rotary_dim: int, head_dim: int) -> float:
    """A factor f with int(head_dim * f) == rotary_dim, as HF computes the rotated dims."""
    f = rotary_dim / head_dim
    while int(head_dim * f) < rotary_dim:
        f = math.nextafter(f, 2.0)
    return f


# -- what each class can express -------------------------------------------------------------------
_LLAMA_LIKE = dict(norm="rmsnorm", norm_position="pre", final_norm=True, embedding_norm=False, ffn="glu",
                   position="rope", lm_head_bias=False, type_vocab_size=0)
_OFF = dict(embedding_scale=False, norm_unit_offset=False, branch_output_norm=False, qk_norm=False, attn_scale=None,
            attn_softcap=None, logit_softcap=None, n_experts=0, sliding_rope_theta=None, nope_layers=None,
            attn_sinks=False, router_bias=False, swiglu_limit=None, kv_lora_rank=0, q_lora_rank=0, v_head_dim=None,
            rope_interleaved=False, router_scoring="softmax", router_groups=1, router_topk_groups=1,
            router_score_bias=False, routed_scaling=1.0)
# what DeepSeek's classes vary (latent attention, routing), checked by _deepseek_problems
_DEEPSEEK_FIELDS = {"deepseek_v2": ("kv_lora_rank", "q_lora_rank", "v_head_dim", "rope_interleaved", "attn_scale",
                                    "routed_scaling"),
                    "deepseek_v3": ("kv_lora_rank", "q_lora_rank", "v_head_dim", "rope_interleaved", "attn_scale",
                                    "routed_scaling", "router_scoring", "router_groups", "router_topk_groups",
                                    "router_score_bias")}
# what each way of reading RoPE (Family.rope) lets a config vary
_ROPE_FIELDS = {"one": (), "per_type": ("sliding_rope_theta",), "nope": ("nope_layers",)}


def problems(c: ModelConfig, family: str) -> list[str]:
    """Why HF `family` cannot express `c` (empty: it can)."""
    spec = FAMILIES[family]
    required = _merged(_LLAMA_LIKE, _OFF, spec.fixed)
    if spec.moe:
        required.pop("n_experts")
    if spec.moe == "gpt_oss":
        required.pop("swiglu_limit")
    for name in _DEEPSEEK_FIELDS.get(family, ()):
        required.pop(name)
    for name in _ROPE_FIELDS[spec.rope]:
        required.pop(name)
    out = [f"{name}={getattr(c, name)!r} (needs {value!r})" for name, value in required.items()
           if getattr(c, name) != value]
    if family in ("gemma2", "gemma3_text"):
        out = [p for p in out if not p.startswith(("attn_scale=", "attn_softcap=", "logit_softcap="))]
    out += _bias_problems(c, spec, family)
    out += _window_problems(c, spec)
    out += _moe_problems(c, spec)
    out += _rope_problems(c, spec, family)
    return out


def _bias_problems(c: ModelConfig, spec: Family, family: str) -> list[str]:
    wanted = {"none": (False, False), "qkv": (True, False)}.get(spec.bias)
    out = []
    if spec.bias == "experts":
        if not c.ffn_bias:
            out.append("ffn_bias=False (gpt-oss's experts always have biases)")
        if c.qkv_bias != c.attn_out_bias:
            out.append(f"qkv_bias={c.qkv_bias} with attn_out_bias={c.attn_out_bias} (one attention_bias for both)")
        return out
    if wanted is not None and (c.qkv_bias, c.attn_out_bias) != wanted:
        out.append(f"qkv_bias={c.qkv_bias}, attn_out_bias={c.attn_out_bias} (needs {wanted[0]}, {wanted[1]})")
    if spec.bias == "qkv_flag" and c.attn_out_bias:
        out.append("attn_out_bias=True (the class has no output bias)")
    if spec.bias == "flag" and c.qkv_bias != c.attn_out_bias:
        out.append(f"qkv_bias={c.qkv_bias} with attn_out_bias={c.attn_out_bias} (one attention_bias for both)")
    if c.ffn_bias and family not in MLP_BIAS:
        out.append("ffn_bias=True (the class has no FFN biases)")
    return out


def _window_problems(c: ModelConfig, spec: Family) -> list[str]:
    if c.sliding_window is None:
        return []
    if spec.windows == "none":
        return [f"sliding_window={c.sliding_window} (the class has no sliding window)"]
    if spec.windows == "all" and c.sliding_window_layers is not None:
        return [f"sliding_window_layers={list(c.sliding_window_layers)} (the class slides every layer or none)"]
    return []


def _moe_problems(c: ModelConfig, spec: Family) -> list[str]:
    if spec.moe == "gpt_oss":
        return _gpt_oss_problems(c)
    if spec.moe.startswith("deepseek"):
        return _deepseek_problems(c, spec)
    if not spec.moe or not c.n_experts:
        return []
    out = []
    if spec.moe == "mixtral":
        if not c.moe_renormalize:
            out.append("moe_renormalize=False (Mixtral always renormalises the top-k weights)")
        if c.d_ff_expert != c.d_ff:
            out.append(f"d_ff_expert={c.d_ff_expert} (Mixtral's experts have intermediate_size = d_ff={c.d_ff})")
        if c.moe_layers is not None:
            out.append(f"moe_layers={list(c.moe_layers)} (every Mixtral layer is a mixture)")
    if spec.moe == "qwen2_moe" and not (c.d_ff_shared_expert and c.shared_expert_gate):
        out.append("d_ff_shared_expert / shared_expert_gate (Qwen2-MoE always has a gated shared expert)")
    if spec.moe != "qwen2_moe" and c.d_ff_shared_expert:
        out.append(f"d_ff_shared_expert={c.d_ff_shared_expert} (the class has no shared expert)")
    return out


def _deepseek_problems(c: ModelConfig, spec: Family) -> list[str]:
    out = [] if c.latent else ["kv_lora_rank=0 (DeepSeek's attention is latent)"]
    if not c.n_experts or c.shared_expert_gate or (c.d_ff_shared_expert and c.d_ff_shared_expert % (c.d_ff_expert or 1)):
        out.append("experts with ungated shared experts of d_ff_expert each (DeepSeek's MoE)")
    dense = c.n_layers - c.n_moe_layers
    if c.moe_layers is not None and c.moe_layers != tuple(range(dense, c.n_layers)):
        out.append(f"moe_layers={list(c.moe_layers)} (DeepSeek's dense layers come first)")
    if spec.moe == "deepseek_v2" and (c.router_scoring != "softmax" or c.router_groups != 1 or c.router_score_bias
                                     or c.moe_renormalize or not c.rope_interleaved):
        out.append("sigmoid or grouped routing, renormalisation or unpaired RoPE (DeepSeek-V2: softmax, greedy)")
    if spec.moe == "deepseek_v3" and (c.router_scoring != "sigmoid" or not c.router_score_bias):
        out.append("softmax routing or no score bias (DeepSeek-V3: sigmoid scores, a balancing bias)")
    return out


def _gpt_oss_problems(c: ModelConfig) -> list[str]:
    out = [] if c.n_experts else ["n_experts=0 (every gpt-oss layer is a mixture)"]
    if c.moe_layers is not None or c.d_ff_shared_expert or not c.moe_renormalize:
        out.append("moe_layers, a shared expert or moe_renormalize=False (gpt-oss: every layer a mixture, the "
                   "top-k softmax, no shared expert)")
    if c.swiglu_limit is None:
        out.append("swiglu_limit=None (gpt-oss always clamps its SwiGLU)")
    return out


def _rope_problems(c: ModelConfig, spec: Family, family: str) -> list[str]:
    out = []
    if c.rotary_dim != c.head_dim and not spec.partial_rotary and not c.latent:
        out.append(f"rotary_dim={c.rotary_dim} (the class rotates all head_dim={c.head_dim} dims)")
    s = c.rope_scaling
    if s is not None and s.kind == "dynamic" and s.original_max_seq_len != c.max_seq_len:
        out.append(f"rope_scaling.original_max_seq_len={s.original_max_seq_len} (HF's dynamic NTK takes "
                   f"max_seq_len={c.max_seq_len} as the original context)")
    if family == "phi3" and s is not None and s.kind != "longrope":
        out.append(f"rope_scaling={s.kind!r} (Phi-3 has LongRoPE or none)")
    return out
