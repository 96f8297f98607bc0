"""Tiny models for the speculative-decoding tests: random ones of each kind of position and mask
rule, and hand-set Markov chains whose next-token distributions are known exactly."""

from __future__ import annotations

import math

import torch

from anatomy import ModelConfig, build_model, get_preset

TINY = dict(vocab_size=97, d_model=64, n_heads=4, max_seq_len=96, n_layers=2, n_kv_heads=2, d_ff=96)
KINDS = {
    "rope-gqa": dict(),
    "sliding-window": dict(sliding_window=4, sliding_window_layers=(0,)),
    "dynamic-ntk": dict(rope_scaling=dict(kind="dynamic", factor=2.0, original_max_seq_len=8)),
    "alibi": dict(position="alibi"),
    "qk-norm-softcap": dict(qk_norm=True, attn_softcap=20.0, logit_softcap=5.0),
}


def tiny(kind: str = "rope-gqa", seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(get_preset("llama-7b", **TINY, **KINDS[kind])).eval()


def gpt2_tiny(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(get_preset("gpt2", vocab_size=97, d_model=64, n_heads=4, max_seq_len=96, n_layers=2,
                                  d_ff=128, bos_token_id=1, eos_token_id=2)).eval()


def markov_decoder(chain: list[list[float]]) -> torch.nn.Module:
    """A decoder whose next-token distribution after token c is chain[c] whatever came before: one-hot
    embeddings, attention and FFN outputs zeroed, no final norm, log-probabilities in the LM head."""
    V = len(chain)
    config = ModelConfig(architecture="decoder", vocab_size=V, d_model=V, n_heads=1, d_ff=4, n_layers=1,
                         norm_position="pre", final_norm=False, position="none", tie_embeddings=False,
                         max_seq_len=64)
    model = build_model(config).eval()
    with torch.no_grad():
        block = model.stack.blocks[0]
        block.attn.out.weight.zero_()
        block.ffn.down.weight.zero_()
        model.stack.embed.tokens.weight.copy_(torch.eye(V))
        model.lm_head.weight.copy_(torch.tensor([[math.log(chain[c][n]) for c in range(V)] for n in range(V)]))
    return model
