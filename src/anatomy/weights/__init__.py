"""Weights that stay small: a model's matrices in compact formats, and the modules that hold them.

    formats.py   WeightFormat: f32/f16/bf16, int8 (per channel), int8g (GGUF Q8_0), int4 (Q4_0/Q4_1/Q4_K),
                 int5 (Q5_0/Q5_1/Q5_K)
    int6.py      int6: GGUF Q6_K's blocks as stored (6-bit codes, int8 sub-scales, float16 d)
    split.py     row runs in formats of their own (a fused q/k/v of Q4_K and Q6_K parts)
    gguf_blocks.py  each GGUF block type in the format that holds it exactly
    gguf.py      a GGUF file's matrices as formats, under the model's parameter names (no requantizing)
    modules.py   CompactLinear / CompactEmbedding: a linear layer or token table holding a format;
                 SplitLinear: a split weight's runs as layers of their own (an engine's)
    choice.py    the `weights=` choice of anatomy.load: which format each matrix gets

A model with compact weights stays an ordinary model: its forward computes the reference product
(each weight dequantized, then F.linear: exact with respect to what is stored, not fast), saving
writes float tensors, and it reports its real bytes. The inference engine runs the kernels its
measured plan chose on the same formats (kernels/plan.py, kernels/planned_linear.py).
"""
