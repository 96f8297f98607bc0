"""ModelConfig: every architecture in the project is one set of values of these fields.

The fields are orthogonal choices (norm type, norm placement, FFN type, positions, GQA, biases,
tying, sliding windows, mixture-of-experts ...). No code anywhere asks for a model's name: it asks
for a field. What varies from layer to layer (which layers attend through a sliding window, which
FFNs are mixtures of experts) is data too: a tuple of layer indices.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from anatomy.errors import ConfigError

ARCHITECTURES = ("decoder", "encoder", "encoder-decoder")
NORMS = ("layernorm", "rmsnorm")
NORM_POSITIONS = ("pre", "post")
FFNS = ("mlp", "glu")
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu")
POSITIONS = ("sinusoidal", "learned", "rope", "alibi", "none")
ROPE_SCALINGS = ("linear", "dynamic", "yarn", "llama3", "longrope")
ROUTER_SCORINGS = ("softmax", "sigmoid")


@dataclass(frozen=True, kw_only=True)
class RopeScaling:
    """How RoPE reaches past the context it was trained at (`kind`; the fields each kind reads):

        linear    every frequency / factor (positions interpolated)                       factor
        dynamic   NTK: when a pass reaches past original_max_seq_len, the base grows with
                  the length it reaches (base * (factor*len/orig - factor + 1)^(d/(d-2)))  factor, original_max_seq_len
        yarn      per frequency, a ramp between interpolation (/factor) and extrapolation
                  between beta_fast and beta_slow rotations; cos/sin x attention_factor   factor, original_max_seq_len,
                                                                                          beta_fast, beta_slow, truncate
        llama3    Llama 3.1: wavelengths above orig/low_freq_factor / factor, below
                  orig/high_freq_factor unchanged, a smooth blend in between              factor, low/high_freq_factor,
                                                                                          original_max_seq_len
        longrope  per-frequency divisors: short_factor up to original_max_seq_len,
                  long_factor past it (Phi-3); cos/sin x attention_factor                 short/long_factor
    """

    kind: str
    factor: float = 1.0
    original_max_seq_len: int | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float = 1.0
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("short_factor", "long_factor"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        _validate_rope_scaling(self)


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """A Transformer, decoder-only, encoder-only or encoder-decoder, as data.

    Notation used in shape comments: B batch, S sequence, D d_model, H n_heads, H_kv n_kv_heads,
    d_h head_dim, F d_ff, V vocab_size, L n_layers, T context length.
    """

    architecture: str = "decoder"
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int | None = None  # None: n_heads (MHA); 1: MQA; in between: GQA
    head_dim: int | None = None  # None: d_model // n_heads
    d_ff: int
    n_decoder_layers: int = 0  # encoder-decoder only: layers of the decoder stack
    sliding_window: int | None = None  # a query sees itself and the sliding_window - 1 keys before it
    sliding_window_layers: tuple[int, ...] | None = None  # the layers that use it; None: all

    norm: str = "layernorm"
    norm_eps: float = 1e-5
    norm_position: str = "pre"
    final_norm: bool = True  # a norm after the last block (Pre-Norm stacks need it)
    embedding_norm: bool = False  # a norm right after the embeddings (BERT)
    norm_unit_offset: bool = False  # RMSNorm scales by (1 + weight) (Gemma): weights start at zero
    branch_output_norm: bool = False  # a norm on each sublayer's output before the residual add (Gemma 2)
    qk_norm: bool = False  # RMSNorm over each head's d_h on q and k, before RoPE (Qwen3, Gemma 3)

    ffn: str = "mlp"
    activation: str = "gelu"
    n_experts: int = 0  # > 0: the FFN is a mixture of n_experts experts (of d_ff_expert each)
    n_experts_per_token: int = 0  # k: experts a router picks per token (softmax, then top-k)
    d_ff_expert: int | None = None  # None: d_ff
    moe_renormalize: bool = True  # the k routing weights are divided by their sum (Mixtral)
    moe_layers: tuple[int, ...] | None = None  # the layers whose FFN is the mixture; None: all (others: d_ff)
    d_ff_shared_expert: int = 0  # > 0: every token also goes through one shared expert of this width
    shared_expert_gate: bool = False  # the shared expert's output x sigmoid(a learned D -> 1 gate)
    router_aux_loss_coef: float = 0.0  # training: coefficient of the load-balancing loss
    router_bias: bool = False  # the router's logits have a bias (gpt-oss)
    router_scoring: str = "softmax"  # the router's scores: "softmax" over the experts, or each one's "sigmoid"
    router_groups: int = 1  # > 1: experts in groups; a token picks among the best router_topk_groups groups
    router_topk_groups: int = 1  # (a group's score: the sum of its two best experts', DeepSeek-V3)
    router_score_bias: bool = False  # a bias added to the scores for choosing only (DeepSeek-V3's balancing)
    routed_scaling: float = 1.0  # the routed experts' weights are multiplied by this
    swiglu_limit: float | None = None  # gpt-oss's clamped SwiGLU: gate <= L, |up| <= L, gate*sigmoid(a*gate)*(up+1)
    swiglu_alpha: float = 1.0  # a, the sigmoid's gain in that SwiGLU

    position: str = "learned"
    max_seq_len: int = 2048
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    sliding_rope_theta: float | None = None  # the sliding-window layers' own RoPE base (Gemma 3); None: rope_theta
    sliding_rope_scaling: RopeScaling | None = None  # and their scaling, with sliding_rope_theta (None: unscaled)
    nope_layers: tuple[int, ...] | None = None  # layers whose attention has no position encoding (SmolLM3)
    rotary_dim: int | None = None  # dims of each head RoPE rotates (the first ones); None: head_dim
    attn_scale: float | None = None  # multiplier of q.k; None: 1/sqrt(head_dim)
    attn_softcap: float | None = None  # scores -> cap * tanh(scores / cap) before the mask (Gemma 2)
    logit_softcap: float | None = None  # output logits -> cap * tanh(logits / cap) (Gemma 2)
    attn_sinks: bool = False  # a learned logit per head joins each softmax, with no value (gpt-oss)
    kv_lora_rank: int = 0  # > 0: multi-head latent attention (DeepSeek): keys and values from a cached latent
    q_lora_rank: int = 0  # > 0: queries through a bottleneck of this width (q_a, RMSNorm, q_b)
    v_head_dim: int | None = None  # the values' head width, with latent attention (None: head_dim)
    rope_interleaved: bool = False  # RoPE rotates dims (2i, 2i + 1) together, not (i, i + d/2) (DeepSeek)

    qkv_bias: bool = False
    attn_out_bias: bool = False
    ffn_bias: bool = False
    norm_bias: bool = True  # LayerNorm only: RMSNorm has no bias

    tie_embeddings: bool = True
    embedding_scale: bool = False  # multiply token embeddings by sqrt(D) (Vaswani et al.)
    lm_head_bias: bool = False  # a bias on the output logits (Marian's final_logits_bias)
    type_vocab_size: int = 0  # BERT segment embeddings; 0: none
    pooler: bool = False  # BERT pooler (dense + tanh on the first token)
    n_labels: int = 0  # > 0: a sequence-classification head on the pooler (BERT cross-encoders); encoder only
    dropout: float = 0.0

    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    decoder_start_token_id: int | None = None

    def __post_init__(self) -> None:
        _normalize(self)
        _validate(self)
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.d_model // self.n_heads)
        if self.rotary_dim is None and self.position == "rope":
            object.__setattr__(self, "rotary_dim", self.head_dim)
        if self.d_ff_expert is None and self.n_experts:
            object.__setattr__(self, "d_ff_expert", self.d_ff)

    # -- derived sizes -------------------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        """Width of the query projection output, H * d_h."""
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of each of the key and value projection outputs, H_kv * d_h."""
        return self.n_kv_heads * self.head_dim

    @property
    def cached_layers(self) -> int:
        """Layers that keep a self-attention KV cache when generating: every layer of a decoder-only
        model, the decoder stack of an encoder-decoder, none of an encoder (it does not decode)."""
        if self.is_encoder:
            return 0
        return self.n_decoder_layers if self.is_seq2seq else self.n_layers

    @property
    def latent(self) -> bool:
        """Multi-head latent attention: the cache holds each token's latent and RoPE key, no heads."""
        return self.kv_lora_rank > 0

    @property
    def kv_values_per_layer(self) -> int:
        """Cache values one token costs a layer: K and V of H_kv heads of d_h (GQA stores the H_kv heads
        only); with latent attention its latent and RoPE key (kv_lora_rank + rotary_dim, DeepSeek's 576)."""
        if self.latent:
            return self.kv_lora_rank + self.rotary_dim
        return 2 * self.n_kv_heads * self.head_dim

    @property
    def kv_values_per_token(self) -> int:
        """KV-cache values one token costs: kv_values_per_layer * cached layers."""
        return self.cached_layers * self.kv_values_per_layer

    @property
    def kv_scales_per_token(self) -> int:
        """Scales one token costs in an 8-bit KV cache: one per cached layer, K and V, and KV head."""
        return 2 * self.cached_layers * self.n_kv_heads

    def kv_values(self, tokens: int) -> int:
        """KV-cache values a sequence of `tokens` needs when each layer keeps only what it can still
        attend to: all tokens, or at most sliding_window of them on a sliding-window layer."""
        per_layer = self.kv_values_per_layer
        layers = range(self.cached_layers)
        return sum(per_layer * min(tokens, self.layer_window(i) or tokens) for i in layers)

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of one layer of the (decoder) stack, or None: it attends to everything."""
        if self.sliding_window is None:
            return None
        chosen = self.sliding_window_layers
        return self.sliding_window if chosen is None or layer in chosen else None

    def layer_rotates(self, layer: int) -> bool:
        """Does this layer's attention rotate q and k (RoPE and not one of nope_layers)?"""
        return self.position == "rope" and (self.nope_layers is None or layer not in self.nope_layers)

    def layer_rope(self, layer: int) -> str:
        """Which angles the layer rotates by: "none", "sliding" (its window's own RoPE base) or "main"."""
        if not self.layer_rotates(layer):
            return "none"
        return "sliding" if self.sliding_rope_theta is not None and self.layer_window(layer) else "main"

    def layer_is_moe(self, layer: int) -> bool:
        """Is the FFN of this layer a mixture of experts (else a dense FFN of width d_ff)?"""
        return self.n_experts > 0 and (self.moe_layers is None or layer in self.moe_layers)

    @property
    def n_moe_layers(self) -> int:
        return sum(self.layer_is_moe(i) for i in range(self.n_layers))

    @property
    def is_decoder(self) -> bool:
        return self.architecture == "decoder"

    @property
    def is_encoder(self) -> bool:
        return self.architecture == "encoder"

    @property
    def is_seq2seq(self) -> bool:
        return self.architecture == "encoder-decoder"

    @property
    def causal(self) -> bool:
        """Does the main stack mask the future? (the decoder-only stack does)"""
        return self.architecture == "decoder"

    def with_layers(self, layers: list[int] | tuple[int, ...] | range) -> ModelConfig:
        """A config of len(layers) layers whose layer j is built like layer layers[j] of this one (its
        window and FFN kind kept): the per-layer lists are renumbered."""
        def renumbered(chosen: tuple[int, ...] | None) -> tuple[int, ...] | None:
            return None if chosen is None else tuple(j for j, i in enumerate(layers) if i in chosen)

        return self.replace(n_layers=len(layers), sliding_window_layers=renumbered(self.sliding_window_layers),
                            moe_layers=renumbered(self.moe_layers), nope_layers=renumbered(self.nope_layers))

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelConfig:
        if not isinstance(values, dict):
            raise ConfigError(f"a ModelConfig is made from a dict of its fields, got {type(values).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown ModelConfig field(s) {unknown}; known fields: {sorted(known)}")
        return cls(**values)


def _normalize(c: ModelConfig) -> None:
    """Values read from JSON arrive as lists and dicts: make them the tuples and RopeScaling the
    fields hold (frozen and hashable)."""
    for name in ("sliding_window_layers", "moe_layers", "nope_layers"):
        value = getattr(c, name)
        if isinstance(value, list):
            object.__setattr__(c, name, tuple(value))
    for name in ("rope_scaling", "sliding_rope_scaling"):
        value = getattr(c, name)
        if isinstance(value, dict):
            try:
                object.__setattr__(c, name, RopeScaling(**value))
            except TypeError as e:
                raise ConfigError(f"{name}={value!r}: {e}") from None


def _validate(c: ModelConfig) -> None:
    _check_choice(c, "architecture", ARCHITECTURES)
    _check_choice(c, "norm", NORMS)
    _check_choice(c, "norm_position", NORM_POSITIONS)
    _check_choice(c, "ffn", FFNS)
    _check_choice(c, "activation", ACTIVATIONS)
    _check_choice(c, "position", POSITIONS)
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_seq_len"):
        _check_positive(c, name)
    for name in ("n_kv_heads", "head_dim"):
        if getattr(c, name) is not None:
            _check_positive(c, name)
    _check_types(c)
    if c.head_dim is None and c.d_model % c.n_heads:
        raise ConfigError(f"d_model={c.d_model} is not divisible by n_heads={c.n_heads} (set head_dim to decouple them)")
    if c.n_kv_heads is not None and c.n_heads % c.n_kv_heads:
        raise ConfigError(f"n_heads={c.n_heads} is not divisible by n_kv_heads={c.n_kv_heads}")
    head_dim = c.head_dim if c.head_dim is not None else c.d_model // c.n_heads
    if c.position == "rope" and head_dim % 2:
        raise ConfigError(f"head_dim={head_dim} must be even for position='rope'")
    if c.position == "sinusoidal" and c.d_model % 2:
        raise ConfigError(f"d_model={c.d_model} must be even for position='sinusoidal'")
    if c.architecture == "encoder-decoder" and c.n_decoder_layers <= 0:
        raise ConfigError(f"n_decoder_layers={c.n_decoder_layers} must be > 0 for architecture='encoder-decoder'")
    if c.architecture != "encoder-decoder" and c.n_decoder_layers:
        raise ConfigError(f"n_decoder_layers={c.n_decoder_layers} is only for architecture='encoder-decoder'")
    if c.type_vocab_size < 0:
        raise ConfigError(f"type_vocab_size={c.type_vocab_size} must be >= 0")
    if c.n_labels < 0 or (c.n_labels and not (c.architecture == "encoder" and c.pooler)):
        raise ConfigError(f"n_labels={c.n_labels} must be 0, or > 0 for architecture='encoder' with pooler=True")
    if not 0.0 <= c.dropout < 1.0:
        raise ConfigError(f"dropout={c.dropout} must be in [0, 1)")
    if not c.norm_eps > 0:
        raise ConfigError(f"norm_eps={c.norm_eps} must be > 0")
    if not c.rope_theta > 0:
        raise ConfigError(f"rope_theta={c.rope_theta} must be > 0")
    _validate_rope(c, head_dim)
    _validate_attention_extras(c)
    _validate_latent(c, head_dim)
    _validate_layers(c)
    _validate_moe(c)
    for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
        value = getattr(c, name)
        if value is not None and not 0 <= value < c.vocab_size:
            raise ConfigError(f"{name}={value} is outside [0, vocab_size={c.vocab_size})")


def _validate_rope(c: ModelConfig, head_dim: int) -> None:
    if c.rotary_dim is not None:
        _check_positive(c, "rotary_dim")
        if c.position != "rope":
            raise ConfigError(f"rotary_dim={c.rotary_dim} is only for position='rope'")
        if c.rotary_dim % 2 or c.rotary_dim > head_dim:
            raise ConfigError(f"rotary_dim={c.rotary_dim} must be even and <= head_dim={head_dim}")
    _validate_sliding_rope(c)
    for name in ("rope_scaling", "sliding_rope_scaling"):
        scaling = getattr(c, name)
        if scaling is None:
            continue
        if not isinstance(scaling, RopeScaling):
            raise ConfigError(f"{name}={scaling!r} must be a RopeScaling or None")
        if c.position != "rope":
            raise ConfigError(f"{name}={scaling.kind!r} is only for position='rope'")
        pairs = (c.rotary_dim or head_dim) // 2
        for part in ("short_factor", "long_factor"):
            factors = getattr(scaling, part)
            if factors is not None and len(factors) != pairs:
                raise ConfigError(f"{name}.{part} has {len(factors)} entries; rotary_dim/2 = {pairs} needed")


def _validate_sliding_rope(c: ModelConfig) -> None:
    """A RoPE base of the sliding-window layers' own: for a RoPE model with sliding-window layers."""
    theta = c.sliding_rope_theta
    if theta is None:
        if c.sliding_rope_scaling is not None:
            raise ConfigError("sliding_rope_scaling is set but sliding_rope_theta is None")
        return
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        raise ConfigError(f"sliding_rope_theta={theta!r} must be a positive number or None")
    if c.position != "rope" or c.sliding_window is None:
        raise ConfigError(f"sliding_rope_theta={theta} is the RoPE base of sliding-window layers: it needs "
                          f"position='rope' (position={c.position!r}) and a sliding_window "
                          f"(sliding_window={c.sliding_window})")


def _validate_rope_scaling(r: RopeScaling) -> None:
    if r.kind not in ROPE_SCALINGS:
        raise ConfigError(f"rope_scaling kind={r.kind!r} is not one of {', '.join(map(repr, ROPE_SCALINGS))}")
    numbers = ("factor", "beta_fast", "beta_slow", "attention_factor", "low_freq_factor", "high_freq_factor")
    for name in numbers:
        value = getattr(r, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
            raise ConfigError(f"rope_scaling.{name}={value!r} must be a positive number")
    needs = {"dynamic": ("original_max_seq_len",), "yarn": ("original_max_seq_len",),
             "llama3": ("original_max_seq_len", "low_freq_factor", "high_freq_factor"),
             "longrope": ("original_max_seq_len", "short_factor", "long_factor")}.get(r.kind, ())
    for name in needs:
        if getattr(r, name) is None:
            raise ConfigError(f"rope_scaling kind={r.kind!r} needs {name}")
    if r.original_max_seq_len is not None and (isinstance(r.original_max_seq_len, bool)
                                               or not isinstance(r.original_max_seq_len, int)
                                               or r.original_max_seq_len <= 0):
        raise ConfigError(f"rope_scaling.original_max_seq_len={r.original_max_seq_len!r} must be a positive integer")
    if r.kind == "llama3" and not r.high_freq_factor > r.low_freq_factor:
        raise ConfigError(f"rope_scaling.high_freq_factor={r.high_freq_factor} must be > "
                          f"low_freq_factor={r.low_freq_factor}")
    for name in ("short_factor", "long_factor"):
        factors = getattr(r, name)
        if factors is not None and not all(isinstance(f, (int, float)) and not isinstance(f, bool) and f > 0
                                           for f in factors):
            raise ConfigError(f"rope_scaling.{name} must be a list of positive numbers")


def _validate_attention_extras(c: ModelConfig) -> None:
    for name in ("attn_scale", "attn_softcap", "logit_softcap"):
        value = getattr(c, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
            raise ConfigError(f"{name}={value!r} must be a positive number or None")
    if c.norm_unit_offset and c.norm != "rmsnorm":
        raise ConfigError(f"norm_unit_offset=True is for norm='rmsnorm' (norm={c.norm!r})")
    if c.qk_norm and c.norm != "rmsnorm":
        raise ConfigError(f"qk_norm=True normalises q and k with RMSNorm: it needs norm='rmsnorm' (norm={c.norm!r})")
    if c.branch_output_norm and c.norm_position != "pre":
        raise ConfigError("branch_output_norm=True (a norm on each sublayer's output) needs norm_position='pre'")
    if c.swiglu_limit is not None:
        limit = c.swiglu_limit
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit > 0:
            raise ConfigError(f"swiglu_limit={limit!r} must be a positive number or None")
        if c.ffn != "glu" or c.activation != "silu":
            raise ConfigError(f"swiglu_limit={limit} clamps a SwiGLU: it needs ffn='glu' and activation='silu' "
                              f"(ffn={c.ffn!r}, activation={c.activation!r})")
    alpha = c.swiglu_alpha
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
        raise ConfigError(f"swiglu_alpha={alpha!r} must be a positive number")
    if alpha != 1.0 and c.swiglu_limit is None:
        raise ConfigError(f"swiglu_alpha={alpha} is the gain of the clamped SwiGLU: it needs swiglu_limit")


def _validate_latent(c: ModelConfig, head_dim: int) -> None:
    """Latent attention: sizes, RoPE on the last rotary_dim dims of each q/k head, a decoder."""
    for name in ("kv_lora_rank", "q_lora_rank"):
        value = getattr(c, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{name}={value!r} must be an integer >= 0")
    if c.v_head_dim is not None:
        _check_positive(c, "v_head_dim")
    if not c.kv_lora_rank:
        extras = {"q_lora_rank": c.q_lora_rank, "v_head_dim": c.v_head_dim}
        for name, value in extras.items():
            if value:
                raise ConfigError(f"{name}={value!r} is for latent attention: it needs kv_lora_rank > 0")
        return
    if not c.is_decoder or c.position != "rope" or c.rotary_dim is None or c.rotary_dim >= head_dim:
        raise ConfigError(f"kv_lora_rank={c.kv_lora_rank}: latent attention is for RoPE decoders whose heads have "
                          f"dims without RoPE (rotary_dim={c.rotary_dim} < head_dim={head_dim})")
    if c.qkv_bias or c.qk_norm or c.attn_softcap is not None or c.attn_sinks or c.sliding_window is not None:
        raise ConfigError(f"kv_lora_rank={c.kv_lora_rank}: latent attention has no q/k/v biases, q/k norm, "
                          "soft-cap, sinks or window in anatomy")


def _validate_layers(c: ModelConfig) -> None:
    """Sliding windows and per-layer choices: causal decoders only, layer indices in range."""
    if c.sliding_window is not None:
        _check_positive(c, "sliding_window")
        if not c.causal:
            raise ConfigError(f"sliding_window={c.sliding_window} is for causal decoders "
                              f"(architecture={c.architecture!r})")
    elif c.sliding_window_layers is not None:
        raise ConfigError("sliding_window_layers is set but sliding_window is None")
    if c.nope_layers is not None and c.position != "rope":
        raise ConfigError(f"nope_layers={c.nope_layers!r} names layers without RoPE: it needs position='rope' "
                          f"(position={c.position!r})")
    for name in ("sliding_window_layers", "moe_layers", "nope_layers"):
        layers = getattr(c, name)
        if layers is None:
            continue
        if not isinstance(layers, tuple) or not all(isinstance(i, int) and not isinstance(i, bool) for i in layers):
            raise ConfigError(f"{name}={layers!r} must be a list of layer indices or None")
        if list(layers) != sorted(set(layers)) or any(not 0 <= i < c.n_layers for i in layers):
            raise ConfigError(f"{name}={list(layers)} must be increasing layer indices in [0, n_layers={c.n_layers})")


def _validate_moe(c: ModelConfig) -> None:
    for name in ("n_experts", "n_experts_per_token", "d_ff_shared_expert"):
        value = getattr(c, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{name}={value!r} must be an integer >= 0")
    coef = c.router_aux_loss_coef
    if isinstance(coef, bool) or not isinstance(coef, (int, float)) or coef < 0:
        raise ConfigError(f"router_aux_loss_coef={coef!r} must be a number >= 0")
    if not c.n_experts:
        extras = {"n_experts_per_token": c.n_experts_per_token, "d_ff_expert": c.d_ff_expert,
                  "moe_layers": c.moe_layers, "d_ff_shared_expert": c.d_ff_shared_expert, "router_bias": c.router_bias}
        for name, value in extras.items():
            if value:
                raise ConfigError(f"{name}={value!r} needs n_experts > 0 (a mixture-of-experts FFN)")
        routing = dict(router_scoring="softmax", router_groups=1, router_topk_groups=1, router_score_bias=False,
                       routed_scaling=1.0)
        for name, value in routing.items():
            if getattr(c, name) != value:
                raise ConfigError(f"{name}={getattr(c, name)!r} needs n_experts > 0 (a mixture-of-experts FFN)")
        return
    if not c.is_decoder:
        raise ConfigError(f"n_experts={c.n_experts}: mixture-of-experts FFNs are for decoders "
                          f"(architecture={c.architecture!r})")
    if not 1 <= c.n_experts_per_token <= c.n_experts:
        raise ConfigError(f"n_experts_per_token={c.n_experts_per_token} must be in [1, n_experts={c.n_experts}]")
    if c.d_ff_expert is not None:
        _check_positive(c, "d_ff_expert")
    if c.shared_expert_gate and not c.d_ff_shared_expert:
        raise ConfigError("shared_expert_gate=True needs a shared expert (d_ff_shared_expert > 0)")
    _check_choice(c, "router_scoring", ROUTER_SCORINGS)
    for name in ("router_groups", "router_topk_groups"):
        _check_positive(c, name)
    if c.n_experts % c.router_groups or c.router_topk_groups > c.router_groups:
        raise ConfigError(f"router_groups={c.router_groups}, router_topk_groups={c.router_topk_groups}: the "
                          f"groups must divide n_experts={c.n_experts} and the chosen be at most the groups")
    scale = c.routed_scaling
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise ConfigError(f"routed_scaling={scale!r} must be a positive number")


def _check_choice(c: ModelConfig, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(c, name)
    if value not in choices:
        raise ConfigError(f"{name}={value!r} is not one of {', '.join(map(repr, choices))}")


def _check_types(c: ModelConfig) -> None:
    """Values read from JSON may be of any type: refuse the wrong ones before comparing them."""
    for name in ("n_decoder_layers", "type_vocab_size", "n_labels"):
        value = getattr(c, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name}={value!r} must be an integer")
    for name in ("norm_eps", "rope_theta", "dropout"):
        value = getattr(c, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{name}={value!r} must be a number")
    for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
        value = getattr(c, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"{name}={value!r} must be an integer or None")


def _check_positive(c: ModelConfig, name: str) -> None:
    value = getattr(c, name)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name}={value!r} must be a positive integer")
