"""`anatomy inspect --model MODEL`: the diagram, parameter ledger, shape trace, FLOPs, memory, roofline
and training time of a preset, an HF config.json (or its directory), a .gguf file or a named model."""

from __future__ import annotations

import argparse
import math
import sys

from anatomy import dtypes
from anatomy.checkpoints.loader import resolve_config
from anatomy.commands.common import (
    MODEL_FORMS, add_model_option, add_old_name, add_report_options, model_of, print_report)
from anatomy.config import ModelConfig
from anatomy.errors import InputError
from anatomy.figures import image_format


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="shapes, parameters, FLOPs, memory, roofline and training time of a model")
    add_model_option(p, forms=MODEL_FORMS, old_positional=True)
    add_size_options(p)
    add_prediction_options(p)
    add_parallel_options(p)
    add_lora_options(p)
    add_report_options(p, docs="docs/anatomy.md", plot="the parameter breakdown and roofline chart",
                       html="diagram, ledger, shape trace, FLOPs, memory, roofline")
    p.add_argument("--mermaid", action="store_true", help="print only the block as a Mermaid flowchart")
    p.set_defaults(run=run)


def add_size_options(p: argparse.ArgumentParser) -> None:
    """The options `inspect` and `compare` share."""
    from anatomy.analysis.hardware import hardware_names

    p.add_argument("--batch-size", type=int, default=1, help="batch size B (default 1)")
    p.add_argument("--seq-len", type=int, default=None, help="prefill/training length S (default min(512, max_seq_len))")
    add_old_name(p, "--batch", new="--batch-size", dest="batch_size", type=int)
    add_old_name(p, "--seq", new="--seq-len", dest="seq_len", type=int)
    p.add_argument("--context", type=int, default=None, help="decode context T (default max_seq_len)")
    p.add_argument("--dtype", default="bf16", help=f"weight dtype: {', '.join(dtypes.ALL)} (default bf16)")
    p.add_argument("--kv-dtype", default=None,
                   help=f"KV cache dtype: {', '.join(dtypes.ALL)} (int8 and fp8 with a float16 scale per token and head, "
                        "as anatomy's 8-bit caches hold them; default: the compute dtype)")
    p.add_argument("--hardware", default="h100-sxm", help=f"{', '.join(hardware_names())} (default h100-sxm)")
    p.add_argument("--tokens", type=float, default=None, help="training tokens, e.g. 1e12 (adds a training estimate)")
    p.add_argument("--gpus", type=int, default=1, help="GPUs for the training estimate (default 1)")
    p.add_argument("--mfu", type=float, default=0.4, help="model FLOPs utilisation in (0, 1] (default 0.4)")


def add_prediction_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("speculative decoding prediction (compare with `anatomy generate --speculative ... --stats`)")
    g.add_argument("--speculative", type=int, default=None, metavar="K",
                   help="predict the speedup of verifying K proposed tokens per target forward at --context")
    g.add_argument("--acceptance", type=float, default=None, metavar="A",
                   help="the chance a proposed token is kept once the ones before it were, in [0, 1] (default 0.8)")
    g.add_argument("--draft-model", default=None, metavar="NAME",
                   help="the draft's config (preset, config.json, .gguf or model name); default: n-gram, no model")
    g.add_argument("--draft-layers", type=int, default=None, metavar="N",
                   help="the draft is the first N blocks of --draft-model (default: of the model itself)")
    g.add_argument("--draft-dtype", default=None, help="the draft's weight dtype (default: --dtype)")


def add_parallel_options(p: argparse.ArgumentParser) -> None:
    from anatomy.analysis.hardware import INTERCONNECTS

    g = p.add_argument_group("parallel (docs/parallel.md): what each rank holds and what the ranks say to each other")
    g.add_argument("--tensor-parallel", "--tensor-parallel-size", dest="tensor_parallel", type=int, default=1,
                   metavar="N", help="heads, FFN columns and vocabulary split over N ranks")
    g.add_argument("--pipeline-parallel", "--pipeline-parallel-size", dest="pipeline_parallel", type=int, default=1,
                   metavar="M", help="the blocks in M stages")
    g.add_argument("--interconnect", default=None, metavar="NAME[,NAME]",
                   help=f"the link between the ranks: {', '.join(INTERCONNECTS)} (default nvlink4 with N or M > 1); "
                        "a second name after a comma is the link between the pipeline stages (nvlink4,ib-ndr400: "
                        "stages on different machines)")


def add_lora_options(p: argparse.ArgumentParser) -> None:
    from anatomy.lora.config import DEFAULT_TARGETS, TARGETS

    g = p.add_argument_group("LoRA (docs/training.md): an adapter's parameters, bytes and training-state saving")
    g.add_argument("--lora-rank", type=int, default=None, metavar="R", help="the adapter's rank")
    g.add_argument("--lora-targets", default=None,
                   help=f"projections adapted, of {', '.join(TARGETS)} or all (default {','.join(DEFAULT_TARGETS)})")


def lora_options(args: argparse.Namespace):
    """--lora-rank R [--lora-targets ...] -> LoraConfig (None without --lora-rank)."""
    from anatomy.lora.config import LoraConfig

    rank, targets = getattr(args, "lora_rank", None), getattr(args, "lora_targets", None)
    if rank is None:
        if targets is not None:
            raise InputError("--lora-targets needs --lora-rank R")
        return None
    if rank < 1:
        raise InputError(f"--lora-rank {rank} must be a positive integer")
    return LoraConfig(rank=rank, **({"targets": targets} if targets is not None else {}))


def parallel_options(args: argparse.Namespace, config: ModelConfig) -> tuple:
    """(Layout, Interconnect within a stage, Interconnect between stages), or Nones for one device;
    sizes checked against the config."""
    from anatomy.analysis.hardware import get_interconnect
    from anatomy.parallel.layout import Layout, check_layout

    tp, pp = getattr(args, "tensor_parallel", 1), getattr(args, "pipeline_parallel", 1)
    for name, value in (("--tensor-parallel", tp), ("--pipeline-parallel", pp)):
        if value < 1:
            raise InputError(f"{name} {value} must be a positive integer")
    interconnect = getattr(args, "interconnect", None)
    if tp * pp == 1:
        if interconnect is not None:
            raise InputError("--interconnect needs --tensor-parallel N or --pipeline-parallel M above 1")
        return None, None, None
    layout = Layout(tp=tp, pp=pp)
    check_layout(config, layout)
    names = (interconnect or "nvlink4").split(",")
    if len(names) > 2:
        raise InputError(f"--interconnect {interconnect!r}: one link, or two (within a stage, between stages)")
    links = [get_interconnect(name.strip()) for name in names]
    return layout, links[0], links[-1]


def speculative_options(args: argparse.Namespace, config: ModelConfig):
    """--speculative K --acceptance A [--draft-model NAME] [--draft-layers N] [--draft-dtype D] ->
    SpeculativeOptions (None without --speculative), every value checked."""
    from anatomy.analysis.speculative import SpeculativeOptions

    drafting = [n for n, v in (("--acceptance", args.acceptance), ("--draft-model", args.draft_model),
                               ("--draft-layers", args.draft_layers), ("--draft-dtype", args.draft_dtype)) if v is not None]
    if args.speculative is None:
        if drafting:
            raise InputError(f"{drafting[0]} needs --speculative K")
        return None
    k, a = args.speculative, 0.8 if args.acceptance is None else args.acceptance
    if k < 1:
        raise InputError(f"--speculative {k} must be an integer >= 1 (proposed tokens per round)")
    if not 0.0 <= a <= 1.0:
        raise InputError(f"--acceptance {a:g} is outside [0, 1]")
    if config.is_encoder or config.is_seq2seq:
        raise InputError(f"speculative decoding needs a decoder-only model, got architecture={config.architecture!r}")
    draft, name = None, "n-gram (no model)"
    if args.draft_model is not None or args.draft_layers is not None:
        name = args.draft_model or "the model itself"
        draft = resolve_config(args.draft_model) if args.draft_model is not None else config
        if draft.vocab_size != config.vocab_size:
            raise InputError(f"the draft's vocabulary ({draft.vocab_size} tokens) differs from the model's "
                             f"({config.vocab_size}): speculative decoding needs one tokenizer for both")
        if args.draft_layers is not None:
            if not 1 <= args.draft_layers <= draft.n_layers:
                raise InputError(f"--draft-layers {args.draft_layers} must be in [1, {draft.n_layers}]")
            draft, name = draft.replace(n_layers=args.draft_layers), f"{name}, first {args.draft_layers} blocks"
    dtype = dtypes.parse(args.draft_dtype, option="--draft-dtype", choices=dtypes.ALL).name if args.draft_dtype else None
    if dtype is not None and draft is None:
        draft, name = config, "the model itself"
    return SpeculativeOptions(k=k, acceptance=a, draft=draft, draft_name=name + (f" in {dtype}" if dtype else ""),
                              draft_dtype=dtype)


def options_from_args(args: argparse.Namespace, config: ModelConfig):
    from anatomy.analysis.report import Options

    seq = args.seq_len if args.seq_len is not None else min(512, config.max_seq_len)
    context = args.context if args.context is not None else config.max_seq_len
    for name, value in (("--batch-size", args.batch_size), ("--seq-len", seq), ("--context", context),
                        ("--gpus", args.gpus)):
        if value <= 0:
            raise InputError(f"{name} {value} must be a positive integer")
    if args.tokens is not None and not 0 < args.tokens < math.inf:
        raise InputError(f"--tokens {args.tokens:g} must be a positive number")
    if not 0 < args.mfu <= 1:
        raise InputError(f"--mfu {args.mfu:g} is outside (0, 1]")
    if config.position in ("learned", "sinusoidal"):
        checked = (("--seq-len", seq),) if config.is_encoder else (("--seq-len", seq), ("--context", context))
        for name, value in checked:  # an encoder does not decode: its --context is unused
            if value > config.max_seq_len:
                raise InputError(f"{name} {value} exceeds max_seq_len={config.max_seq_len} "
                                 f"(position={config.position!r} has a table of max_seq_len entries)")
    dtype = dtypes.parse(args.dtype, option="--dtype", choices=dtypes.ALL).name
    kv_dtype = dtypes.parse(args.kv_dtype, option="--kv-dtype", choices=dtypes.ALL).name if args.kv_dtype else None
    speculative = speculative_options(args, config) if hasattr(args, "speculative") else None
    if speculative is not None and speculative.k >= context:
        raise InputError(f"--speculative {speculative.k} is beyond the decode context --context {context}")
    layout, interconnect, stage_interconnect = parallel_options(args, config)
    return Options(batch=args.batch_size, seq=seq, context=context, dtype=dtype, kv_dtype=kv_dtype,
                   tokens=args.tokens, gpus=args.gpus, mfu=args.mfu, speculative=speculative, layout=layout,
                   interconnect=interconnect, stage_interconnect=stage_interconnect, lora=lora_options(args))


def run(args: argparse.Namespace) -> int:
    from anatomy.analysis import diagram, render
    from anatomy.analysis.hardware import get_hardware
    from anatomy.analysis.plot import save_plot
    from anatomy.analysis.report import build_report
    from anatomy.checkpoints.loader import stored_weights

    name = model_of(args)
    if args.plot:
        image_format(args.plot, option="--plot")  # before any work
    config = resolve_config(name)
    options = options_from_args(args, config)
    if args.html:
        from anatomy.analysis.page import check_output_path

        check_output_path(args.html)  # before the work: a bad path fails fast
    if args.mermaid:
        print(diagram.mermaid(diagram.describe(config)))
        return 0
    report = build_report(config, name=name, options=options, hardware=get_hardware(args.hardware),
                          stored=stored_weights(name))
    if args.plot:
        save_plot(report, args.plot)
    if args.html:
        from anatomy.analysis.page import inspect_page, write_page

        write_page(inspect_page(report), args.html)
        print(f"wrote {args.html}", file=sys.stderr)
    print_report(report, args, render)
    return 0

