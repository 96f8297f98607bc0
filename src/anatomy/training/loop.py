"""The training loop: one optimizer step = the global batch split over ranks and micro-steps,
losses summed and divided by the global number of target tokens (so 2 ranks x b rows compute the
same loss and gradients as 1 rank x 2b rows), clipping, a non-finite guard, AdamW, then the
periodic evaluation, metrics line and checkpoint.

Rank 0 writes a line of metrics.jsonl (training/metrics.py) per step, evaluation and skipped step.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from torch import Tensor, nn

from anatomy.errors import AnatomyError
from anatomy.training.checkpoint import save_checkpoint
from anatomy.training.data import Dataset, rank_rows, step_generator
from anatomy.training.distributed import Dist, all_reduce_sum, gradient_sync
from anatomy.training.metrics import Metrics
from anatomy.training.objectives import IGNORE, Objective
from anatomy.training.optim import Schedule, clip_gradients, set_lr


@dataclass(frozen=True, kw_only=True)
class Settings:
    steps: int
    batch_size: int  # sequences per optimizer step, over all ranks and micro-steps
    seq_len: int
    accum: int = 1
    seed: int = 0
    grad_clip: float = 1.0
    eval_every: int = 0
    eval_steps: int = 10
    save_every: int = 0
    keep: int = 3
    label_smoothing: float = 0.0
    max_nonfinite: int = 10
    progress: bool = True


@dataclass
class TrainState:
    step: int = 0
    tokens: int = 0
    nonfinite_total: int = 0
    nonfinite_run: int = 0
    val_loss: float | None = None
    best_val: float | None = None

    @classmethod
    def from_trainer(cls, trainer: dict[str, Any]) -> TrainState:
        return cls(**{k: trainer[k] for k in asdict(cls()) if k in trainer})


@dataclass(kw_only=True)
class Run:
    """Everything a training run works with, built by the `anatomy train` command."""

    model: nn.Module  # the unwrapped model (FSDP2 shards it in place)
    wrapped: nn.Module  # what forward/backward runs through (DDP wrapper, or the model)
    optimizer: torch.optim.Optimizer
    schedule: Schedule
    objective: Objective
    data: Dataset
    info: Dist
    out: Path
    flops_per_token: float
    peak_flops: float


class NonFiniteError(AnatomyError):
    """Too many non-finite steps in a row."""


def train(run: Run, settings: Settings, state: TrainState) -> TrainState:
    metrics = Metrics(run.out / "metrics.jsonl", enabled=run.info.is_main)
    with _progress_bar(enabled=run.info.is_main and settings.progress) as bar:
        task = bar.add_task("train", total=settings.steps, completed=state.step, loss="-", tok_s="-", mfu="-")
        if settings.eval_every and state.step == 0:  # the starting point of the validation curve
            _record_eval(run, settings, state, metrics)
        while state.step < settings.steps:
            start = time.perf_counter()
            record = _optimizer_step(run, settings, state)
            record["tok_s"] = record.pop("processed") / (time.perf_counter() - start)
            record["mfu"] = run.flops_per_token * record["tok_s"] / (run.peak_flops * run.info.world)
            metrics.write(record)
            bar.update(task, completed=state.step, loss=_fmt(record.get("loss")),
                       tok_s=f"{record['tok_s']:,.0f}", mfu=f"{100 * record['mfu']:.1f}%")
            _after_step(run, settings, state, metrics)
    return state


def _after_step(run: Run, settings: Settings, state: TrainState, metrics: Metrics) -> None:
    last = state.step == settings.steps
    if settings.eval_every and (state.step % settings.eval_every == 0 or last):
        _record_eval(run, settings, state, metrics)
    if last or (settings.save_every and state.step % settings.save_every == 0):
        save(run, settings, state)


def _record_eval(run: Run, settings: Settings, state: TrainState, metrics: Metrics) -> None:
    state.val_loss = evaluate(run, settings)
    state.best_val = state.val_loss if state.best_val is None else min(state.best_val, state.val_loss)
    metrics.write({"step": state.step, "val_loss": state.val_loss, "val_ppl": math.exp(min(state.val_loss, 50))})


def save(run: Run, settings: Settings, state: TrainState) -> Path | None:
    trainer = {**asdict(state), "seed": settings.seed, "schedule": run.schedule.to_dict(), "world": run.info.world,
               "objective": run.objective.name, "data_position": {"seed": settings.seed, "next_step": state.step}}
    written = save_checkpoint(run.out, wrapped=run.wrapped, model=run.model, optimizer=run.optimizer, trainer=trainer,
                              tokenizer=run.data.tokenizer, info=run.info, keep=settings.keep)
    if written is None and run.info.is_main:
        print(f"step {state.step}: weights are not finite; no checkpoint written, the previous one is kept")
    return written


def _optimizer_step(run: Run, settings: Settings, state: TrainState) -> dict[str, Any]:
    step = state.step
    lr = run.schedule(step)
    set_lr(run.optimizer, lr)
    batches = _micro_batches(run, settings, step)
    device = run.info.device
    n_targets = float(all_reduce_sum(torch.tensor(sum(_targets(b) for b in batches), dtype=torch.float64,
                                                  device=device), run.info))
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    for micro, batch in enumerate(batches):
        with gradient_sync(run.wrapped, enabled=micro == len(batches) - 1), _autocast(device):
            total, _ = run.objective.loss(run.wrapped, batch, label_smoothing=settings.label_smoothing)
            (total * (run.info.world / n_targets)).backward()  # ranks average gradients: x world
        loss_sum += total.detach().double()
    loss = float(all_reduce_sum(loss_sum, run.info)) / n_targets
    grad_norm = float(clip_gradients(run.model, settings.grad_clip))
    processed = int(all_reduce_sum(torch.tensor(sum(_processed(b) for b in batches), device=device), run.info))
    state.step += 1
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
        return _skip(run, settings, state, loss=loss, grad_norm=grad_norm, processed=processed)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    state.nonfinite_run = 0
    state.tokens += processed
    return {"step": state.step, "loss": loss, "lr": lr, "grad_norm": grad_norm, "tokens": state.tokens,
            "processed": processed}


def _skip(run: Run, settings: Settings, state: TrainState, *, loss: float, grad_norm: float,
          processed: int) -> dict[str, Any]:
    """Drop the gradients of a non-finite step; stop after max_nonfinite such steps in a row."""
    run.optimizer.zero_grad(set_to_none=True)
    state.nonfinite_total += 1
    state.nonfinite_run += 1
    if state.nonfinite_run >= settings.max_nonfinite:
        raise NonFiniteError(
            f"stopped at step {state.step}: {state.nonfinite_run} steps in a row had a non-finite loss or "
            f"gradient norm (last loss {loss}, grad norm {grad_norm}); the weights were not updated by them and "
            "the last checkpoint is intact. Lower --lr, raise --warmup or set --grad-clip.")
    return {"step": state.step, "skipped": True, "loss": _finite_or_none(loss), "grad_norm": _finite_or_none(grad_norm),
            "nonfinite": state.nonfinite_total, "tokens": state.tokens, "processed": processed}


def _micro_batches(run: Run, settings: Settings, step: int) -> list[dict[str, Tensor]]:
    """This rank's micro-batches of a step: its rows of the global batch the (seed, step) RNG drew."""
    draws = run.objective.draw(step_generator(settings.seed, step), settings.batch_size, run.data.train)
    info = run.info
    return [_to(run.objective.batch(run.data.train, _rows(draws, rank_rows(settings.batch_size, rank=info.rank,
                                                                         world=info.world, accum=settings.accum,
                                                                         micro=m))), info.device)
            for m in range(settings.accum)]


def evaluate(run: Run, settings: Settings) -> float:
    """Mean loss over eval_steps fixed validation batches (the same ones at every evaluation)."""
    rows = settings.batch_size // settings.accum
    info = run.info
    total = torch.zeros((), dtype=torch.float64, device=info.device)
    count = torch.zeros((), dtype=torch.float64, device=info.device)
    run.wrapped.eval()
    with torch.no_grad(), _autocast(info.device):
        for i in range(settings.eval_steps):
            draws = run.objective.draw(step_generator(settings.seed, i, stream=1), rows, run.data.val)
            batch = run.objective.batch(run.data.val, _rows(draws, rank_rows(rows, rank=info.rank, world=info.world,
                                                                            accum=1, micro=0)))
            s, n = run.objective.loss(run.wrapped, _to(batch, info.device))
            total += s.double()
            count += n.double()
    run.wrapped.train()
    return float(all_reduce_sum(total, info) / all_reduce_sum(count, info))


def _to(batch: dict[str, Tensor], device: torch.device) -> dict[str, Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def compute_dtype(device: torch.device) -> str:
    """What training computes in: bf16 (autocast; the parameters stay f32) on a GPU that supports it,
    f32 elsewhere (CPUs without bf16 units run bf16 matmuls far slower)."""
    return "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "f32"


def _autocast(device: torch.device) -> contextlib.AbstractContextManager:
    if compute_dtype(device) == "bf16":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _rows(draws: dict[str, np.ndarray], rows: slice) -> dict[str, np.ndarray]:
    return {k: v[rows] for k, v in draws.items()}


def _targets(batch: dict[str, Tensor]) -> int:
    return int((batch["labels"] != IGNORE).sum())


def _processed(batch: dict[str, Tensor]) -> int:
    """Tokens the model read: every input position (text), or real source + target tokens (pairs)."""
    if "input_ids" in batch:
        return batch["input_ids"].numel()
    return int(batch["src_mask"].sum()) + _targets(batch)


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _fmt(x: float | None) -> str:
    return "nan" if x is None else f"{x:.4f}"


def _progress_bar(*, enabled: bool) -> Progress:
    return Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("loss {task.fields[loss]}"),
                    TextColumn("{task.fields[tok_s]} tok/s"), TextColumn("MFU {task.fields[mfu]}"), TimeElapsedColumn(),
                    disable=not enabled)
