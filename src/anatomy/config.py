"""ModelConfig: every architecture in the project is one set of values of these fields.

The fields are orthogonal choices (norm type, norm placement, FFN type, positions, GQA, biases,
tying ...). No code anywhere asks for a model's name: it asks for a field.
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

    norm: str = "layernorm"
    norm_eps: float = 1e-5
    norm_position: str = "pre"
    final_norm: bool = True  # a norm after the last block (Pre-Norm stacks need it)
    embedding_norm: bool = False  # a norm right after the embeddings (BERT)

    ffn: str = "mlp"
    activation: str = "gelu"

    position: str = "learned"
    max_seq_len: int = 2048
    rope_theta: float = 10000.0

    qkv_bias: bool = False
    attn_out_bias: bool = False
    ffn_bias: bool = False
    norm_bias: bool = True  # LayerNorm only: RMSNorm has no bias

    tie_embeddings: bool = True
    embedding_scale: bool = False  # multiply token embeddings by sqrt(D) (Vaswani et al.)
    lm_head_bias: bool = False  # a bias on the output logits (Marian's final_logits_bias)
    type_vocab_size: int = 0  # BERT segment embeddings; 0: none
    pooler: bool = False  # BERT pooler (dense + tanh on the first token)
    dropout: float = 0.0

    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    decoder_start_token_id: int | None = None

    def __post_init__(self) -> None:
        _validate(self)
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.d_model // self.n_heads)

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
    def kv_values_per_token(self) -> int:
        """KV-cache values one token costs: 2 (K and V) * cached layers * H_kv * d_h. GQA stores
        the H_kv heads only, and d_h is head_dim, which need not be D/H."""
        return 2 * self.cached_layers * self.n_kv_heads * self.head_dim

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
    if not 0.0 <= c.dropout < 1.0:
        raise ConfigError(f"dropout={c.dropout} must be in [0, 1)")
    if not c.norm_eps > 0:
        raise ConfigError(f"norm_eps={c.norm_eps} must be > 0")
    if not c.rope_theta > 0:
        raise ConfigError(f"rope_theta={c.rope_theta} must be > 0")
    for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
        value = getattr(c, name)
        if value is not None and not 0 <= value < c.vocab_size:
            raise ConfigError(f"{name}={value} is outside [0, vocab_size={c.vocab_size})")


def _check_choice(c: ModelConfig, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(c, name)
    if value not in choices:
        raise ConfigError(f"{name}={value!r} is not one of {', '.join(map(repr, choices))}")


def _check_types(c: ModelConfig) -> None:
    """Values read from JSON may be of any type: refuse the wrong ones before comparing them."""
    for name in ("n_decoder_layers", "type_vocab_size"):
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
