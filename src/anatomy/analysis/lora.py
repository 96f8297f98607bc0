"""The anatomy of a LoRA adapter on a config: its parameters per target, its bytes, the FLOPs its
products add per token, and the training state it needs against full fine-tuning.

    params per site   r * (in + out)               (A [r, in], B [out, r])
    FLOPs per token   2 * r * (in + out) per site  (x A^T, then (x A^T) B^T)
    training state    full: 16 B per parameter (weights, gradients, AdamW moments; memory.training_state)
                      LoRA: the frozen base's weights at --dtype + 16 B per adapter parameter
Activations are about the same either way (the base's backward still runs) and are not counted.
"""

from __future__ import annotations

from typing import Any

from anatomy.analysis.memory import training_state, weights_bytes
from anatomy.config import ModelConfig
from anatomy.lora.config import TARGETS, LoraConfig
from anatomy.lora.sites import sites


def lora_report(config: ModelConfig, lora: LoraConfig, *, total_params: int, dtype: str, compute_dtype: str
                ) -> dict[str, Any]:
    chosen = sites(config, lora, hf_names=False)
    by_target = {t: sum(lora.rank * (s.in_features + s.out_features) for s in chosen if s.target == t)
                 for t in TARGETS if t in lora.targets}
    n = sum(by_target.values())
    full = training_state(total_params, dtype=compute_dtype).total
    adapted = weights_bytes(total_params, dtype) + training_state(n, dtype=compute_dtype).total
    return {
        "rank": lora.rank, "targets": list(lora.targets), "layers": len({s.layer for s in chosen}),
        "sites": len(chosen), "params": n, "params_by_target": by_target, "fraction_of_model": n / total_params,
        "bytes_f32": weights_bytes(n, "f32"), "flops_per_token": 2 * n,
        "training_state_full_bytes": full, "training_state_lora_bytes": adapted,
        "training_state_saving_bytes": full - adapted, "training_state_ratio": full / adapted,
    }
