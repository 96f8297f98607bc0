"""`anatomy generate "prompt"`: stream a model's answer to stdout.

The options shared with `anatomy chat` (model, sampling, dtype, compile, stats) are defined here
once; chat imports them.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from anatomy import dtypes
from anatomy.commands.common import (
    DefaultsHelpFormatter, add_backend_option, add_kv_dtype_option, add_model_option, add_quiet_option, read_stdin)
from anatomy.commands.parallel_options import (
    add_parallel_options, check_parallel, launched, layout_of, rank_engine, start_ranks)
from anatomy.commands.speculative_options import (
    add_speculative_options, check_speculative_options, speculative_options, takes_weights)
from anatomy.errors import InputError
from anatomy.kv_format import parse_kv_dtype

DEFAULT_MODEL = "smollm2-135m-instruct"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate", help="generate text from a prompt (streams to stdout)",
        description="Generate a continuation of PROMPT with the static-KV-cache engine and stream it to stdout. "
                    "Instruct models get the prompt as a user message through their chat template (--raw: as is).",
        formatter_class=DefaultsHelpFormatter)
    p.add_argument("prompt", nargs="?", default="-", help="the prompt; '-' or nothing reads it from stdin (UTF-8)")
    p.add_argument("--raw", action="store_true", help="feed the prompt as plain text, without the chat template")
    p.add_argument("--system", default=None, help="a system message before the prompt (chat template only)")
    add_model_options(p)
    add_sampling_options(p, max_new_tokens=256)
    add_speculative_options(p)
    add_parallel_options(p)
    p.set_defaults(run=run)


WEIGHTS_HELP = ("the format of the model's matrices: auto (a GGUF file's own quantized blocks, an HF checkpoint's "
                "floats), f32, f16, bf16, int8, int4. The engine measures the kernels that can run them on this "
                "machine and uses the fastest accurate one per phase")


def add_model_options(p: argparse.ArgumentParser) -> None:
    add_model_option(p, forms=("installed", "gguf", "hf"), default=DEFAULT_MODEL)
    p.add_argument("--weights", default="auto", help=f"{WEIGHTS_HELP} (--verbose shows it)")
    p.add_argument("--dtype", default="f32",
                   help=f"dtype of the model's other tensors (norms, biases, dense matrices): {', '.join(dtypes.FLOATS)}; "
                        "the engine runs its activations in what its chosen kernels take")
    p.add_argument("--compile", action="store_true",
                   help="compile the decode step with torch.compile (inductor, frozen weights): faster decoding "
                        "after a one-off compilation of a minute or more")
    p.add_argument("--stats", action="store_true",
                   help="print prompt/new token counts, time to first token, time per output token, tokens/s, the "
                        "kernels that served each phase and the weight bytes a decode step read, to stderr")
    p.add_argument("--verbose", action="store_true",
                   help="also print the whole kernel plan: every candidate's time and error per weight shape and phase")
    p.add_argument("--truncate", action="store_true",
                   help="keep the end of a prompt longer than the model's context instead of failing")
    add_kv_dtype_option(p)
    add_backend_option(p)
    add_quiet_option(p)


def add_sampling_options(p: argparse.ArgumentParser, *, max_new_tokens: int) -> None:
    g = p.add_argument_group("sampling (temperature 0 = greedy)")
    g.add_argument("--max-new-tokens", type=int, default=max_new_tokens, help="most new tokens to generate")
    g.add_argument("--temperature", type=float, default=0.0, help="softmax temperature, >= 0; 0 picks the argmax")
    g.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0: off)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus: the smallest set reaching this mass, in (0, 1]")
    g.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min_p * the top probability (0: off)")
    g.add_argument("--repetition-penalty", type=float, default=1.0, help="> 1 discourages repeating tokens (1: off)")
    g.add_argument("--seed", type=int, default=None, help="make sampling reproducible")
    g.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop before this text (repeatable); it is never printed")
    g.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence tokens")


def sampling_options(args: argparse.Namespace) -> dict[str, Any]:
    return dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                top_p=args.top_p, min_p=args.min_p, repetition_penalty=args.repetition_penalty, seed=args.seed,
                stop=tuple(args.stop), ignore_eos=args.ignore_eos)


def check_options(args: argparse.Namespace) -> None:
    """Bad sampling options and dtypes fail before the model is loaded (--dtype becomes its canonical name)."""
    from anatomy.inference.sampling import SamplingParams

    SamplingParams(**sampling_options(args))
    args.dtype = dtypes.parse(args.dtype, option="--dtype").name
    args.kv_dtype = parse_kv_dtype(args.kv_dtype, option="--kv-dtype")


def run(args: argparse.Namespace) -> int:
    check_options(args)
    check_speculative_options(args)
    layout = layout_of(args)
    if layout.world > 1:
        return run_parallel(args, layout)
    prompt = read_prompt(args.prompt)
    model, tokenizer = load(args)
    return answer(args, prompt, model, tokenizer)


def run_parallel(args: argparse.Namespace, layout) -> int:
    """Start the ranks (this process is their launcher), or run as one of them: rank 0 answers."""
    if not launched():
        check_parallel(args, layout)
        if args.prompt != "-":
            read_prompt(args.prompt)  # an empty prompt fails before any rank starts
        return start_ranks(args, layout)
    with rank_engine(args, layout) as engine:
        if engine is None:
            return 0  # a follower: rank 0 has finished
        from anatomy.text.tokenizer import load_tokenizer

        return answer(args, read_prompt(args.prompt), engine, load_tokenizer(args.model))


def answer(args: argparse.Namespace, prompt: str, model: Any, tokenizer: Any) -> int:
    """Stream the answer to `prompt` from `model` (an engine or a model) to stdout."""
    messages = prompt if args.raw or tokenizer.chat_template is None else as_chat(prompt, args.system)
    gen = start(model, tokenizer, messages, args, speculative_options(args, tokenizer))
    for _, delta in gen.deltas():
        sys.stdout.write(delta)
        sys.stdout.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()
    if args.stats or args.verbose:
        print_stats(gen, verbose=args.verbose)
    return 0


def start(model: Any, tokenizer: Any, prompt: Any, args: argparse.Namespace,
          speculative: dict[str, Any] | None = None) -> Any:
    """A Generation of one prompt with the command line's options (`speculative`: what
    speculative_options made of them); iterate `.deltas()`."""
    from anatomy.inference.generate import Generation

    return Generation.start(model, prompt, tokenizer=tokenizer, truncate=args.truncate,
                            sampling=sampling_options(args), speculative=speculative)  # model: the loaded engine


def print_stats(gen: Any, *, verbose: bool = False) -> None:
    r = gen.results()[0]
    print(f"[{r.prompt_tokens} prompt tokens, {len(r.token_ids)} new ({r.finish_reason}); "
          f"TTFT {r.ttft_s * 1e3:.0f} ms, TPOT {r.tpot_s * 1e3:.1f} ms, {r.tokens_per_s:.1f} tok/s]",
          file=sys.stderr, flush=True)
    if r.speculative is not None:
        print(f"[{r.speculative.summary()}]", file=sys.stderr, flush=True)
    from anatomy.inference.engine import DecoderEngine

    engine = gen.engine
    if not isinstance(engine, DecoderEngine):  # an encoder-decoder's engine runs no kernel plan
        return
    read = engine.decode_weight_bytes
    per_step = r.speculative.tokens_per_forward if r.speculative is not None else 1.0  # tokens per weight read
    rate = f" -> {read * r.tokens_per_s / per_step / 1e9:.1f} GB/s of weights" if r.tokens_per_s > 0 and per_step else ""
    print(f"[residual stream {dtypes.name_of(engine.dtype)}, branches {dtypes.name_of(engine.branch_dtype)}, "
          f"KV cache {engine.kv_dtype}; {engine.backend.name} backend; "
          f"{'; '.join(engine.kernel_summary())}; "
          f"a decode step reads {read / 1e6:.0f} MB of weights{rate}]", file=sys.stderr, flush=True)
    if verbose and engine.plan is not None:
        print("\n".join(engine.plan.describe()), file=sys.stderr, flush=True)


def as_chat(prompt: str, system: str | None) -> list[dict[str, str]]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]


def read_prompt(prompt: str) -> str:
    if prompt == "-":
        prompt = read_stdin().rstrip("\r\n")  # the newline that ends a piped line is not part of the question
    if not prompt.strip():
        raise InputError("the prompt is empty")
    return prompt


def load(args: argparse.Namespace) -> tuple[Any, Any]:
    """(the engine of a decoder, or the encoder-decoder model; the tokenizer), with progress on a
    terminal's stderr (anatomy/progress.py). The engine is kept for every reply of a chat."""
    from anatomy import progress
    from anatomy.inference.loading import load_named

    with progress.task(f"loading {args.model}"):
        named = load_named(args.model, args.dtype, args.weights)
        config = named.model.config
        if config.is_decoder or config.is_seq2seq:
            options = {"compile": args.compile, "kv_dtype": args.kv_dtype, "backend": args.backend,
                       "take_weights": takes_weights(args)} if config.is_decoder else {}
            return named.engine(**options), named.tokenizer
        return named.model, named.tokenizer  # generation refuses it, naming its architecture
