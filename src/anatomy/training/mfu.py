"""Model FLOPs utilisation: the FLOPs a training step must do, over what the hardware can do.

FLOPs per trained token come from the anatomy module (`analysis.flops.training_flops_per_token`:
3 x the matmuls of a forward pass, attention included, about 6N + 12·L·T·D for a decoder). The peak
is measured by `analysis.hardware.measure_matmul_peak`: a large fp32 (bf16 on GPU) matmul with
this process's threads.
"""

from __future__ import annotations

from anatomy.analysis.flops import training_flops_per_token
from anatomy.config import ModelConfig


def flops_per_token(config: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token the model reads. The analysis counts a seq2seq forward per target
    token with as many source tokens; a token here is either one, hence the half."""
    per_token = training_flops_per_token(config, seq=seq_len)["three_forward"]
    return per_token / 2 if config.is_seq2seq else per_token
