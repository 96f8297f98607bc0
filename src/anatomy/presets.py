"""Named configurations. A preset is only a set of ModelConfig field values."""

from __future__ import annotations

import difflib
from typing import Any

from anatomy.config import ModelConfig, RopeScaling
from anatomy.errors import ConfigError
from anatomy.layers.rope_scaling import yarn_mscale

# Vaswani et al. 2017, "Attention Is All You Need": Post-LN, ReLU, sinusoidal, shared embeddings.
_TRANSFORMER = dict(
    architecture="encoder-decoder", vocab_size=37000, n_layers=6, n_decoder_layers=6,
    norm="layernorm", norm_eps=1e-6, norm_position="post", final_norm=False, ffn="mlp",
    activation="relu", position="sinusoidal", max_seq_len=1024, qkv_bias=True, attn_out_bias=True,
    ffn_bias=True, tie_embeddings=True, embedding_scale=True, dropout=0.1,
    pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=0,
)

# Devlin et al. 2018: Post-LN, GELU, learned positions, segment embeddings, embedding LayerNorm.
_BERT = dict(
    architecture="encoder", vocab_size=30522, norm="layernorm", norm_eps=1e-12, norm_position="post",
    final_norm=False, embedding_norm=True, ffn="mlp", activation="gelu", position="learned",
    max_seq_len=512, qkv_bias=True, attn_out_bias=True, ffn_bias=True, tie_embeddings=True,
    type_vocab_size=2, pooler=True, dropout=0.1, pad_token_id=0,
)

# Radford et al. 2019: Pre-LN, GELU (tanh), learned positions, biases everywhere, tied head.
_GPT2 = dict(
    architecture="decoder", vocab_size=50257, norm="layernorm", norm_eps=1e-5, norm_position="pre",
    ffn="mlp", activation="gelu_tanh", position="learned", max_seq_len=1024, qkv_bias=True,
    attn_out_bias=True, ffn_bias=True, tie_embeddings=True, bos_token_id=50256, eos_token_id=50256,
)

# Touvron et al. 2023: Pre-RMSNorm, SwiGLU, RoPE, no biases, untied head.
_LLAMA = dict(
    architecture="decoder", vocab_size=32000, norm="rmsnorm", norm_eps=1e-6, norm_position="pre",
    ffn="glu", activation="silu", position="rope", max_seq_len=2048, rope_theta=10000.0,
    tie_embeddings=False, bos_token_id=1, eos_token_id=2,
)

# The decoders people download today: LLaMA plus a few orthogonal parts each (public config.json values).
_MISTRAL = dict(_LLAMA, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, d_ff=14336, norm_eps=1e-5,
                max_seq_len=32768)
_QWEN = dict(_LLAMA, norm_eps=1e-6, rope_theta=1e6, bos_token_id=151643, eos_token_id=151645)



def _gemma3(*, n_layers: int, **sizes: Any) -> dict[str, Any]:
    """A Gemma 3 config: every 6th layer global, the others sliding; q/k norms; scores / sqrt(head_dim)."""
    return {**_LLAMA, "head_dim": 256, "activation": "gelu_tanh", "tie_embeddings": True, "embedding_scale": True,
            "norm_unit_offset": True, "branch_output_norm": True, "qk_norm": True, "attn_scale": 256 ** -0.5,
            "rope_theta": 1e6, "sliding_rope_theta": 10000.0, "n_layers": n_layers,
            "sliding_window_layers": tuple(i for i in range(n_layers) if (i + 1) % 6),
            "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1, **sizes}


def _gpt_oss(*, n_layers: int, n_experts: int) -> dict[str, Any]:
    return {**_LLAMA, "vocab_size": 201088, "d_model": 2880, "n_layers": n_layers, "n_heads": 64, "n_kv_heads": 8,
            "head_dim": 64, "d_ff": 2880, "norm_eps": 1e-5, "max_seq_len": 131072, "rope_theta": 150000.0,
            "rope_scaling": RopeScaling(kind="yarn", factor=32.0, original_max_seq_len=4096, truncate=False,
                                        attention_factor=yarn_mscale(32.0)),
            "sliding_window": 128, "sliding_window_layers": tuple(range(0, n_layers, 2)), "attn_sinks": True,
            "qkv_bias": True, "attn_out_bias": True, "ffn_bias": True, "n_experts": n_experts,
            "n_experts_per_token": 4, "router_bias": True, "swiglu_limit": 7.0, "swiglu_alpha": 1.702,
            "bos_token_id": 199998, "eos_token_id": 200002, "pad_token_id": 199999}


def _deepseek(*, mscale_all_dim: float, **fields: Any) -> dict[str, Any]:
    gain = yarn_mscale(40.0, mscale_all_dim)
    return {**_LLAMA, "head_dim": 192, "rotary_dim": 64, "kv_lora_rank": 512, "v_head_dim": 128,
            "rope_interleaved": True, "max_seq_len": 163840,
            "rope_scaling": RopeScaling(kind="yarn", factor=40.0, original_max_seq_len=4096),
            "attn_scale": 192 ** -0.5 * gain * gain, **fields}


PRESETS: dict[str, dict[str, Any]] = {
    "transformer-base": {**_TRANSFORMER, "d_model": 512, "n_heads": 8, "d_ff": 2048},
    "transformer-big": {**_TRANSFORMER, "d_model": 1024, "n_heads": 16, "d_ff": 4096, "dropout": 0.3},
    "bert-base": {**_BERT, "d_model": 768, "n_layers": 12, "n_heads": 12, "d_ff": 3072},
    "bert-large": {**_BERT, "d_model": 1024, "n_layers": 24, "n_heads": 16, "d_ff": 4096},
    "gpt2": {**_GPT2, "d_model": 768, "n_layers": 12, "n_heads": 12, "d_ff": 3072},
    "gpt2-medium": {**_GPT2, "d_model": 1024, "n_layers": 24, "n_heads": 16, "d_ff": 4096},
    "gpt2-large": {**_GPT2, "d_model": 1280, "n_layers": 36, "n_heads": 20, "d_ff": 5120},
    "gpt2-xl": {**_GPT2, "d_model": 1600, "n_layers": 48, "n_heads": 25, "d_ff": 6400},
    "llama-7b": {**_LLAMA, "d_model": 4096, "n_layers": 32, "n_heads": 32, "d_ff": 11008},
    "llama-13b": {**_LLAMA, "d_model": 5120, "n_layers": 40, "n_heads": 40, "d_ff": 13824},
    "llama-70b": {**_LLAMA, "d_model": 8192, "n_layers": 80, "n_heads": 64, "n_kv_heads": 8,
                  "d_ff": 28672, "norm_eps": 1e-5, "max_seq_len": 4096},
    "llama-2-7b": {**_LLAMA, "d_model": 4096, "n_layers": 32, "n_heads": 32, "d_ff": 11008,
                   "norm_eps": 1e-5, "max_seq_len": 4096},
    "llama-3-8b": {**_LLAMA, "vocab_size": 128256, "d_model": 4096, "n_layers": 32, "n_heads": 32,
                   "n_kv_heads": 8, "d_ff": 14336, "norm_eps": 1e-5, "max_seq_len": 8192,
                   "rope_theta": 500000.0, "bos_token_id": 128000, "eos_token_id": 128001},
    "smollm2-135m": {**_LLAMA, "vocab_size": 49152, "d_model": 576, "n_layers": 30, "n_heads": 9,
                     "n_kv_heads": 3, "d_ff": 1536, "norm_eps": 1e-5, "max_seq_len": 8192,
                     "rope_theta": 100000.0, "tie_embeddings": True, "bos_token_id": 1,
                     "eos_token_id": 2},
    # Llama 3.1: Llama 3 with the 3.1 frequency rule stretching 8k to 128k positions
    "llama-3.1-8b": {**_LLAMA, "vocab_size": 128256, "d_model": 4096, "n_layers": 32, "n_heads": 32,
                     "n_kv_heads": 8, "d_ff": 14336, "norm_eps": 1e-5, "max_seq_len": 131072,
                     "rope_theta": 500000.0, "bos_token_id": 128000, "eos_token_id": 128001,
                     "rope_scaling": RopeScaling(kind="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                                 original_max_seq_len=8192)},
    # Llama 3.2 1B: Llama 3.1's shape scaled down, tied head (the 1B-class config `anatomy profile` is measured on)
    "llama-3.2-1b": {**_LLAMA, "vocab_size": 128256, "d_model": 2048, "n_layers": 16, "n_heads": 32,
                     "n_kv_heads": 8, "d_ff": 8192, "norm_eps": 1e-5, "max_seq_len": 131072,
                     "rope_theta": 500000.0, "tie_embeddings": True, "bos_token_id": 128000, "eos_token_id": 128001,
                     "rope_scaling": RopeScaling(kind="llama3", factor=32.0, low_freq_factor=1.0,
                                                 high_freq_factor=4.0, original_max_seq_len=8192)},
    # Mistral 7B v0.1: a 4096-token sliding window on every layer
    "mistral-7b": {**_MISTRAL, "sliding_window": 4096},
    # Mixtral 8x7B: every FFN a mixture of 8 experts, 2 per token
    "mixtral-8x7b": {**_MISTRAL, "rope_theta": 1e6, "n_experts": 8, "n_experts_per_token": 2,
                     "router_aux_loss_coef": 0.02},
    # Qwen2.5-7B: biases on q, k and v only
    "qwen2.5-7b": {**_QWEN, "vocab_size": 152064, "d_model": 3584, "n_layers": 28, "n_heads": 28, "n_kv_heads": 4,
                   "d_ff": 18944, "max_seq_len": 32768, "qkv_bias": True},
    # Qwen3-8B: RMSNorm of each q and k head, head_dim decoupled from D/H
    "qwen3-8b": {**_QWEN, "vocab_size": 151936, "d_model": 4096, "n_layers": 36, "n_heads": 32, "n_kv_heads": 8,
                 "head_dim": 128, "d_ff": 12288, "max_seq_len": 40960, "qk_norm": True},
    # Gemma 2 9B: (1 + w) RMSNorm before and after each sublayer, GeGLU, x sqrt(D) embeddings, tied head,
    # soft-capped scores and logits, a 4096-token window on every other layer
    "gemma-2-9b": {**_LLAMA, "vocab_size": 256000, "d_model": 3584, "n_layers": 42, "n_heads": 16, "n_kv_heads": 8,
                   "head_dim": 256, "d_ff": 14336, "max_seq_len": 8192, "activation": "gelu_tanh",
                   "tie_embeddings": True, "embedding_scale": True, "norm_unit_offset": True,
                   "branch_output_norm": True, "attn_scale": 256 ** -0.5, "attn_softcap": 50.0,
                   "logit_softcap": 30.0, "sliding_window": 4096, "sliding_window_layers": tuple(range(0, 42, 2)),
                   "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1},
    # Gemma 3: Gemma 2's block with RMSNorm of each q and k head and no soft-caps; 5 sliding-window layers
    # (their own RoPE base, 10k) to each global one (1M), a 262k vocabulary
    "gemma-3-270m": _gemma3(vocab_size=262144, d_model=640, n_layers=18, n_heads=4, n_kv_heads=1, d_ff=2048,
                            max_seq_len=32768, sliding_window=512),
    "gemma-3-1b": _gemma3(vocab_size=262144, d_model=1152, n_layers=26, n_heads=4, n_kv_heads=1, d_ff=6912,
                          max_seq_len=32768, sliding_window=512),
    # (4B: the language model of Gemma3ForConditionalGeneration; the global layers' RoPE stretched 8x)
    "gemma-3-4b": _gemma3(vocab_size=262208, d_model=2560, n_layers=34, n_heads=8, n_kv_heads=4, d_ff=10240,
                          max_seq_len=131072, sliding_window=1024, rope_scaling=RopeScaling(kind="linear", factor=8.0)),
    # SmolLM3-3B: Llama 3's shape at 3B with no RoPE on every 4th layer (NoPE), tied head
    "smollm3-3b": {**_LLAMA, "vocab_size": 128256, "d_model": 2048, "n_layers": 36, "n_heads": 16, "n_kv_heads": 4,
                   "d_ff": 11008, "max_seq_len": 65536, "rope_theta": 5e6, "tie_embeddings": True,
                   "nope_layers": tuple(range(3, 36, 4)), "bos_token_id": 128000, "eos_token_id": 128001,
                   "pad_token_id": 128004},
    # gpt-oss: attention sinks, a 128-token window on every other layer, experts with biases and a clamped
    # SwiGLU on every layer (4 of 32 / 128 per token), a router bias, YaRN x32 from 4k positions
    "gpt-oss-20b": _gpt_oss(n_layers=24, n_experts=32),
    "gpt-oss-120b": _gpt_oss(n_layers=36, n_experts=128),
    # DeepSeek: latent attention (a 512-wide latent and a 64-dim RoPE key cached per token and layer), shared
    # experts after dense first layers, YaRN x40 whose mscale also scales the scores
    "deepseek-v3": _deepseek(vocab_size=129280, d_model=7168, n_layers=61, n_heads=128, d_ff=18432, q_lora_rank=1536,
                             n_experts=256, n_experts_per_token=8, d_ff_expert=2048, d_ff_shared_expert=2048,
                             moe_layers=tuple(range(3, 61)), moe_renormalize=True, router_scoring="sigmoid",
                             router_groups=8, router_topk_groups=4, router_score_bias=True, routed_scaling=2.5,
                             mscale_all_dim=1.0, bos_token_id=0, eos_token_id=1),
    "deepseek-v2-lite": _deepseek(vocab_size=102400, d_model=2048, n_layers=27, n_heads=16, d_ff=10944,
                                  n_experts=64, n_experts_per_token=6, d_ff_expert=1408, d_ff_shared_expert=2816,
                                  moe_layers=tuple(range(1, 27)), moe_renormalize=False, mscale_all_dim=0.707,
                                  bos_token_id=100000, eos_token_id=100001),
    # Phi-3-mini-4k: a 2047-token sliding window, the LLaMA shape otherwise
    "phi-3-mini": {**_LLAMA, "vocab_size": 32064, "d_model": 3072, "n_layers": 32, "n_heads": 32, "d_ff": 8192,
                   "norm_eps": 1e-5, "max_seq_len": 4096, "sliding_window": 2047, "bos_token_id": 1,
                   "eos_token_id": 32000, "pad_token_id": 32000},
}


def preset_names() -> list[str]:
    return sorted(PRESETS)


def get_preset(name: str, **overrides: Any) -> ModelConfig:
    """The ModelConfig of a named preset, with optional field overrides."""
    if not isinstance(name, str):
        raise ConfigError(f"a preset name is a string, got {type(name).__name__}: {name!r:.80}")
    if name not in PRESETS:
        close = difflib.get_close_matches(name, PRESETS, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"unknown preset {name!r}{hint} (presets: {', '.join(preset_names())})")
    return ModelConfig.from_dict({**PRESETS[name], **overrides})
