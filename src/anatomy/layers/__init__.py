"""The parts every architecture is built from. Nothing here imports from models/ or above."""

from anatomy.layers.attention import Attention, attend
from anatomy.layers.block import Block
from anatomy.layers.ffn import GLU, MLP, make_ffn
from anatomy.layers.norm import LayerNorm, RMSNorm, make_norm
from anatomy.layers.position import LearnedPositions, Rotary, SinusoidalPositions, alibi_bias, alibi_slopes, apply_rope

__all__ = [
    "Attention", "attend", "Block", "GLU", "MLP", "make_ffn", "LayerNorm", "RMSNorm", "make_norm",
    "LearnedPositions", "Rotary", "SinusoidalPositions", "alibi_bias", "alibi_slopes", "apply_rope",
]
