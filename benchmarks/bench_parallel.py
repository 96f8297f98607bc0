"""Tensor and pipeline parallelism on this machine, and predicted on named GPU clusters.

Measured: a LLaMA-shaped decoder with random fp32 weights (D 1024, 16 heads, 4 kv heads, 8 blocks,
F 2816, V 32000: 176 M parameters, big enough that a rank's GEMMs are real work) in one process with
all of the machine's cores (its decode step captured, as by default, and eager, as a sharded model's
runs), and on 2 gloo ranks (torchrun, 1/2 of the cores each) as TP=2 and PP=2, each in processes of
its own:
time to first token of a PROMPT-token prompt, decode tok/s over NEW greedy tokens, prefill tok/s of
PREFILL tokens (medians of REPEATS runs), and the collectives of one decode step as rank 0 issued
them. On a 2-core CPU the ranks share the cores and gloo's loopback TCP is the interconnect: TP=2 is
expected to be *slower* than one rank here (the same arithmetic split in two, plus 2 all-reduces per
block over a socket); the figures say by how much, honestly.

Predicted (`anatomy inspect --tensor-parallel N --pipeline-parallel M --interconnect NAME`): decode
and prefill of named models on named GPU clusters, with the share of the step spent communicating.

    python -m benchmarks parallel
    ANATOMY_BENCH_REPEATS=3 ANATOMY_BENCH_NEW=64 ANATOMY_BENCH_SMOKE=1 (a tiny model, a few tokens: a smoke run)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import anatomy
from anatomy import build_model, get_preset
from anatomy.analysis.hardware import get_hardware, get_interconnect
from anatomy.analysis.parallel import parallel_report
from anatomy.parallel.layout import Layout
from benchmarks import parallel_ranks

SMOKE = os.environ.get("ANATOMY_BENCH_SMOKE", "0") == "1"
REPEATS = int(os.environ.get("ANATOMY_BENCH_REPEATS", "1" if SMOKE else "3"))
PROMPT = 8 if SMOKE else 128
NEW = int(os.environ.get("ANATOMY_BENCH_NEW", "4" if SMOKE else "64"))
PREFILL = 16 if SMOKE else 512
SHAPE = (dict(vocab_size=512, d_model=64, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=128) if SMOKE else
         dict(vocab_size=32000, d_model=1024, n_heads=16, n_kv_heads=4, n_layers=8, d_ff=2816))
CLUSTERS = [  # (model, tensor-parallel, pipeline-parallel, interconnect, what)
    ("llama-70b", 8, 1, "nvlink4", "8 x H100 SXM, one HGX board"),
    ("llama-70b", 8, 1, "pcie5", "8 x H100 on PCIe 5"),
    ("llama-70b", 4, 2, "nvlink4", "2 boards' worth: TP 4 x PP 2 over NVLink"),
    ("llama-70b", 8, 2, "nvlink4,ib-ndr400", "2 x 8 H100: TP 8 on each board's NVLink, its 2 stages on InfiniBand"),
    ("llama-3-8b", 2, 1, "nvlink4", "2 x H100 SXM"),
    ("mixtral-8x7b", 8, 1, "nvlink4", "8 x H100 SXM"),
]


def main() -> None:
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        anatomy.save(build_model(get_preset("llama-7b", max_seq_len=2048, **SHAPE)), folder)
        rows = {}
        for name, tp, pp, capture in (("1 rank", 1, 1, 1), ("1 rank, eager step (as the ranks run)", 1, 1, 0),
                                      ("TP=2", 2, 1, 0), ("PP=2", 1, 2, 0)):
            rows[name] = _ranks(folder, tp, pp, Path(tmp) / f"{tp}x{pp}-{capture}.json", capture=capture)
    _print_measured(rows)
    _print_predicted()


def _ranks(folder: Path, tp: int, pp: int, out: Path, *, capture: int) -> dict:
    """One row, in processes of its own: one plain process with every core (`capture`: its decode steps
    replayed from captured graphs; a sharded model's run eagerly, a trace cannot hold the collectives'
    process groups), or tp x pp ranks under torchrun with 1/(tp x pp) of the cores each."""
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // (tp * pp)))}
    script = [str(Path(parallel_ranks.__file__)), str(folder), str(tp), str(pp), str(out), str(PROMPT), str(NEW),
              str(PREFILL), str(REPEATS), str(capture)]
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={tp * pp}"] if tp * pp > 1 else []
    subprocess.run([sys.executable, *launcher, *script], env=env, check=True, capture_output=True, text=True)
    return json.loads(out.read_text())


def _print_measured(rows: dict[str, dict]) -> None:
    one = rows["1 rank, eager step (as the ranks run)"]
    print(f"measured on this machine ({os.cpu_count()} cores), fp32, LLaMA-shaped {SHAPE}; "
          f"{REPEATS} runs, medians\n")
    print(f"| layout | threads per rank | TTFT {PROMPT} (ms) | decode tok/s | vs 1 rank eager "
          f"| prefill {PREFILL} tok/s | vs 1 rank eager | rank 0's weights read per decode step (MB) "
          "| collectives per decode step (rank 0) | bytes sent per decode step (rank 0) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['threads']} | {r['ttft_s'] * 1e3:.0f} | {r['decode_tok_s']:.1f} | "
              f"{r['decode_tok_s'] / one['decode_tok_s']:.2f}x | {r['prefill_tok_s']:.0f} | "
              f"{r['prefill_tok_s'] / one['prefill_tok_s']:.2f}x | {r['decode_weight_bytes_rank0'] / 1e6:.1f} | "
              f"{r['collectives']} | {r['message_bytes']:,} |")
    print("\n(the ranks share this machine's cores and talk over gloo on loopback TCP: the split buys memory "
          "per rank, not speed, here)")


def _print_predicted() -> None:
    h100 = get_hardware("h100-sxm")
    print("\npredicted (anatomy inspect --tensor-parallel N --pipeline-parallel M --interconnect NAME), bf16, "
          "batch 1, context 2048, prompt 512, on h100-sxm\n")
    print("| model | layout | interconnect | what | weights per rank (GB) | decode tok/s | decode: communicating | "
          "decode tok/s, stages overlapped | prefill 512 (ms) | prefill: communicating |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for model, tp, pp, link, what in CLUSTERS:
        within, _, between = link.partition(",")
        r = parallel_report(get_preset(model), Layout(tp=tp, pp=pp), hardware=h100, link=get_interconnect(within),
                            stage_link=get_interconnect(between or within), batch=1, seq=512, context=2048,
                            weight_dtype="bf16", kv_dtype="bf16", compute_dtype="bf16")
        d, p = r["decode"], r["prefill"]
        weights = max(x["weights_bytes"] for x in r["ranks"]) / 1e9
        print(f"| {model} | TP {tp} x PP {pp} | {link} | {what} | {weights:.1f} | {d['tokens_per_s']:.1f} | "
              f"{d['communication_share']:.0%} | {d['pipelined_tokens_per_s']:.1f} | {p['time_s'] * 1e3:.1f} | "
              f"{p['communication_share']:.0%} |")


if __name__ == "__main__":
    main()
