"""LoRA: low-rank adapters on a decoder's projections, trained with the base frozen, run unmerged
or merged, and read and written as HF PEFT adapter directories (docs/training.md, section 5).

    config.py, adapter.py      LoraConfig (rank, alpha, dropout, targets q k v o gate up down); Adapter
    sites.py                   where each target is in anatomy's fused projections, and its HF (PEFT) name
    layer.py, apply.py         LoRALinear: base(x) + scale * B (A x) on row ranges; apply_lora, merge_lora
    peft.py, gguf.py, read.py  PEFT directories read and written, llama.cpp's GGUF LoRA read; load_adapter
    batched.py, slots.py       BatchedLoRA (rows of different adapters in one step); AdapterSlots (serve --lora)
"""

from anatomy.lora.adapter import Adapter, adapter_of, lora_layers
from anatomy.lora.apply import apply_lora, merge_lora
from anatomy.lora.config import DEFAULT_TARGETS, TARGETS, LoraConfig
from anatomy.lora.layer import LoRALinear
from anatomy.lora.peft import save_adapter
from anatomy.lora.read import load_adapter


__all__ = ["Adapter", "LoRALinear", "LoraConfig", "TARGETS", "DEFAULT_TARGETS", "adapter_of", "apply_lora",
           "load_adapter", "lora_layers", "merge_lora", "save_adapter"]
