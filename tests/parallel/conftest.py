"""Tiny saved models of each family and a way to run the worker's ranks under torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import anatomy
from anatomy import build_model, get_preset

WORKER = Path(__file__).with_name("worker.py")
SMALL = dict(vocab_size=97, d_model=64, n_heads=4, max_seq_len=128)
# ranks sleep rather than spin at OpenMP barriers: on a shared 2-core machine spinning ranks slow each other down
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}


def tiny(kind: str) -> torch.nn.Module:
    """LLaMA-style GQA (4 query heads, 2 kv heads), MQA (1 kv head: replicated on both ranks), GPT-2-style
    (LayerNorm, learned positions, biases, tied head; a vocabulary of 97 that splits unevenly) and
    Mixtral-style (4 experts, 2 per token)."""
    torch.manual_seed(0)
    presets = {
        "llama": ("llama-7b", dict(n_layers=2, n_kv_heads=2, d_ff=128)),
        "mqa": ("llama-7b", dict(n_layers=2, n_kv_heads=1, d_ff=128)),
        "gpt2": ("gpt2", dict(n_layers=2, d_ff=128, bos_token_id=1, eos_token_id=2)),
        "mixtral": ("mixtral-8x7b", dict(n_layers=2, n_kv_heads=2, d_ff=128, n_experts=4)),
    }
    preset, extra = presets[kind]
    return build_model(get_preset(preset, **SMALL, **extra)).eval()


@pytest.fixture(scope="session")
def saved(tmp_path_factory):
    """{kind: directory} of each tiny model saved in the HF layout (the ranks load the same weights)."""
    root = tmp_path_factory.mktemp("parallel-models")
    out = {}
    for kind in ("llama", "mqa", "gpt2", "mixtral"):
        anatomy.save(tiny(kind), root / kind)
        out[kind] = root / kind
    return out


def run_ranks(cases: list[dict], out: Path, *, nproc: int, timeout: float = 900) -> dict[str, list[dict]]:
    """The worker's ranks under torchrun; {case name: [rank 0's results, rank 1's, ...]}. The timeout only
    stops a hung run from hanging the suite."""
    out.mkdir(parents=True, exist_ok=True)
    spec = out / "cases.json"
    spec.write_text(json.dumps(cases))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", str(WORKER),
           str(out), str(spec)]
    done = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"the ranks failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return {c["name"]: [torch.load(out / f"{c['name']}.rank{r}.pt", weights_only=True) for r in range(nproc)]
            for c in cases}
