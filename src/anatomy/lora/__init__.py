"""LoRA: low-rank adapters on a decoder's projections, trained with the base frozen, run unmerged
or merged, and read and written as HF PEFT adapter directories.

    config.py   LoraConfig: rank, alpha, dropout, targets (q, k, v, o, gate, up, down)
    sites.py    where each target is in anatomy's fused projections, and its HF (PEFT) name
    layer.py    LoRALinear: base(x) + scale * B (A x) on row ranges of the output
    adapter.py  Adapter: a LoraConfig and its tensors, checked
    apply.py    apply_lora, merge_lora
    peft.py     adapter_config.json + adapter_model.safetensors
    gguf.py     llama.cpp's GGUF LoRA file (convert_lora_to_gguf.py's output), read
    read.py     load_adapter: a PEFT directory or a GGUF file
    batched.py  BatchedLoRA: rows of different adapters in one step, the base product once
    slots.py    AdapterSlots: the adapters an engine serves at once, by name (anatomy serve --lora)
"""

from anatomy.lora.adapter import Adapter, adapter_of, lora_layers
from anatomy.lora.apply import apply_lora, merge_lora
from anatomy.lora.config import DEFAULT_TARGETS, TARGETS, LoraConfig
from anatomy.lora.layer import LoRALinear
from anatomy.lora.peft import save_adapter
from anatomy.lora.read import load_adapter


__all__ = ["Adapter", "LoRALinear", "LoraConfig", "TARGETS", "DEFAULT_TARGETS", "adapter_of", "apply_lora",
           "load_adapter", "lora_layers", "merge_lora", "save_adapter"]
