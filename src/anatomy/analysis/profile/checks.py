"""Runs that cannot fit, refused before anything is loaded: sizes against the model's context, the
memory a run holds against what this machine has available (`anatomy profile`'s bad input)."""

from __future__ import annotations

from anatomy import dtypes, heap
from anatomy.analysis.params import parameter_ledger
from anatomy.analysis.profile.workloads import Shape
from anatomy.config import ModelConfig
from anatomy.errors import InputError


def check_run(config: ModelConfig, options, weights: str, *, option: str | None = None,
              resident_bytes: int = 0) -> None:
    """A run that cannot fit the model's context or this machine's memory: a one-line InputError
    naming the limit, before anything runs. `option` names what asked for the run (a sweep value);
    `resident_bytes`: memory already taken by other models of the same command."""
    check_shape(config, Shape(options.batch, options.prompt_len, options.context_for(config)), options, option=option)
    needed = run_bytes(config, options, weights)
    available = heap.available()
    if available is not None and sum(needed.values()) + resident_bytes > available:
        parts = ", ".join(f"{k} {v / 2 ** 30:.2f} GiB" for k, v in needed.items())
        what = option or f"--batch-size {options.batch} with --context {options.context_for(config)}"
        raise InputError(f"{what} needs about {(sum(needed.values()) + resident_bytes) / 2 ** 30:.2f} GiB "
                         f"({parts}) but this machine has {available / 2 ** 30:.2f} GiB available")


def check_shape(config: ModelConfig, shape: Shape, options, *, option: str | None = None) -> None:
    """Sizes the model's context cannot hold: a one-line InputError naming the limit."""
    prefix = f"{option}: " if option else ""
    for name, value in (("batch-size", shape.batch), ("prompt-len", shape.prompt_len),
                        ("new-tokens", options.new_tokens), ("context", shape.context)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InputError(f"{prefix}--{name} {value!r} must be a positive integer")
    limit = config.max_seq_len
    if shape.prompt_len > limit:
        raise InputError(f"{prefix}--prompt-len {shape.prompt_len} exceeds the model's context of {limit} tokens "
                         "(max_seq_len)")
    if config.is_encoder:
        return
    prompt = shape.prompt_len if config.is_decoder else 0
    needed = prompt + options.warmup + options.new_tokens + 1
    steps = (f"--prompt-len {shape.prompt_len} + " if prompt else "") + \
        f"{options.warmup} warm-up + --new-tokens {options.new_tokens} decode steps + 1 need {needed} cache slots"
    if shape.context > limit:
        given = f"--context {shape.context}" if options.context is not None else f"the default --context ({steps})"
        raise InputError(f"{prefix}{given} exceeds the model's context of {limit} tokens (max_seq_len)")
    if shape.context < needed:
        raise InputError(f"{prefix}--context {shape.context} is too small: {steps}")


def run_bytes(config: ModelConfig, options, weights: str) -> dict[str, int]:
    """What a run holds at once, about: the weights (`weights`: anatomy.load's choice; "auto" counted
    as f32, the most it can be), the KV cache of B x T slots, the prefill's largest activations (the
    widest projection's output, a few [B, S, D] tensors, the eager score matrix) and the logits.
    Activations and cache are counted in f32 for f32 weights, else in 16 bits (bf16 compute)."""
    from anatomy.analysis.memory import compute_dtype, kv_cache_bytes

    stored = dtypes.parse("f32" if weights == "auto" else weights, choices=dtypes.ALL)
    act = dtypes.parse(compute_dtype(stored.name))
    B, S, T = options.batch, options.prompt_len, options.context_for(config)
    widest = max(config.q_dim + 2 * config.kv_dim, 2 * max(config.d_ff, config.d_ff_expert or 0))
    scores = B * config.n_heads * S * S if options.attention == "eager" else 0
    return {"weights": stored.nbytes(parameter_ledger(config).total),
            "KV cache": 0 if config.is_encoder else kv_cache_bytes(config, batch=B, tokens=T,
                                                                     kv_dtype=options.kv_dtype or act.name,
                                                                     windowed=False),
            "activations": act.nbytes(B * S * (widest + 4 * config.d_model) + scores) + 4 * B * config.vocab_size}
