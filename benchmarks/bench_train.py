"""Training speed: anatomy's GPT-2-style DecoderLM against HF transformers' GPT2LMHeadModel with
the same config, batch, loss and AdamW, in the same run. One optimizer step = forward, backward,
grad clipping, AdamW. Rounds alternate between the two models; medians of the step times.

MFU = (6N + 12·L·T·D) FLOPs per token x tokens/s / the fp32 matmul peak measured here.
"""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

from benchmarks.timing import median_seconds

ROUNDS = 3
CONFIGS = (  # (label, layers, heads, D, context, batch, steps per round): nanoGPT's CPU config, a larger one
    ("nanoGPT CPU (L4 H4 D128 T64 B12)", 4, 4, 128, 64, 12, 8),
    ("L6 H6 D384 T256 B8", 6, 6, 384, 256, 8, 1),
)
VOCAB = 65  # character-level Shakespeare


def _ours(layers: int, heads: int, d: int, ctx: int) -> torch.nn.Module:
    from anatomy import build_model, get_preset

    config = get_preset("gpt2", n_layers=layers, n_heads=heads, d_model=d, d_ff=4 * d, vocab_size=VOCAB,
                        max_seq_len=ctx, bos_token_id=None, eos_token_id=None, dropout=0.0)
    return build_model(config).train()


def _hf(layers: int, heads: int, d: int, ctx: int) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=layers, n_head=heads, n_embd=d, n_inner=4 * d, vocab_size=VOCAB, n_positions=ctx,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config).train()


def _stepper(model: torch.nn.Module, *, hf: bool, batch: tuple[torch.Tensor, torch.Tensor]):
    from anatomy.training.optim import make_optimizer

    opt = make_optimizer(model, lr=1e-4, weight_decay=0.1)
    x, y = batch

    def step() -> None:
        logits = model(x).logits if hf else model(x)  # [B, T, V]
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _measure(label: str, layers: int, heads: int, d: int, ctx: int, batch: int, steps_per_round: int, *, peak: float,
             compile_ours: bool):
    from anatomy.training.mfu import flops_per_token

    torch.manual_seed(0)
    data = torch.randint(0, VOCAB, (batch, ctx + 1))
    xy = (data[:, :-1], data[:, 1:])
    ours, hf = _ours(layers, heads, d, ctx), _hf(layers, heads, d, ctx)
    n_ours = sum(p.numel() for p in ours.parameters())
    n_hf = sum(p.numel() for p in hf.parameters())
    assert n_ours == n_hf, (n_ours, n_hf)  # the same model, counted two ways
    if compile_ours:
        ours.compile()
    steps = {"ours": _stepper(ours, hf=False, batch=xy), "hf": _stepper(hf, hf=True, batch=xy)}
    for step in steps.values():
        median_seconds(step, 2)  # warm-up (and compilation)
    times: dict[str, list[float]] = {"ours": [], "hf": []}
    for _ in range(ROUNDS):
        for name, step in steps.items():
            times[name].append(median_seconds(step, steps_per_round))
    tokens = batch * ctx
    fpt = flops_per_token(ours.config, ctx)
    tok_s = {name: tokens / statistics.median(t) for name, t in times.items()}
    return (label + (" compiled (ours)" if compile_ours else " eager"), f"{n_ours / 1e6:.2f} M",
            f"{tok_s['ours']:,.0f}", f"{tok_s['hf']:,.0f}", f"{tok_s['ours'] / tok_s['hf']:.2f}x",
            f"{100 * fpt * tok_s['ours'] / peak:.1f}%", f"{100 * fpt * tok_s['hf'] / peak:.1f}%")


def main() -> None:
    from anatomy.analysis.hardware import measure_matmul_peak

    peak = measure_matmul_peak(torch.device("cpu"), size=2048, repeats=3)
    table = Table(title=f"training tokens/s, fp32, {torch.get_num_threads()} threads, AdamW + clipping "
                        f"(fp32 matmul peak measured: {peak / 1e9:.0f} GFLOP/s)")
    for column in ("config", "params", "anatomy tok/s", "HF GPT2LMHeadModel tok/s", "ratio", "MFU anatomy", "MFU HF"):
        table.add_column(column, justify="left" if column == "config" else "right")
    for label, *shape in CONFIGS:
        table.add_row(*_measure(label, *shape, peak=peak, compile_ours=False))
    label, *shape = CONFIGS[0]
    table.add_row(*_measure(label, *shape, peak=peak, compile_ours=True))
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
