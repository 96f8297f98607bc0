"""ModelConfig <-> GGUF metadata (`{arch}.block_count`, `{arch}.attention.head_count`, ...).

Reading checks every value it uses: the right type, positive where a size, within limits; a
metadata set that makes no valid model is a CheckpointError of the file naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from anatomy.checkpoints.gguf_reader import GGUFFile
from anatomy.checkpoints.gguf_types import ValueType
from anatomy.config import ModelConfig
from anatomy.errors import CheckpointError, ConfigError

# RoPE models compute positions on the fly, so a long context costs nothing at load time; but a KV
# cache sized by max_seq_len would. Above this the value is taken to be corrupt, not ambitious.
MAX_CONTEXT = 1 << 24


@dataclass(frozen=True)
class Architecture:
    """What a GGUF architecture fixes about the model, and where its norm epsilon lives."""

    fields: dict[str, Any]
    eps_key: str


ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture(
        fields={"norm": "rmsnorm", "ffn": "glu", "activation": "silu", "position": "rope"},
        eps_key="attention.layer_norm_rms_epsilon"),
    "gpt2": Architecture(
        fields={"norm": "layernorm", "ffn": "mlp", "activation": "gelu_tanh", "position": "learned",
                "qkv_bias": True, "attn_out_bias": True, "ffn_bias": True},
        eps_key="attention.layer_norm_epsilon"),
}

# the GGUF key each config field comes from (for error messages), `{a}` standing for the architecture
_FIELD_KEYS = {
    "n_layers": "{a}.block_count", "d_model": "{a}.embedding_length", "d_ff": "{a}.feed_forward_length",
    "n_heads": "{a}.attention.head_count", "n_kv_heads": "{a}.attention.head_count_kv",
    "head_dim": "{a}.attention.key_length", "max_seq_len": "{a}.context_length", "rope_theta": "{a}.rope.freq_base",
    "vocab_size": "{a}.vocab_size", "bos_token_id": "tokenizer.ggml.bos_token_id",
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
    """The ModelConfig the file's metadata describes (tied head when there is no `output.weight`)."""
    a = gguf_architecture(f)
    d_model = _size(f, f"{a}.embedding_length")
    n_heads = _size(f, f"{a}.attention.head_count")
    values = dict(
        ARCHITECTURES[a].fields,
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
        bos_token_id=_token_id(f, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_token_id(f, "tokenizer.ggml.eos_token_id"),
        pad_token_id=_token_id(f, "tokenizer.ggml.padding_token_id"),
    )
    _check_sizes_fit_tensors(f, a, values)
    if ARCHITECTURES[a].fields["position"] == "rope":
        values["rope_theta"] = _positive_float(f, f"{a}.rope.freq_base", default=10000.0)
        _check_rope(f, a, values["head_dim"] or d_model // n_heads)
    return _build(f, a, values)


def _check_sizes_fit_tensors(f: GGUFFile, arch: str, values: dict[str, Any]) -> None:
    """Sizes a corrupt file could inflate (2^31 layers, a head_dim of 2^40) would make even a
    meta-device build allocate: each must fit in the tensors the file really holds. Every model
    size appears as (or bounds) some tensor dimension, and every layer has tensors of its own."""
    if not f.tensors:
        raise f.fail("tensor_count", 0, "the file holds no tensors (a vocabulary-only GGUF?), so no model")
    largest = max(max(t.shape) for t in f.tensors.values())
    for field in ("vocab_size", "d_model", "d_ff", "n_heads", "n_kv_heads", "head_dim"):
        if values[field] is not None and values[field] > largest:
            raise f.fail(_FIELD_KEYS[field].format(a=arch), values[field],
                         f"larger than every tensor dimension in the file (the largest is {largest})")
    if values["n_layers"] > len(f.tensors):
        raise f.fail(f"{arch}.block_count", values["n_layers"], f"more layers than the file's {len(f.tensors)} tensors")


def _biases(f: GGUFFile, arch: str) -> dict[str, bool]:
    """llama-architecture files may carry Q/K/V and output biases (the tensors say so)."""
    if arch != "llama":
        return {}
    return {"qkv_bias": "blk.0.attn_q.bias" in f.tensors, "attn_out_bias": "blk.0.attn_output.bias" in f.tensors}


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


def _check_rope(f: GGUFFile, arch: str, head_dim: int) -> None:
    dims = _size(f, f"{arch}.rope.dimension_count", default=head_dim)
    if dims != head_dim:
        raise f.fail(f"{arch}.rope.dimension_count", dims,
                     f"partial rotary embeddings are not supported (head_dim is {head_dim})")
    scaling = _get(f, f"{arch}.rope.scaling.type", {ValueType.STRING}, "none")
    if scaling != "none":
        raise f.fail(f"{arch}.rope.scaling.type", scaling, "RoPE scaling is not supported; supported: none")


def config_to_gguf(config: ModelConfig) -> tuple[str, list[tuple[str, ValueType, Any]]]:
    """(architecture, [(key, type, value)]) describing `config` for llama.cpp."""
    arch = _architecture_of(config)
    u32, f32 = ValueType.UINT32, ValueType.FLOAT32
    entries = [
        ("general.architecture", ValueType.STRING, arch),
        (f"{arch}.context_length", u32, config.max_seq_len),
        (f"{arch}.embedding_length", u32, config.d_model),
        (f"{arch}.feed_forward_length", u32, config.d_ff),
        (f"{arch}.block_count", u32, config.n_layers),
        (f"{arch}.attention.head_count", u32, config.n_heads),
        (f"{arch}.{ARCHITECTURES[arch].eps_key}", f32, config.norm_eps),
    ]
    if config.position == "rope":
        entries += [(f"{arch}.attention.head_count_kv", u32, config.n_kv_heads),
                    (f"{arch}.rope.freq_base", f32, config.rope_theta),
                    (f"{arch}.rope.dimension_count", u32, config.head_dim),
                    (f"{arch}.vocab_size", u32, config.vocab_size)]
        if config.head_dim * config.n_heads != config.d_model:
            entries += [(f"{arch}.attention.key_length", u32, config.head_dim),
                        (f"{arch}.attention.value_length", u32, config.head_dim)]
    return arch, entries


def _architecture_of(config: ModelConfig) -> str:
    """The GGUF architecture whose fixed fields `config` has (llama-style or gpt2-style decoders)."""
    plain_heads = config.n_kv_heads == config.n_heads and config.head_dim * config.n_heads == config.d_model
    for arch, spec in ARCHITECTURES.items():
        fits = config.is_decoder and all(getattr(config, k) == v for k, v in spec.fields.items())
        if fits and (arch != "gpt2" or plain_heads):  # gpt2 in llama.cpp has no GQA or head_dim keys
            return arch
    raise CheckpointError(
        "GGUF export supports decoders in the style of " + " or ".join(
            f"{a} ({', '.join(f'{k}={v!r}' for k, v in s.fields.items())})" for a, s in ARCHITECTURES.items())
        + f"; this config has architecture={config.architecture!r}, norm={config.norm!r}, ffn={config.ffn!r}, "
          f"position={config.position!r}")
