"""Mean token NLL of SmolLM2-135M with its linear layers run by chosen kernels, against fp32.

The reference is anatomy's fp32 model on the dequantized weights of the shipped Q4_1 GGUF. Each
configuration swaps every linear layer (30 x qkv, o, gate_up, down, and the tied LM head) for a
PlannedLinear fixed to one kernel, built from the file's own formats (int4 from Q4_1, int8g from
Q8_0; no requantization unless the row says so); everything else (attention, norms, RoPE) stays
fp32, and so does the residual stream (PlannedLinear returns float32). The text is the project's
README and docs, up to TOKENS tokens, one sequence; NLL is the mean over its next-token predictions.

    python -m benchmarks kernel_quality        (ANATOMY_BENCH_TOKENS=2048)
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import anatomy
from anatomy.checkpoints.gguf_reader import read_gguf
from anatomy.checkpoints.registry import resolve
from anatomy.weights.formats import Int4Weight, Int8Weight, WeightFormat
from anatomy.weights.gguf import matrix_formats, named
from anatomy.kernels.candidates import KERNELS_BY_NAME
from anatomy.kernels.planned_linear import PlannedLinear

MODEL = "smollm2-135m-instruct"
TOKENS = int(os.environ.get("ANATOMY_BENCH_TOKENS", "2048"))
ROOT = Path(__file__).resolve().parent.parent
HEAD = "embed.tokens.weight"  # name suffix: the tied embedding is the LM head

# (label, kernel for the blocks, kernel for the LM head, how the LM head is stored)
CONFIGS = [
    ("decode plan: int4pack + LM head int8g/int4x2", "int4pack", "int8g/int4x2", "file"),
    ("int4pack + LM head f16/fbgemm", "int4pack", "f16/fbgemm", "file"),
    ("int4pack + LM head bf16/onednn", "int4pack", "bf16/onednn", "file"),
    ("int4pack + LM head int8 per-channel (requantized), int8pack", "int4pack", "int8pack", "int8"),
    ("int4pack + LM head int4 g32 (requantized), int4pack", "int4pack", "int4pack", "int4"),
    ("prefill plan: bf16/onednn everywhere", "bf16/onednn", "bf16/onednn", "file"),
    ("f16 everywhere (F.linear)", "f16", "f16", "file"),
]


def text_ids(tokenizer) -> list[int]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    text = "\n\n".join(f.read_text() for f in files)
    return tokenizer.encode(text)[:TOKENS]


@torch.inference_mode()
def mean_nll(model: nn.Module, ids: torch.Tensor) -> float:
    logits = model(ids[None, :-1]).float()  # [1, S, V]
    return F.cross_entropy(logits[0], ids[1:]).item()


def swap(model: nn.Module, formats: dict[str, WeightFormat], block_kernel: str, head_kernel: str,
         head_storage: str) -> None:
    """Replace every linear module by a PlannedLinear fixed to one kernel."""
    head_name = named(formats, HEAD)
    for name, fmt in formats.items():
        if name == head_name:
            continue
        _set(model, name.removesuffix(".weight"), PlannedLinear.with_kernel(KERNELS_BY_NAME[block_kernel], fmt))
    head = formats[head_name]
    if head_storage == "int8":
        head = Int8Weight.from_float(head.dequantize(), label="lm_head int8")
    elif head_storage == "int4":
        head = Int4Weight.from_float(head.dequantize(), label="lm_head int4")
    _set(model, "lm_head", PlannedLinear.with_kernel(KERNELS_BY_NAME[head_kernel], head))


def _set(model: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, leaf = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, module)


def main() -> None:
    path = resolve(MODEL)
    tokenizer = anatomy.load_tokenizer(path)
    ids = torch.tensor(text_ids(tokenizer))
    formats = matrix_formats(read_gguf(path))
    reference = mean_nll(anatomy.load(path), ids)
    print(f"{len(ids)} tokens of the project's README and docs; fp32 reference NLL {reference:.4f}\n")
    print("| linear kernels | mean NLL | vs fp32 |\n|---|---|---|")
    for label, block_kernel, head_kernel, head_storage in CONFIGS:
        model = anatomy.load(path)
        swap(model, formats, block_kernel, head_kernel, head_storage)
        nll = mean_nll(model, ids)
        print(f"| {label} | {nll:.4f} | {(nll - reference) / reference:+.2%} |", flush=True)


if __name__ == "__main__":
    main()
