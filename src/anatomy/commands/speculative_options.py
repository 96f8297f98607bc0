"""The speculative-decoding options of `anatomy generate`, `anatomy chat` and `anatomy serve`:

    --speculative ngram                         prompt lookup: no second model
    --speculative draft --draft-model NAME      a smaller model with the same tokenizer
    --speculative draft --draft-layers 8        self-speculation: the target's first 8 blocks
    --speculative draft --draft-weights int4    the target with int4 weights (or --draft-dtype f16)
    --num-speculative-tokens K                  at most K proposed tokens per target forward (default 5)

For `anatomy serve` they set every request's default (docs/serving.md, "Speculative decoding").
"""

from __future__ import annotations

import argparse
from typing import Any

from anatomy import dtypes
from anatomy.errors import InputError


def add_speculative_options(p: argparse.ArgumentParser, *, served: bool = False) -> None:
    shown = "/metrics and the start-up line show" if served else "--stats shows"
    g = p.add_argument_group(f"speculative decoding (the output is the same; {shown} what it gained)")
    g.add_argument("--speculative", choices=("ngram", "draft"), default=None,
                   help="propose tokens by prompt lookup (ngram) or with a draft model, and verify them in one "
                        "target forward" + (" (every request's default)" if served else ""))
    g.add_argument("--num-speculative-tokens", type=int, default=None, metavar="K",
                   help="the most tokens proposed per round (default 5; fewer while they are rejected)")
    g.add_argument("--draft-model", "--model-draft", default=None, metavar="NAME",
                   help="the draft: a model name, .gguf file or HF directory with the target's tokenizer "
                        "(default: the target model itself, with --draft-layers or --draft-dtype)")
    g.add_argument("--draft-layers", type=int, default=None, metavar="N",
                   help="use only the draft's first N blocks (self-speculation when the draft is the target)")
    g.add_argument("--draft-weights", default=None,
                   help="the format of the draft's matrices, as --weights: auto, f32, f16, bf16, int8, int4 "
                        "(default: --weights)")
    g.add_argument("--draft-dtype", default=None,
                   help=f"the draft's other tensors' dtype: {', '.join(dtypes.FLOATS)} (default: --dtype)")


def check_speculative_options(args: argparse.Namespace) -> None:
    """Bad combinations fail before any model is loaded."""
    if args.num_speculative_tokens is not None and args.num_speculative_tokens < 1:
        raise InputError(f"--num-speculative-tokens {args.num_speculative_tokens} must be an integer >= 1")
    drafting = [name for name, value in (("--draft-model", args.draft_model), ("--draft-layers", args.draft_layers),
                                         ("--draft-weights", args.draft_weights), ("--draft-dtype", args.draft_dtype))
                if value is not None]
    if drafting and args.speculative != "draft":
        raise InputError(f"{drafting[0]} needs --speculative draft")
    if args.num_speculative_tokens is not None and args.speculative is None:
        raise InputError("--num-speculative-tokens needs --speculative ngram or draft")
    if args.speculative == "draft" and not drafting:
        raise InputError("--speculative draft needs a draft: --draft-model NAME, --draft-layers N, --draft-weights "
                         "or --draft-dtype")
    if args.draft_layers is not None and args.draft_layers < 1:
        raise InputError(f"--draft-layers {args.draft_layers} must be an integer >= 1")
    if args.draft_dtype is not None:
        args.draft_dtype = dtypes.parse(args.draft_dtype, option="--draft-dtype").name
    if args.draft_weights not in (None, "auto"):
        from anatomy.weights.choice import CHOICES

        args.draft_weights = dtypes.parse(args.draft_weights, option="--draft-weights", choices=CHOICES[1:]).name


def takes_weights(args: argparse.Namespace) -> bool:
    """May the engine take the loaded model's weights (hold them once)? Not when a draft model is
    loaded: it may be the same loaded model, and read them too."""
    return getattr(args, "speculative", None) != "draft"


def speculative_options(args: argparse.Namespace, tokenizer: Any = None) -> dict[str, Any]:
    """generate()'s speculative, draft_model and num_speculative_tokens from the command line, made
    once per command (a chat's every reply shares the draft's engine): a named model loaded once per
    process, then its first N blocks if asked; a draft whose tokenizer has another vocabulary than
    the target's `tokenizer` is refused."""
    if getattr(args, "speculative", None) is None:
        return {}
    draft = None
    if args.speculative == "draft":
        from anatomy.inference.engine import engine_for
        from anatomy.inference.loading import load_named
        from anatomy.inference.speculative import first_layers
        from anatomy.inference.speculative.setup import decoder_only, same_vocabulary

        name = args.draft_model or args.model
        named = load_named(name, args.draft_dtype or args.dtype, args.draft_weights or args.weights)
        if tokenizer is not None and not same_vocabulary(tokenizer, named.tokenizer):
            raise InputError(f"the draft model {name!r} has another tokenizer vocabulary than the target's: "
                             "speculative decoding needs one tokenizer for both")
        decoder_only(named.model.config, f"the draft {name!r}")
        draft = engine_for(first_layers(named.model, args.draft_layers)) if args.draft_layers is not None \
            else named.engine()
    return dict(speculative=args.speculative, draft_model=draft, num_speculative_tokens=args.num_speculative_tokens)
