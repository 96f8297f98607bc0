"""`anatomy train`: text (or source/target pairs) to a trained model, resumable, on 1..N ranks.

    anatomy train --data shakespeare.txt --tokenizer chars --model gpt2 --n-layers 4 --n-heads 4 \\
        --d-model 128 --d-ff 512 --seq-len 64 --batch-size 12 --steps 2000 --out runs/shakespeare
    anatomy train ... --out runs/shakespeare --resume           # continue from the latest checkpoint
    anatomy train ... --nproc 2 --strategy fsdp                 # torchrun with 2 ranks, FSDP2
    anatomy train --data notes.txt --tokenizer smollm2-135m-instruct --model smollm2-135m-instruct \\
        --lora --lora-rank 8 --lora-targets q,k,v,o --out runs/notes   # a LoRA adapter, the base frozen
    anatomy train ... --qlora --out runs/notes-q                    # the same over an int4 base
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import torch

from anatomy.atomic import write_errors_named
from anatomy.commands.common import MODEL_FORMS, add_model_option, add_old_name, add_quiet_option
from anatomy.errors import InputError
from anatomy.lora.config import DEFAULT_TARGETS, TARGETS, LoraConfig
from anatomy.models import set_activation_checkpointing
from anatomy.training import checkpoint as ckpt
from anatomy.training.data import check_size, prepare
from anatomy.training.distributed import STRATEGIES, Dist, barrier, init_distributed, launch, shutdown, wrap
from anatomy.training.loop import Run, Settings, TrainState, train
from anatomy.training.metrics import truncate_metrics
from anatomy.analysis.hardware import measure_matmul_peak
from anatomy.training.mfu import flops_per_token
from anatomy.training.objectives import OBJECTIVES, make_objective
from anatomy.training.optim import Schedule, make_optimizer
from anatomy.training.setup import (
    available_bytes,
    check_batch,
    check_fit,
    check_memory,
    estimated_bytes,
    model_for_lora,
    model_for_training,
)

OVERRIDES = {"d_model": int, "n_layers": int, "n_decoder_layers": int, "n_heads": int, "n_kv_heads": int,
             "d_ff": int, "dropout": float, "vocab_size": int, "max_seq_len": int}
# the rule of every number the run takes (None, where allowed, is the option's default), checked
# before anything is read or built
RULES = {
    "steps": ("a positive integer", lambda v: v >= 1),
    "seq_len": ("a positive integer", lambda v: v >= 1),
    "lr": ("a positive number", lambda v: 0 < v < math.inf),
    "min_lr": ("a number >= 0", lambda v: 0 <= v < math.inf),
    "warmup": ("an integer >= 0", lambda v: v >= 0),
    "decay_steps": ("a positive integer", lambda v: v >= 1),
    "weight_decay": ("a number >= 0", lambda v: 0 <= v < math.inf),
    "beta2": ("in [0, 1)", lambda v: 0 <= v < 1),
    "grad_clip": ("a number >= 0 (0: off)", lambda v: 0 <= v < math.inf),
    "label_smoothing": ("in [0, 1)", lambda v: 0 <= v < 1),
    "eval_every": ("an integer >= 0 (0: only at the end)", lambda v: v >= 0),
    "eval_steps": ("a positive integer", lambda v: v >= 1),
    "val_fraction": ("in (0, 1): training needs a validation split", lambda v: 0 < v < 1),
    "save_every": ("an integer >= 0 (0: only at the end)", lambda v: v >= 0),
    "keep": ("an integer >= 0 (0: all)", lambda v: v >= 0),
    "max_nonfinite": ("a positive integer", lambda v: v >= 1),
    "nproc": ("a positive integer", lambda v: v >= 1),
    "lora_rank": ("a positive integer", lambda v: v >= 1),
    "lora_alpha": ("a positive number", lambda v: 0 < v < math.inf),
    "lora_dropout": ("in [0, 1)", lambda v: 0 <= v < 1),
}
LORA_OPTIONS = ("lora_rank", "lora_alpha", "lora_dropout", "lora_targets")
QLORA_FORMATS = ("int4", "int8")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train or fine-tune a model (causal LM, masked LM, seq2seq)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, type=Path, help="text file, directory of text files, or a .tsv of pairs")
    p.add_argument("--tokenizer", default="chars", help="chars | a named model | tokenizer.json | model dir")
    add_model_option(p, forms=MODEL_FORMS, default="gpt2",
                     note=": a preset or a config (HF or anatomy JSON) trains a fresh model, a checkpoint is fine-tuned")
    for name, kind in OVERRIDES.items():
        p.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None, help=f"override the config's {name}")
    p.add_argument("--objective", default="auto", choices=OBJECTIVES)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=12, help="sequences per optimizer step (all ranks together)")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--accum", type=int, default=1, help="micro-steps per optimizer step (gradient accumulation)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=None, help="end of the cosine (default lr/10)")
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--decay-steps", type=int, default=None, help="length of the cosine (default --steps)")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--grad-clip", type=float, default=1.0, help="max global grad norm (0: off)")
    p.add_argument("--label-smoothing", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--eval-every", type=int, default=0, help="steps between evaluations (0: only at the end)")
    p.add_argument("--eval-steps", type=int, default=20)
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--save-every", type=int, default=0, help="steps between checkpoints (always one at the end)")
    p.add_argument("--keep", type=int, default=3, help="checkpoints kept (plus the best by val loss; 0: all)")
    p.add_argument("--max-nonfinite", type=int, default=10, help="stop after this many non-finite steps in a row")
    p.add_argument("--out", type=Path, required=True, help="run directory: metrics.jsonl, checkpoints/")
    p.add_argument("--cache-dir", type=Path, default=None, help="tokenized data cache (default <out>/data)")
    p.add_argument("--resume", action="store_true", help="continue from <out>/checkpoints/latest.json")
    p.add_argument("--nproc", type=int, default=1, help="launch torchrun with this many ranks on this machine")
    p.add_argument("--strategy", default="ddp", choices=STRATEGIES)
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--activation-checkpointing", action="store_true", help="recompute block activations in backward")
    add_lora_options(p)
    add_quiet_option(p)
    add_old_name(p, "--no-progress", new="--quiet", dest="quiet", flag=True)
    p.set_defaults(run=run)


def add_lora_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("LoRA", "train a low-rank adapter over a checkpoint's frozen weights; each checkpoint "
                                     "is then an HF PEFT adapter directory")
    g.add_argument("--lora", action="store_true", help="train a LoRA adapter instead of every weight")
    g.add_argument("--qlora", nargs="?", const="int4", default=None, choices=QLORA_FORMATS,
                   help="--lora over a base kept in int4 (default) or int8 blocks, as QLoRA keeps it in 4 bits")
    g.add_argument("--lora-rank", type=int, default=None, help="r, the adapter's rank (default 8)")
    g.add_argument("--lora-alpha", type=float, default=None, help="the update is scaled by alpha / r (default 16)")
    g.add_argument("--lora-dropout", type=float, default=None, help="dropout on the adapter's input (default 0)")
    g.add_argument("--lora-targets", default=None,
                   help=f"projections adapted, of {', '.join(TARGETS)} or all (default {','.join(DEFAULT_TARGETS)})")


def lora_config(args: argparse.Namespace) -> LoraConfig | None:
    """The adapter the options ask for (None without --lora or --qlora)."""
    if not lora_run(args):
        return None
    values = {"rank": args.lora_rank, "alpha": args.lora_alpha, "dropout": args.lora_dropout,
              "targets": args.lora_targets}
    try:
        return LoraConfig(**{k: v for k, v in values.items() if v is not None})
    except InputError as exc:
        raise InputError(f"--lora-targets: {exc}") from None


def lora_run(args: argparse.Namespace) -> bool:
    return args.lora or args.qlora is not None


def run(args: argparse.Namespace) -> int:
    check_options(args)
    if args.nproc > 1 and "WORLD_SIZE" not in os.environ:
        return launch(_without_nproc(sys.argv[1:]), args.nproc)
    info = init_distributed()
    try:
        return _train(args, info)
    finally:
        shutdown(info)


def check_options(args: argparse.Namespace) -> None:
    for name, (rule, ok) in RULES.items():
        value = getattr(args, name)
        if value is not None and not ok(value):
            raise InputError(f"--{name.replace('_', '-')} {value} must be {rule}")
    given = next((name for name in LORA_OPTIONS if getattr(args, name) is not None), None)
    if given is not None and not lora_run(args):
        raise InputError(f"--{given.replace('_', '-')} shapes a LoRA adapter: add --lora")
    lora_config(args)


def _without_nproc(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            out.append(a)
    return out


def _train(args: argparse.Namespace, info: Dist) -> int:
    out = Path(args.out)
    check_batch(args.batch_size, world=info.world, accum=args.accum)
    if not args.resume and (out / "metrics.jsonl").exists():
        raise InputError(f"--out {out} already holds a run (metrics.jsonl): add --resume or choose another --out")
    resume_dir = ckpt.latest_checkpoint(out) if args.resume else None
    data = _dataset(args, info, out)
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    config, model = _model(args, data.tokenizer, resume_dir)
    check_fit(config, data.tokenizer, seq_len=args.seq_len)
    objective = make_objective(args.objective, config=config, data=data, seq_len=args.seq_len)
    check_size(data, seq_len=args.seq_len, need_val=True)
    rows = args.batch_size // (info.world * args.accum)
    activations, state_bytes = estimated_bytes(model, config, rows=rows, seq_len=args.seq_len, world=info.world,
                                               sharded=args.strategy == "fsdp", device=info.device,
                                               activation_checkpointing=args.activation_checkpointing)
    check_memory(activations, state_bytes, available_bytes(info.device, local_ranks=info.world),
                 rows=rows, accum=args.accum)
    torch.manual_seed(args.seed + info.rank)  # dropout differs between ranks
    model = _prepare_model(model, args, info)
    wrapped = wrap(model, args.strategy, info)
    optimizer = make_optimizer(model, lr=args.lr, weight_decay=args.weight_decay, betas=(0.9, args.beta2))
    schedule = Schedule(lr=args.lr, min_lr=args.min_lr if args.min_lr is not None else args.lr / 10,
                        warmup=args.warmup, steps=args.decay_steps or args.steps)
    state = TrainState()
    if resume_dir is not None:
        trainer = ckpt.load_checkpoint(resume_dir, wrapped=wrapped, model=model, optimizer=optimizer, info=info)
        state = TrainState.from_trainer(trainer)
        if info.is_main:
            truncate_metrics(out / "metrics.jsonl", state.step)
            print(f"resuming from {resume_dir} (step {state.step}, written by {trainer.get('world', 1)} rank(s))")
    elif info.is_main:
        _write_run_file(out, args, config, info)
    run_ = Run(model=model, wrapped=wrapped, optimizer=optimizer, schedule=schedule, objective=objective, data=data,
               info=info, out=out, flops_per_token=flops_per_token(config, args.seq_len),
               peak_flops=measure_matmul_peak(info.device))
    settings = Settings(steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, accum=args.accum,
                        seed=args.seed, grad_clip=args.grad_clip, eval_every=args.eval_every, eval_steps=args.eval_steps,
                        save_every=args.save_every, keep=args.keep, label_smoothing=args.label_smoothing,
                        max_nonfinite=args.max_nonfinite, progress=not args.quiet)
    state = train(run_, settings, state)
    if info.is_main:
        val = f", val loss {state.val_loss:.4f}" if state.val_loss is not None else ""
        what = "adapter (an HF PEFT directory)" if lora_run(args) else "checkpoint"
        print(f"done: {state.step} steps, {state.tokens:,} tokens{val}, {state.nonfinite_total} non-finite step(s) "
              f"skipped; {what} {ckpt.latest_checkpoint(out)}")
    return 0


def _dataset(args: argparse.Namespace, info: Dist, out: Path):
    """Rank 0 tokenizes (or finds the cache) first; the others then open the same files."""
    cache = Path(args.cache_dir) if args.cache_dir else out / "data"
    if info.is_main:
        for directory, option in ((out, "--out"), (cache, "--cache-dir")):
            with write_errors_named(directory, option=option):
                directory.mkdir(parents=True, exist_ok=True)
        data = prepare(args.data, args.tokenizer, cache_dir=cache, val_fraction=args.val_fraction,
                       progress=not args.quiet)
    barrier(info)
    if not info.is_main:
        data = prepare(args.data, args.tokenizer, cache_dir=cache, val_fraction=args.val_fraction, progress=False)
    return data


def _model(args: argparse.Namespace, tok, resume_dir: Path | None):
    overrides = {k: getattr(args, k) for k in OVERRIDES if getattr(args, k) is not None}
    if lora_run(args):  # the base from --model, also when resuming (a checkpoint holds the adapter alone)
        if overrides:
            raise InputError(f"--lora keeps the model's architecture; drop "
                             f"{', '.join('--' + k.replace('_', '-') for k in overrides)}")
        return model_for_lora(args.model, lora_config(args), weights=args.qlora or "f32")
    if resume_dir is None:
        return model_for_training(args.model, overrides=overrides, tok=tok, seq_len=args.seq_len)
    from anatomy.models import build_model

    config = ckpt.read_config(resume_dir)
    return config, build_model(config, head="mlm")


def _prepare_model(model: torch.nn.Module, args: argparse.Namespace, info: Dist) -> torch.nn.Module:
    model = model.to(info.device).train()
    if args.activation_checkpointing:
        set_activation_checkpointing(model)
    if args.compile:
        model.compile()
    return model


def _write_run_file(out: Path, args: argparse.Namespace, config, info: Dist) -> None:
    values = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "run"}
    (out / "run.json").write_text(json.dumps({"args": values, "world": info.world, "config": config.to_dict()},
                                             indent=1))
