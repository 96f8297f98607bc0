"""ModelConfig <-> GGUF metadata (`{arch}.block_count`, `{arch}.attention.head_count`, ...).

Reading checks every value it uses: the right type, positive where a size, within limits; a
metadata set that makes no valid model is a CheckpointError of the file naming the key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from anatomy.checkpoints.gguf_names import ROTARY_REORDERED
from anatomy.checkpoints.gguf_reader import GGUFFile
from anatomy.checkpoints.gguf_types import ValueType
from anatomy.config import ModelConfig, RopeScaling
from anatomy.errors import CheckpointError, ConfigError
from anatomy.layers.rope_scaling import yarn_mscale

# RoPE models compute positions on the fly, so a long context costs nothing at load time; but a KV
# cache sized by max_seq_len would. Above this the value is taken to be corrupt, not ambitious.
MAX_CONTEXT = 1 << 24


@dataclass(frozen=True)
class Architecture:
    """What a GGUF architecture fixes about the model (as llama.cpp runs it), and where its norm
    epsilon lives.

    experts  "": none; "renormalized" / "plain": a mixture whose top-k weights llama.cpp does /
             does not divide by their sum; "shared": plain, plus a sigmoid-gated shared expert
    window   "none": no sliding window (llama.cpp's llama and phi3 do not apply one, even when the file
             has an `attention.sliding_window` key); "even": `attention.sliding_window` on the even
             layers (Gemma 2's pattern, which llama.cpp hard-codes); "pattern": on the layers
             `attention.sliding_window_pattern` marks (a bool per layer, or a period n: layer i slides
             when i % n < n - 1; llama.cpp's default `period`: Gemma 3 6, gpt-oss 2)
    sliding  the RoPE of those layers: "own" (Gemma 3: `rope.freq_base_swa`, default 10000, unscaled) or
             "main" (gpt-oss: the main base and scaling unless `rope.freq_base_swa` gives another base)
    nope     llama.cpp's period of layers without RoPE (SmolLM3: layer i has none when (i + 1) % 4 == 0)
    """

    fields: dict[str, Any]
    eps_key: str = "attention.layer_norm_rms_epsilon"
    experts: str = ""
    window: str = "none"
    period: int = 6
    sliding: str = "own"
    nope: int = 0


_LLAMA_LIKE = {"norm": "rmsnorm", "ffn": "glu", "activation": "silu", "position": "rope"}
_GEMMA = {**_LLAMA_LIKE, "activation": "gelu_tanh", "norm_unit_offset": True, "embedding_scale": True,
          "tie_embeddings": True}
ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture(fields=_LLAMA_LIKE, experts="renormalized"),
    "qwen2": Architecture(fields={**_LLAMA_LIKE, "qkv_bias": True, "attn_out_bias": False}),
    "qwen3": Architecture(fields={**_LLAMA_LIKE, "qk_norm": True}),
    "qwen2moe": Architecture(fields=_LLAMA_LIKE, experts="shared"),
    "qwen3moe": Architecture(fields={**_LLAMA_LIKE, "qk_norm": True}, experts="renormalized"),
    "gemma": Architecture(fields=_GEMMA),
    "gemma2": Architecture(fields={**_GEMMA, "branch_output_norm": True}, window="even"),
    "gemma3": Architecture(fields={**_GEMMA, "branch_output_norm": True, "qk_norm": True}, window="pattern"),
    "smollm3": Architecture(fields=_LLAMA_LIKE, nope=4),
    "gpt-oss": Architecture(fields={**_LLAMA_LIKE, "attn_sinks": True, "router_bias": True, "ffn_bias": True,
                                    "swiglu_limit": 7.0, "swiglu_alpha": 1.702},
                            experts="renormalized", window="pattern", period=2, sliding="main"),
    "phi3": Architecture(fields=_LLAMA_LIKE),
    "deepseek2": Architecture(fields={**_LLAMA_LIKE, "rope_interleaved": True}, experts="plain"),
    "gpt2": Architecture(
        fields={"norm": "layernorm", "ffn": "mlp", "activation": "gelu_tanh", "position": "learned",
                "qkv_bias": True, "attn_out_bias": True, "ffn_bias": True},
        eps_key="attention.layer_norm_epsilon"),
}
# tensors that describe the RoPE frequencies rather than hold weights (llama3 rule, Phi-3 LongRoPE)
ROPE_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
GEMMA3_SLIDING_THETA = 10000.0  # llama.cpp's default base of Gemma 3's sliding layers
GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}  # llama.cpp scales these models' scores by 1/sqrt(D/H)
# llama.cpp's Gemma 2 defaults when the file leaves the soft-caps out
GEMMA2_SOFTCAPS = {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}


# the GGUF key each config field comes from (for error messages), `{a}` standing for the architecture
_FIELD_KEYS = {
    "n_layers": "{a}.block_count", "d_model": "{a}.embedding_length", "d_ff": "{a}.feed_forward_length",
    "n_heads": "{a}.attention.head_count", "n_kv_heads": "{a}.attention.head_count_kv",
    "head_dim": "{a}.attention.key_length", "max_seq_len": "{a}.context_length", "rope_theta": "{a}.rope.freq_base",
    "vocab_size": "{a}.vocab_size", "n_experts": "{a}.expert_count", "n_experts_per_token": "{a}.expert_used_count",
    "d_ff_expert": "{a}.expert_feed_forward_length", "sliding_window": "{a}.attention.sliding_window",
    "rotary_dim": "{a}.rope.dimension_count", "bos_token_id": "tokenizer.ggml.bos_token_id",
    "eos_token_id": "tokenizer.ggml.eos_token_id", "pad_token_id": "tokenizer.ggml.padding_token_id",
}
_INT_TYPES = {ValueType.UINT8, ValueType.INT8, ValueType.UINT16, ValueType.INT16, ValueType.UINT32,
              ValueType.INT32, ValueType.UINT64, ValueType.INT64}
_FLOAT_TYPES = {ValueType.FLOAT32, ValueType.FLOAT64}


def gguf_architecture(f: GGUFFile) -> str:
    """general.architecture, checked to be one anatomy can build."""
    arch = _get(f, "general.architecture", {ValueType.STRING})
    if arch not in ARCHITECTURES:
        raise f.fail("general.architecture", arch, f"unsupported architecture; supported: {', '.join(ARCHITECTURES)}")
    return arch


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    """The ModelConfig the file's metadata describes, as llama.cpp runs it (tied head when there is
    no `output.weight`; which layers are mixtures of experts, by their tensors)."""
    a = gguf_architecture(f)
    spec = ARCHITECTURES[a]
    d_model = _size(f, f"{a}.embedding_length")
    n_heads = _size(f, f"{a}.attention.head_count")
    values = dict(
        spec.fields,
        architecture="decoder",
        vocab_size=_vocab_size(f, a),
        d_model=d_model,
        n_layers=_size(f, f"{a}.block_count"),
        n_heads=n_heads,
        n_kv_heads=_size(f, f"{a}.attention.head_count_kv", default=n_heads),
        head_dim=_size(f, f"{a}.attention.key_length", default=None),
        d_ff=_size(f, f"{a}.feed_forward_length"),
        max_seq_len=_context_length(f, a),
        norm_eps=_positive_float(f, f"{a}.{ARCHITECTURES[a].eps_key}", default=1e-5),
        tie_embeddings="output.weight" not in f.tensors,
        **_biases(f, a),
        **_experts(f, a),
        bos_token_id=_token_id(f, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_token_id(f, "tokenizer.ggml.eos_token_id"),
        pad_token_id=_token_id(f, "tokenizer.ggml.padding_token_id"),
    )
    _check_sizes_fit_tensors(f, a, values)
    if spec.fields["position"] == "rope":
        values["rope_theta"] = _positive_float(f, f"{a}.rope.freq_base", default=10000.0)
        values.update(_rope(f, a, values["head_dim"] or d_model // n_heads, values["rope_theta"],
                            values["max_seq_len"]))
    values.update(_window(f, a, values["n_layers"]))
    if a == "gemma2":
        values.update(_gemma2(f, values, d_model // n_heads))
    if a == "gemma3":
        values.update(_gemma3(f, values, d_model // n_heads))
    if spec.window == "pattern":
        values.update(_sliding_rope(f, a, values))
    if spec.nope:
        nope = tuple(i for i in range(values["n_layers"]) if (i + 1) % spec.nope == 0)
        values["nope_layers"] = nope or None
    if a == "deepseek2":
        values.update(_deepseek2(f, values))
    return _build(f, a, values)


def _check_sizes_fit_tensors(f: GGUFFile, arch: str, values: dict[str, Any]) -> None:
    """Sizes a corrupt file could inflate (2^31 layers, a head_dim of 2^40) would make even a
    meta-device build allocate: each must fit in the tensors the file really holds. Every model
    size appears as (or bounds) some tensor dimension, and every layer has tensors of its own."""
    if not f.tensors:
        raise f.fail("tensor_count", 0, "the file holds no tensors (a vocabulary-only GGUF?), so no model")
    largest = max(max(t.shape) for t in f.tensors.values())
    for field in ("vocab_size", "d_model", "d_ff", "n_heads", "n_kv_heads", "head_dim", "n_experts", "d_ff_expert",
                  "d_ff_shared_expert"):
        unused = field == "d_ff" and values.get("n_experts") and values.get("moe_layers") is None \
            and values.get("d_ff_expert")  # every layer a mixture: no tensor is d_ff wide
        if values.get(field) is not None and values[field] > largest and not unused:
            raise f.fail(_FIELD_KEYS[field].format(a=arch), values[field],
                         f"larger than every tensor dimension in the file (the largest is {largest})")
    if values["n_layers"] > len(f.tensors):
        raise f.fail(f"{arch}.block_count", values["n_layers"], f"more layers than the file's {len(f.tensors)} tensors")


def _biases(f: GGUFFile, arch: str) -> dict[str, bool]:
    """LLaMA-like files may carry Q/K/V and output biases (the tensors say so)."""
    if arch == "gpt2":
        return {}
    qkv = any(f"blk.0.attn_{x}.bias" in f.tensors for x in ("q", "qkv"))
    return {"qkv_bias": qkv, "attn_out_bias": "blk.0.attn_output.bias" in f.tensors}


def _experts(f: GGUFFile, arch: str) -> dict[str, Any]:
    """A mixture of experts: its sizes from the metadata, its layers from the tensors (a layer with
    a router, `ffn_gate_inp`, is a mixture)."""
    kind = ARCHITECTURES[arch].experts
    n_experts = _size(f, f"{arch}.expert_count", default=0) if kind else 0
    if not n_experts:
        return {}
    n_layers = _size(f, f"{arch}.block_count")
    layers = tuple(i for i in range(n_layers) if f"blk.{i}.ffn_gate_inp.weight" in f.tensors)
    values = dict(n_experts=n_experts, n_experts_per_token=_size(f, f"{arch}.expert_used_count"),
                  moe_renormalize=kind == "renormalized", moe_layers=None if len(layers) == n_layers else layers)
    if arch != "llama":  # the llama architecture's experts are feed_forward_length wide
        values["d_ff_expert"] = _size(f, f"{arch}.expert_feed_forward_length")
    if kind == "shared":
        values.update(d_ff_shared_expert=_size(f, f"{arch}.expert_shared_feed_forward_length"),
                      shared_expert_gate=True)
    return values


def _window(f: GGUFFile, arch: str, n_layers: int) -> dict[str, Any]:
    """The sliding window llama.cpp applies (a key it does not read for this architecture is ignored,
    as llama.cpp ignores it)."""
    kind = ARCHITECTURES[arch].window
    if kind == "none":
        return {}
    window = _get(f, f"{arch}.attention.sliding_window", _INT_TYPES, 4096 if kind == "even" else 0)
    if window < 0:
        raise f.fail(f"{arch}.attention.sliding_window", window, "must be >= 0")
    if not window:
        return {}
    if kind == "pattern":
        layers = _window_pattern(f, arch, n_layers, ARCHITECTURES[arch].period)
        if not layers:
            return {}
        return {"sliding_window": window, "sliding_window_layers": None if len(layers) == n_layers else layers}
    return {"sliding_window": window,
            "sliding_window_layers": tuple(range(0, n_layers, 2)) if kind == "even" and n_layers > 1 else None}


def _window_pattern(f: GGUFFile, arch: str, n_layers: int, default: int) -> tuple[int, ...]:
    """The sliding layers `attention.sliding_window_pattern` gives: one bool per layer, or a period."""
    key = f"{arch}.attention.sliding_window_pattern"
    value = f.metadata.get(key, default)
    if isinstance(value, (list, tuple, np.ndarray)):
        flags = list(value)
        if len(flags) != n_layers or any(not isinstance(v, (bool, np.bool_)) for v in flags):
            shown = [bool(v) if isinstance(v, np.bool_) else v for v in flags[:8]]
            raise f.fail(key, shown, f"must be one bool per layer ({n_layers}) or a period")
        return tuple(i for i, v in enumerate(flags) if v)
    period = _get(f, key, _INT_TYPES, default)
    if period < 0:
        raise f.fail(key, period, "must be >= 0")
    return tuple(i for i in range(n_layers) if period == 0 or i % period < period - 1)


def score_scale(arch: str, n_layers: int, plain_head_dim: int, head_dim: int | None) -> float:
    """The score scale llama.cpp's gemma2 and gemma3 fix: 1/sqrt(head_dim), 1/sqrt(D/H) for the 27B
    models (recognised by their layer count)."""
    return (plain_head_dim if n_layers == GEMMA_27B_LAYERS[arch] else head_dim or plain_head_dim) ** -0.5


def _sliding_rope(f: GGUFFile, arch: str, values: dict[str, Any]) -> dict[str, Any]:
    """The sliding layers' RoPE as llama.cpp runs it: `rope.freq_base_swa`, by default Gemma 3's 10000
    unscaled ("own"), or gpt-oss's main base and scaling ("main"); nothing when that is the main RoPE."""
    if values.get("sliding_window") is None:
        return {}
    own = ARCHITECTURES[arch].sliding == "own"
    theta = _positive_float(f, f"{arch}.rope.freq_base_swa", default=GEMMA3_SLIDING_THETA if own else values["rope_theta"])
    scaling = None if own else values.get("rope_scaling")
    if (theta, scaling) == (values["rope_theta"], values.get("rope_scaling")):
        return {}
    return {"sliding_rope_theta": theta, "sliding_rope_scaling": scaling}


def _gemma2(f: GGUFFile, values: dict[str, Any], plain_head_dim: int) -> dict[str, Any]:
    """Gemma 2's score scale and soft-caps as llama.cpp sets them."""
    caps = {key: _positive_float(f, f"gemma2.{key}", default=default) for key, default in GEMMA2_SOFTCAPS.items()}
    return {"attn_scale": score_scale("gemma2", values["n_layers"], plain_head_dim, values["head_dim"]),
            "attn_softcap": caps["attn_logit_softcapping"], "logit_softcap": caps["final_logit_softcapping"]}


def _gemma3(f: GGUFFile, values: dict[str, Any], plain_head_dim: int) -> dict[str, Any]:
    """Gemma 3 as llama.cpp runs it: its score scale, no attention soft-cap, the final one if the file
    has it."""
    out: dict[str, Any] = {"attn_scale": score_scale("gemma3", values["n_layers"], plain_head_dim, values["head_dim"])}
    cap = _get(f, "gemma3.final_logit_softcapping", _FLOAT_TYPES, 0.0)
    if cap < 0 or not math.isfinite(cap):
        raise f.fail("gemma3.final_logit_softcapping", cap, "must be a finite number >= 0")
    if cap:
        out["logit_softcap"] = float(cap)
    return out


def _deepseek2(f: GGUFFile, values: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek-V2/V3 as llama.cpp's deepseek2 runs them: latent attention (the file's one KV head of
    kv_lora_rank + RoPE dims is the cached latent; the heads are `*_mla` wide), RoPE on interleaved pairs,
    YaRN's gain on the scores only, and the routing its expert keys give (dense leading layers: no router)."""
    a = "deepseek2"
    head_dim = _size(f, f"{a}.attention.key_length_mla")
    out: dict[str, Any] = dict(
        n_kv_heads=values["n_heads"], head_dim=head_dim, v_head_dim=_size(f, f"{a}.attention.value_length_mla"),
        kv_lora_rank=_size(f, f"{a}.attention.kv_lora_rank"),
        q_lora_rank=f.tensors["blk.0.attn_q_a.weight"].shape[0] if "blk.0.attn_q_a.weight" in f.tensors else 0)
    s, scale = values.get("rope_scaling"), head_dim ** -0.5
    if s is not None and s.kind == "yarn":
        log_mul = float(str(np.float32(_get(f, f"{a}.rope.scaling.yarn_log_multiplier", _FLOAT_TYPES))))
        scale *= yarn_mscale(s.factor, log_mul / 0.1) ** 2  # the converter writes 0.1 x mscale_all_dim
    out["attn_scale"] = scale
    if not values.get("n_experts"):
        return out
    gating = _get(f, f"{a}.expert_gating_func", _INT_TYPES, 1)
    if gating not in (1, 2):
        raise f.fail(f"{a}.expert_gating_func", gating, "must be 1 (softmax) or 2 (sigmoid)")
    first = values["moe_layers"][0] if values.get("moe_layers") else 0
    shared = _get(f, f"{a}.expert_shared_count", _INT_TYPES, 0)
    out.update(router_scoring="softmax" if gating == 1 else "sigmoid",
               moe_renormalize=bool(_get(f, f"{a}.expert_weights_norm", {ValueType.BOOL}, False)),
               routed_scaling=_positive_float(f, f"{a}.expert_weights_scale", default=1.0),
               router_groups=_size(f, f"{a}.expert_group_count", default=1),
               router_topk_groups=_size(f, f"{a}.expert_group_used_count", default=1),
               router_score_bias=f"blk.{first}.exp_probs_b.bias" in f.tensors,
               d_ff_shared_expert=shared * values["d_ff_expert"] if shared > 0 else None)
    return out


def _build(f: GGUFFile, arch: str, values: dict[str, Any]) -> ModelConfig:
    try:
        return ModelConfig(**values)
    except ConfigError as e:
        keys = [k.format(a=arch) for field, k in _FIELD_KEYS.items() if str(e).startswith(f"{field}=")
                or f" {field}=" in str(e)]
        raise CheckpointError(f"{f.path}: the GGUF metadata makes an invalid model: {e}"
                              + (f" (from {', '.join(keys)})" if keys else "")) from e


def _get(f: GGUFFile, key: str, types: set[ValueType], default: Any = ...) -> Any:
    if key not in f.metadata:
        if default is ...:
            raise f.fail(key, None, "required metadata key is missing")
        return default
    vtype = f.value_types[key]
    if len(vtype) != 1 or vtype[0] not in types:
        raise f.fail(key, f.metadata[key], f"has type {'/'.join(t.name for t in vtype)}, "
                                           f"expected {' or '.join(sorted(t.name for t in types))}")
    return f.metadata[key]


def _size(f: GGUFFile, key: str, default: Any = ...) -> Any:
    value = _get(f, key, _INT_TYPES, default)
    if value is not default and value <= 0:
        raise f.fail(key, value, "must be a positive integer")
    return value


def _positive_float(f: GGUFFile, key: str, default: float) -> float:
    value = _get(f, key, _FLOAT_TYPES, default)
    if f.value_types.get(key) == (ValueType.FLOAT32,):
        value = float(str(np.float32(value)))  # the decimal the writer meant: 1e-06, not 9.99999997e-07
    if not value > 0 or value == float("inf"):
        raise f.fail(key, value, "must be a positive finite number")
    return value


def _token_id(f: GGUFFile, key: str) -> int | None:
    value = _get(f, key, _INT_TYPES, None)
    if value is not None and value < 0:
        raise f.fail(key, value, "a token id must be >= 0")
    return value


def _vocab_size(f: GGUFFile, arch: str) -> int:
    """{arch}.vocab_size, else the length of the token list, else the embedding's rows."""
    if f"{arch}.vocab_size" in f.metadata:
        return _size(f, f"{arch}.vocab_size")
    tokens = f.metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and tokens:
        return len(tokens)
    if "token_embd.weight" in f.tensors:
        return f.tensors["token_embd.weight"].shape[0]
    raise f.fail(f"{arch}.vocab_size", None, "missing, and no tokenizer.ggml.tokens or token_embd.weight to count")


def _context_length(f: GGUFFile, arch: str) -> int:
    key = f"{arch}.context_length"
    value = _size(f, key)
    if value > MAX_CONTEXT:
        raise f.fail(key, value, f"larger than anatomy's limit of {MAX_CONTEXT} positions (a corrupt value?)")
    return value


def _rope(f: GGUFFile, arch: str, head_dim: int, theta: float, context: int) -> dict[str, Any]:
    """rotary_dim and rope_scaling: linear (`rope.scaling.*`), YaRN as llama.cpp applies it, Llama 3's
    rule (a `rope_freqs` tensor of per-frequency divisors, matched against the rule), or none; anything
    else is refused."""
    dims = _size(f, f"{arch}.rope.dimension_count", default=head_dim)
    reordered = arch in ROTARY_REORDERED  # its q/k rows are reordered over the whole head
    if dims > head_dim or dims % 2 or (dims != head_dim and reordered):
        raise f.fail(f"{arch}.rope.dimension_count", dims, f"must be even and <= head_dim={head_dim}"
                     + (f" (partial rotary dims are not supported for the {arch} architecture)" if reordered else ""))
    scaling = _get(f, f"{arch}.rope.scaling.type", {ValueType.STRING}, "none")
    freqs = "rope_freqs.weight" in f.tensors
    if any(name in f.tensors for name in ROPE_TENSORS[1:]):
        raise f.fail("rope_factors_long/short", "present", "LongRoPE in llama.cpp switches by the session's context "
                     "size, not by the sequence: anatomy cannot run it the same way")
    if scaling not in ("none", "linear", "yarn") or (scaling != "none" and freqs):
        raise f.fail(f"{arch}.rope.scaling.type", scaling, "RoPE scaling is not supported; supported: none, linear, "
                     "yarn, and Llama 3's rule given as rope_freqs")
    out: dict[str, Any] = {"rotary_dim": dims}
    if scaling == "yarn":
        out["rope_scaling"] = _yarn(f, arch, context)
    elif scaling == "linear":
        factor = _positive_float(f, f"{arch}.rope.scaling.factor", default=1.0)
        out["rope_scaling"] = RopeScaling(kind="linear", factor=factor) if factor != 1.0 else None
    elif freqs:
        out["rope_scaling"] = _llama3_from_factors(f, theta, dims)
    return out


def _yarn(f: GGUFFile, arch: str, context: int) -> RopeScaling:
    """YaRN as llama.cpp runs it: correction dims floored and ceiled (HF's truncate), beta 32 / 1, the
    angles scaled by (1 + 0.1 ln factor) x `rope.scaling.attn_factor`; its YaRN keys beyond those are
    not read by llama.cpp. A log multiplier is deepseek2's only (its angles unscaled, _deepseek2)."""
    key = f"{arch}.rope.scaling.yarn_log_multiplier"
    log_mul = _get(f, key, _FLOAT_TYPES, 0.0)
    if log_mul and arch != "deepseek2":
        raise f.fail(key, log_mul, "YaRN with a log multiplier is DeepSeek's: llama.cpp reads it for deepseek2 only")
    if not log_mul and arch == "deepseek2":
        raise f.fail(key, None, "deepseek2's YaRN needs its log multiplier (0.1 x mscale_all_dim, as llama.cpp's "
                                "converter writes it)")
    factor = _positive_float(f, f"{arch}.rope.scaling.factor", default=1.0)
    original = _size(f, f"{arch}.rope.scaling.original_context_length", default=context)
    gain = _positive_float(f, f"{arch}.rope.scaling.attn_factor", default=1.0)
    if arch == "deepseek2":  # llama.cpp leaves its angles unscaled: the gain is on the scores (_deepseek2)
        gain = 1.0 / yarn_mscale(factor)
    return RopeScaling(kind="yarn", factor=factor, original_max_seq_len=original, truncate=True,
                       attention_factor=yarn_mscale(factor) * gain)


# Llama 3.1 / 3.2 as Meta released them: low_freq_factor 1, high_freq_factor 4, an 8192-position original
# context; factor 8 (3.1) or 32 (3.2). A rope_freqs tensor is matched against these rules.
LLAMA3_RULES = tuple(dict(factor=factor, low_freq_factor=1.0, high_freq_factor=4.0, original_max_seq_len=8192)
                     for factor in (8.0, 32.0, 16.0, 4.0))


def _llama3_from_factors(f: GGUFFile, theta: float, dims: int) -> RopeScaling:
    """The Llama 3 rule whose divisors are the file's `rope_freqs` (the converter writes them instead
    of the rule's parameters), to float32 precision; a tensor no known rule gives is refused."""
    import torch

    from anatomy.checkpoints.gguf_dequant import dequantize
    from anatomy.layers.rope_scaling import plain_frequencies, static_frequencies

    t = f.tensors["rope_freqs.weight"]
    if t.shape != (dims // 2,) or t.type.name != "F32":
        raise f.fail("rope_freqs.weight", list(t.shape), f"must be F32 [{dims // 2}] (rope.dimension_count / 2)")
    factors = dequantize(f.raw(t.name), t.type, t.shape).float()
    plain = plain_frequencies(theta, dims)
    for rule in LLAMA3_RULES:
        scaling = RopeScaling(kind="llama3", **rule)
        expected = plain / static_frequencies(theta, dims, scaling)[0]
        if torch.allclose(factors, expected, rtol=1e-5, atol=0):
            return scaling
    raise f.fail("rope_freqs.weight", [round(float(x), 4) for x in factors[:4]] + ["..."],
                 "per-frequency RoPE divisors that no Llama 3 rule (factor 4/8/16/32, low 1, high 4, original "
                 "8192) gives")


def config_to_gguf(config: ModelConfig) -> tuple[str, list[tuple[str, Any, Any]]]:
    """(architecture, [(key, type, value)]) describing `config` for llama.cpp (an array's type: the
    pair (ARRAY, its items' type))."""
    arch = _architecture_of(config)
    spec = ARCHITECTURES[arch]
    u32, f32 = ValueType.UINT32, ValueType.FLOAT32
    entries = [
        ("general.architecture", ValueType.STRING, arch),
        (f"{arch}.context_length", u32, config.max_seq_len),
        (f"{arch}.embedding_length", u32, config.d_model),
        (f"{arch}.feed_forward_length", u32, config.d_ff),
        (f"{arch}.block_count", u32, config.n_layers),
        (f"{arch}.attention.head_count", u32, config.n_heads),
        (f"{arch}.{spec.eps_key}", f32, config.norm_eps),
    ]
    if config.position == "rope":
        entries += [(f"{arch}.attention.head_count_kv", u32, config.n_kv_heads),
                    (f"{arch}.rope.freq_base", f32, config.rope_theta),
                    (f"{arch}.rope.dimension_count", u32, config.rotary_dim),
                    (f"{arch}.vocab_size", u32, config.vocab_size)]
        if config.head_dim * config.n_heads != config.d_model:
            entries += [(f"{arch}.attention.key_length", u32, config.head_dim),
                        (f"{arch}.attention.value_length", u32, config.head_dim)]
        s = config.rope_scaling
        if s is not None and s.kind in ("linear", "yarn"):
            entries += [(f"{arch}.rope.scaling.type", ValueType.STRING, s.kind),
                        (f"{arch}.rope.scaling.factor", f32, s.factor)]
        if s is not None and s.kind == "yarn":
            entries += [(f"{arch}.rope.scaling.original_context_length", u32, s.original_max_seq_len),
                        (f"{arch}.rope.scaling.attn_factor", f32, s.attention_factor / yarn_mscale(s.factor))]
    if config.n_experts:
        entries += [(f"{arch}.expert_count", u32, config.n_experts),
                    (f"{arch}.expert_used_count", u32, config.n_experts_per_token)]
        if arch != "llama":
            entries.append((f"{arch}.expert_feed_forward_length", u32, config.d_ff_expert))
        if spec.experts == "shared":
            entries.append((f"{arch}.expert_shared_feed_forward_length", u32, config.d_ff_shared_expert))
    if spec.window != "none":
        entries.append((f"{arch}.attention.sliding_window", u32, config.sliding_window or 0))
    if spec.window == "pattern" and config.sliding_window is not None:
        flags = [config.layer_window(i) is not None for i in range(config.n_layers)]
        entries += [(f"{arch}.attention.sliding_window_pattern", (ValueType.ARRAY, ValueType.BOOL), flags),
                    (f"{arch}.rope.freq_base_swa", f32, config.sliding_rope_theta or config.rope_theta)]
    if arch == "gemma3" and config.logit_softcap is not None:
        entries.append(("gemma3.final_logit_softcapping", f32, config.logit_softcap))
    if arch == "gemma2":
        entries += [("gemma2.attn_logit_softcapping", f32, config.attn_softcap),
                    ("gemma2.final_logit_softcapping", f32, config.logit_softcap)]
    return arch, entries


def rope_tensors(config: ModelConfig) -> dict[str, np.ndarray]:
    """Tensors llama.cpp reads its RoPE frequencies from: Llama 3's per-frequency divisors."""
    s = config.rope_scaling
    if s is None or s.kind != "llama3":
        return {}
    from anatomy.layers.rope_scaling import plain_frequencies, static_frequencies

    plain = plain_frequencies(config.rope_theta, config.rotary_dim)
    return {"rope_freqs.weight": (plain / static_frequencies(config.rope_theta, config.rotary_dim, s)[0]).numpy()}


# the order architectures are tried in when writing: the plainest that expresses the config (qwen2 first:
# q/k/v biases without an output bias are its own; the llama architecture would run them too)
WRITE_ORDER = ("qwen2", "llama", "qwen3", "gemma", "gemma2", "gemma3", "phi3", "qwen2moe", "qwen3moe", "smollm3",
               "gpt-oss", "gpt2")
_OFF = {"qk_norm": False, "norm_unit_offset": False, "embedding_scale": False, "branch_output_norm": False,
        "attn_softcap": None, "logit_softcap": None, "attn_scale": None, "lm_head_bias": False, "final_norm": True,
        "norm_position": "pre", "embedding_norm": False, "type_vocab_size": 0, "ffn_bias": False,
        "sliding_rope_theta": None, "nope_layers": None, "attn_sinks": False, "router_bias": False,
        "swiglu_limit": None, "swiglu_alpha": 1.0, "kv_lora_rank": 0, "rope_interleaved": False,
        "router_scoring": "softmax", "router_groups": 1, "router_score_bias": False, "routed_scaling": 1.0}
# what llama.cpp's architectures set themselves (checked by _rope_problems / _nope_problems instead)
_OWN = {"gemma2": ("attn_softcap", "logit_softcap", "attn_scale"),
        "gemma3": ("logit_softcap", "attn_scale", "sliding_rope_theta"), "smollm3": ("nope_layers",)}


def gguf_problems(config: ModelConfig, arch: str) -> list[str]:
    """Why llama.cpp's `arch` cannot run `config` as anatomy does (empty: it can)."""
    spec = ARCHITECTURES[arch]
    if not config.is_decoder:
        return [f"architecture={config.architecture!r} (needs 'decoder')"]
    if arch == "gpt2":
        out = [f"{k}={getattr(config, k)!r} (needs {v!r})" for k, v in spec.fields.items() if getattr(config, k) != v]
        if config.n_kv_heads != config.n_heads or config.head_dim * config.n_heads != config.d_model:
            out.append("GQA or a decoupled head_dim (llama.cpp's gpt2 has neither)")
        return out + _new_parts_problems(config, {})
    required = {**_OFF, **spec.fields}
    for name in _OWN.get(arch, ()):
        required.pop(name)
    out = [f"{k}={getattr(config, k)!r} (needs {v!r})" for k, v in required.items() if getattr(config, k) != v]
    if arch not in ("llama", "qwen2", "qwen2moe", "gpt-oss") and (config.qkv_bias or config.attn_out_bias):
        out.append("attention biases (anatomy writes them for llama, qwen2, qwen2moe and gpt-oss)")
    if arch == "gpt-oss" and config.sliding_rope_theta is not None:
        out.append("sliding_rope_theta (llama.cpp's gpt-oss rotates every layer by the main RoPE)")
    if arch == "qwen2moe" and config.attn_out_bias:
        out.append("attn_out_bias=True (qwen2moe has q/k/v biases only)")
    return out + _window_problems(config, spec) + _expert_problems(config, arch, spec) + _rope_problems(config, arch) \
        + _nope_problems(config, spec)


def _nope_problems(config: ModelConfig, spec: Architecture) -> list[str]:
    if not spec.nope:
        return []
    expected = tuple(i for i in range(config.n_layers) if (i + 1) % spec.nope == 0) or None
    if config.nope_layers != expected:
        return [f"nope_layers={config.nope_layers} (llama.cpp's smollm3 has no RoPE on every {spec.nope}th layer: "
                f"{expected})"]
    return []


def _new_parts_problems(config: ModelConfig, allowed: dict[str, Any]) -> list[str]:
    off = {"sliding_window": None, "n_experts": 0, "rope_scaling": None, **_OFF}  # (gpt2)
    return [f"{k}={getattr(config, k)!r} (needs {v!r})" for k, v in off.items()
            if k not in allowed and k not in ("ffn_bias", "final_norm", "norm_position") and getattr(config, k) != v]


def _window_problems(config: ModelConfig, spec: Architecture) -> list[str]:
    if config.sliding_window is None:
        return ["no sliding window (llama.cpp's gemma2 always slides the even layers)"] if spec.window == "even" else []
    if spec.window == "none":
        return [f"sliding_window={config.sliding_window} (this architecture has none in llama.cpp)"]
    if spec.window == "all" and config.sliding_window_layers is not None:
        return [f"sliding_window_layers={list(config.sliding_window_layers)} (llama.cpp slides every layer)"]
    even = tuple(range(0, config.n_layers, 2))
    if spec.window == "even" and (config.sliding_window_layers or tuple(range(config.n_layers))) != even:
        return [f"sliding_window_layers={config.sliding_window_layers} (llama.cpp's gemma2 slides the even layers)"]
    return []


def _expert_problems(config: ModelConfig, arch: str, spec: Architecture) -> list[str]:
    if not config.n_experts:
        return ["n_experts=0 (this architecture is a mixture of experts)"] if arch.endswith("moe") else []
    if not spec.experts:
        return [f"n_experts={config.n_experts} (this architecture has no experts)"]
    out = []
    if config.moe_layers is not None:
        out.append(f"moe_layers={list(config.moe_layers)} (llama.cpp makes every layer a mixture)")
    if config.moe_renormalize != (spec.experts == "renormalized"):
        out.append(f"moe_renormalize={config.moe_renormalize} (llama.cpp's {arch} "
                   f"{'does' if spec.experts == 'renormalized' else 'does not'} renormalise)")
    if (spec.experts == "shared") != bool(config.d_ff_shared_expert and config.shared_expert_gate):
        out.append("shared expert: llama.cpp's qwen2moe has a gated one, the others none")
    if arch == "llama" and config.d_ff_expert != config.d_ff:
        out.append(f"d_ff_expert={config.d_ff_expert} (llama's experts are feed_forward_length={config.d_ff} wide)")
    if config.ffn != "glu":
        out.append("ffn='mlp' experts")
    return out


def _rope_problems(config: ModelConfig, arch: str) -> list[str]:
    out = []
    if arch in ROTARY_REORDERED and config.rotary_dim != config.head_dim:
        out.append(f"rotary_dim={config.rotary_dim} ({arch}'s rows are reordered over the whole head)")
    s = config.rope_scaling
    if s is not None and not (s.kind in ("linear", "yarn") or (s.kind == "llama3" and arch in ("llama", "qwen2", "qwen3"))):
        out.append(f"rope_scaling={s.kind!r} (anatomy writes linear, YaRN, and Llama 3's rule as rope_freqs)")
    if s is not None and s.kind == "yarn" and not (s.truncate and (s.beta_fast, s.beta_slow) == (32.0, 1.0)):
        out.append(f"rope_scaling yarn with truncate={s.truncate}, beta {s.beta_fast} / {s.beta_slow} (llama.cpp "
                   "floors and ceils the correction dims, with beta 32 / 1)")
    if arch == "gemma3":
        out += _gemma3_problems(config)
    if arch in GEMMA_27B_LAYERS:
        expected = score_scale(arch, config.n_layers, config.d_model // config.n_heads, config.head_dim)
        if config.attn_scale is None or not math.isclose(config.attn_scale, expected, rel_tol=1e-6):
            out.append(f"attn_scale={config.attn_scale} (llama.cpp's {arch} uses {expected:.6g})")
    if arch == "gemma2":
        if config.attn_softcap is None or config.logit_softcap is None:
            out.append("attn_softcap and logit_softcap (llama.cpp's gemma2 always soft-caps)")
    return out


def _gemma3_problems(config: ModelConfig) -> list[str]:
    out = []
    if config.sliding_rope_scaling is not None:
        out.append("sliding_rope_scaling (llama.cpp's gemma3 does not scale the sliding layers' RoPE)")
    if config.sliding_window is not None and config.sliding_rope_theta is None and config.rope_scaling is not None:
        out.append("rope_scaling on the sliding layers (llama.cpp's gemma3 scales the global layers only)")
    return out


def _architecture_of(config: ModelConfig) -> str:
    """The first GGUF architecture (of WRITE_ORDER) llama.cpp runs `config` with as anatomy does."""
    found = {arch: gguf_problems(config, arch) for arch in WRITE_ORDER}
    for arch, problems in found.items():
        if not problems:
            return arch
    closest = min(WRITE_ORDER, key=lambda arch: len(found[arch]))
    raise CheckpointError(f"no GGUF architecture llama.cpp runs expresses this config; the closest, {closest}, "
                          f"needs: {'; '.join(found[closest])}")
