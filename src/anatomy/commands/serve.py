"""`anatomy serve`: the OpenAI-compatible server (continuous batching over a paged KV cache).

    anatomy serve                                   SmolLM2-135M-Instruct on http://127.0.0.1:8000/v1
    anatomy serve --model x.gguf --port 9000 --api-key KEY --kv-memory 2GiB
    anatomy serve --lora sql=adapters/sql chat=adapters/chat       LoRA adapters, picked by a request's model

The port is bound before the model loads (a busy port fails at once); SIGTERM or SIGINT drains the
requests in flight. Options, start-up lines and limits: docs/serving.md, "Running it".
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import threading
import time

from anatomy.commands.common import (
    DefaultsHelpFormatter, add_backend_option, add_kv_dtype_option, add_model_option, add_quiet_option)
from anatomy.commands.generate import WEIGHTS_HELP
from anatomy.commands.speculative_options import (
    add_speculative_options, check_speculative_options, speculative_options, takes_weights)
from anatomy.commands.parallel_options import (
    add_parallel_options, check_parallel, is_follower, launched, layout_of, rank_engine, start_ranks)
from anatomy.errors import InputError
from anatomy.serving.pooling import POOLINGS
from anatomy.serving.reasoning import PARSERS
from anatomy.serving.rerank import INSTRUCTION
from anatomy.sizes import parse_bytes

DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_EMBEDDING_MODEL = "all-minilm-l6-v2"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="serve a model over the OpenAI and Anthropic APIs (continuous batching, paged KV cache)",
        description="Serve a decoder model over the OpenAI HTTP API (/v1/chat/completions, /v1/completions, "
                    "/v1/responses, /v1/embeddings, /v1/models; tools, structured outputs, echo and logprobs) and "
                    "Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) with "
                    "continuous batching over a paged KV cache with prefix caching; /health, /metrics (Prometheus), "
                    "/tokenize, /detokenize, /tokenizer_info.",
        formatter_class=DefaultsHelpFormatter)  # unset defaults unshown: never a key from the environment
    add_model_option(p, forms=("installed", "gguf", "hf"), default=DEFAULT_MODEL, note=" (a decoder)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="TCP port")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' (or 'x-api-key: KEY') on every request but /health and "
                        "/metrics (default: $ANATOMY_API_KEY, else none)")
    p.add_argument("--embedding-model", default=None,
                   help=f"encoder model for /v1/embeddings ('self': the served decoder, pooled by --embedding-pooling; "
                        f"'none' to turn it off; default: {DEFAULT_EMBEDDING_MODEL} if installed)")
    p.add_argument("--embedding-pooling", default="last", choices=POOLINGS,
                   help="with --embedding-model self: the decoder's final hidden state of the last token, or the mean "
                        "over the tokens (normalized)")
    p.add_argument("--rerank-model", default=None,
                   help="the scorer of /v1/rerank and /v1/score: a cross-encoder (an HF BertForSequenceClassification "
                        "checkpoint of one label), or 'self': the served decoder scored by its yes/no tokens after "
                        "Qwen3-Reranker's prompt (default: none)")
    p.add_argument("--rerank-instruction", default=INSTRUCTION,
                   help="with --rerank-model self: the instruction in its prompt (a request's `instruction` "
                        "overrides it)")
    p.add_argument("--weights", default="auto", help=f"{WEIGHTS_HELP} (named at start-up)")
    p.add_argument("--dtype", default="f32",
                   help="the model's other tensors (norms, biases, dense matrices) and its residual stream: f32, "
                        "f16, bf16; the branches and the KV cache compute in what the chosen kernels take, at most "
                        "this wide (named at start-up)")
    p.add_argument("--kv-memory", default="0.1",
                   help="KV-cache budget: bytes (2GiB, 512MB, 1e9) or a fraction of the machine's memory (0.1)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV-cache block")
    add_kv_dtype_option(p)
    add_backend_option(p)
    p.add_argument("--batch-size", type=int, default=32, help="most sequences one step advances")
    p.add_argument("--max-step-tokens", type=int, default=512,
                   help="most tokens one step computes (decodes + prefill chunks): long prompts are prefilled in "
                        "chunks of what is left")
    p.add_argument("--no-prefix-cache", action="store_true", help="turn off reusing cached prompt prefixes")
    p.add_argument("--kv-offload-bytes", default="0",
                   help="host memory for full KV blocks evicted from the pool (2GiB, 512MB, a fraction 0.1): a prompt "
                        "that needs them again has them copied back instead of computed; past it they go to "
                        "--kv-offload-dir")
    p.add_argument("--kv-offload-dir", default=None,
                   help="a directory for full KV blocks: those evicted past --kv-offload-bytes, and every cached block "
                        "when the server stops; a server started again with it restores them (each file checked: "
                        "another model's, format's or block size's, or a damaged one, is ignored)")
    p.add_argument("--scheduling-policy", default="fcfs", choices=("fcfs", "priority"),
                   help="fcfs: requests run in arrival order (a request's non-zero priority gets 400); priority: by "
                        "the request's priority (lower first, then arrival), a waiting request preempting the "
                        "lowest-ranked running ones when it finds no slot or no KV blocks, as vLLM's policy does")
    p.add_argument("--max-body-bytes", type=int, default=4 * 2 ** 20, help="larger request bodies get 413")
    p.add_argument("--max-queue", type=int, default=256,
                   help="most sequences that may wait beyond a full batch; past it requests get 429 with Retry-After "
                        "(-1: no limit)")
    p.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="on SIGTERM/SIGINT: seconds the requests in flight have to finish (new ones get 503); then "
                        "the rest end with an error (a second signal: at once)")
    p.add_argument("--strict-fields", action="store_true",
                   help="refuse unknown request fields with 400, as OpenAI does (default: ignored and logged, as vLLM "
                        "does)")
    p.add_argument("--reasoning-parser", default=None, choices=PARSERS,
                   help="read a chat answer's <think>...</think> block into reasoning_content (streamed as "
                        "reasoning_content deltas; a Responses `reasoning` item, an Anthropic `thinking` block), as "
                        "vLLM's parsers of these names do (DeepSeek-R1, Qwen3, SmolLM3; a template that opens the "
                        "block in the prompt is recognized); default: the answer's text as it is")
    p.add_argument("--reasoning-budget", type=int, default=-1,
                   help="most tokens a thinking block may take before the server closes it (\\n</think>\\n\\n is "
                        "appended and the answer follows); a request's thinking_budget overrides it (-1: no limit; "
                        "needs --reasoning-parser; a sequence with a budget does not speculate)")
    p.add_argument("--lora", nargs="+", action="extend", default=[], metavar="NAME=PATH",
                   help="serve the LoRA adapter at PATH (a PEFT directory or llama.cpp's GGUF LoRA file) as model "
                        "NAME (a request's `model` picks it; "
                        "rows of different adapters share a batch step, the base product computed once)")
    p.add_argument("--max-loras", type=int, default=None,
                   help="most LoRA adapters loaded at once (default: as many as --lora names, 4 with "
                        "--allow-runtime-lora)")
    p.add_argument("--max-lora-rank", type=int, default=64, help="an adapter of a higher rank is refused")
    p.add_argument("--allow-runtime-lora", action="store_true",
                   help="turn on POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's): a client may "
                        "then load any PEFT directory the server can read")
    add_speculative_options(p, served=True)
    add_quiet_option(p)
    add_parallel_options(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from anatomy import dtypes
    from anatomy.kv_format import parse_kv_dtype
    from anatomy.weights.choice import parse_weights

    kv_bytes = parse_memory(args.kv_memory)
    if args.api_key is None:
        args.api_key = os.environ.get("ANATOMY_API_KEY") or None
    _check_args(args)
    args.dtype = dtypes.parse(args.dtype, option="--dtype").name
    args.weights = parse_weights(args.weights, option="--weights")
    args.kv_dtype = parse_kv_dtype(args.kv_dtype, option="--kv-dtype")
    from anatomy.serving.app import ServerState, create_app

    embedding = args.model if args.embedding_model == "self" else _embedding_name(args.embedding_model)
    reranker = args.model if args.rerank_model == "self" else args.rerank_model
    _resolve(args.model, "--model", "serving")
    if reranker is not None and reranker != args.model:
        _resolve(reranker, "--rerank-model", "reranking")
    if args.draft_model is not None:
        _resolve(args.draft_model, "--draft-model", "serving")
    layout = layout_of(args)
    if layout.world > 1 and not launched():  # this process starts the ranks; rank 0 serves HTTP
        check_parallel(args, layout)
        _listen(args.host, args.port).close()  # a port in use fails before any rank starts
        return start_ranks(args, layout)
    if layout.world > 1 and is_follower():
        with rank_engine(args, layout):
            return 0  # followed rank 0's calls until it stopped
    sock = _listen(args.host, args.port)
    state = ServerState(model_name=args.model, api_key=args.api_key, max_body_bytes=args.max_body_bytes,
                        embedding_name=embedding, rerank_name=reranker, strict_fields=args.strict_fields,
                        max_queue=None if args.max_queue < 0 else args.max_queue,
                        reasoning_parser=args.reasoning_parser, reasoning_budget=args.reasoning_budget,
                        runtime_lora=args.allow_runtime_lora)
    server = _uvicorn(create_app(state), state, args.shutdown_timeout)
    failures: list[BaseException] = []
    ranks = contextlib.ExitStack()  # a parallel run's engine and process group, left when the server stops
    loader = threading.Thread(target=_load, args=(state, args, kv_bytes, server, failures, ranks),
                              name="anatomy-loader", daemon=True)
    loader.start()
    host, port = sock.getsockname()[:2]
    print(f"anatomy serve: listening on http://{host}:{port} (OpenAI API under /v1, Anthropic's at /v1/messages; "
          f"/health, /metrics); loading {args.model}", file=sys.stderr, flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        if state.loop is not None:
            state.loop.stop()
        ranks.close()
    if failures:
        raise failures[0]  # bad input is one line (exit 2); a bug keeps its traceback (exit 1)
    return 0


def _load(state, args: argparse.Namespace, kv_bytes: int, server, failures: list[BaseException],
          ranks: contextlib.ExitStack) -> None:
    """Load the model (and the embedding model), start the serving loop, report, mark ready."""
    from anatomy.serving.loop import ServingLoop

    try:
        start = time.perf_counter()
        engine, tokenizer = _engine(args, server, failures, ranks)
        _adapters(args, engine)
        options = dict(kv_bytes=kv_bytes, block_size=args.block_size, max_seqs=args.batch_size,
                       max_step_tokens=args.max_step_tokens, prefix_caching=not args.no_prefix_cache, name=args.model,
                       scheduling_policy=args.scheduling_policy, offload_dir=args.kv_offload_dir,
                       offload_bytes=parse_bytes(args.kv_offload_bytes, option="--kv-offload-bytes"))
        if args.pipeline_parallel_size > 1:  # one loop per stage: their steps overlap on the stages
            from anatomy.parallel.lanes import Lanes

            loop = Lanes.of(engine, tokenizer, lanes=args.pipeline_parallel_size, **options)
        else:
            loop = ServingLoop(engine, tokenizer, speculation=_speculation(args, tokenizer), **options)
            loop.capture_decode()  # the first requests replay their decode steps (vLLM captures CUDA graphs so)
        _pooling(state, args, engine, tokenizer)
        loop.start()
        state.loop, state.tokenizer = loop, tokenizer
        _report(args, loop, time.perf_counter() - start)
        state.ready.set()
    except Exception as exc:  # re-raised by run() once the server has stopped
        state.load_error = str(exc)
        failures.append(exc)
        server.should_exit = True


def _engine(args: argparse.Namespace, server, failures: list[BaseException], ranks: contextlib.ExitStack):
    """(the engine, the tokenizer): the model's kept engine, or rank 0's ParallelEngine (a lost rank
    stops the server: the error is what `anatomy serve` exits with)."""
    from anatomy.inference.loading import load_named
    from anatomy.text.tokenizer import load_tokenizer

    layout = layout_of(args)
    if layout.world > 1:
        engine = ranks.enter_context(rank_engine(args, layout))

        def lost(error: BaseException) -> None:
            failures.append(error)
            server.should_exit = True

        engine.channel.on_lost.append(lost)
        return engine, load_tokenizer(args.model)
    named = load_named(args.model, args.dtype, args.weights)
    if not named.model.config.is_decoder:
        raise InputError(f"{args.model}: serving needs a decoder model, got architecture="
                         f"{named.model.config.architecture!r}")
    engine = named.engine(kv_dtype=args.kv_dtype, take_weights=takes_weights(args), backend=args.backend,
                          **({"native_blocks": False} if args.max_loras else {}))  # LoRA products need torch blocks
    return engine, named.tokenizer


def _adapters(args: argparse.Namespace, engine) -> None:
    """The --lora adapters, each read and checked before any request is served (a bad one stops the server)."""
    if not args.max_loras:
        return
    slots = engine.serve_adapters(max_loras=args.max_loras, max_rank=args.max_lora_rank)
    for name, path in args.lora:
        ref = slots.load(name, path)
        print(f"anatomy serve: LoRA adapter {name!r} (rank {ref.rank}) from {path}", file=sys.stderr, flush=True)


def _report(args: argparse.Namespace, loop, seconds: float) -> None:
    """The start-up lines: the model's weights and the kernels serving them, the KV cache, the limits."""
    from anatomy import dtypes
    from anatomy.inference.engine import PagedKVCache

    engine = loop.engine
    blocks = loop.blocks.num_blocks
    block_bytes = PagedKVCache.block_bytes(engine.config, args.block_size, engine.kv_dtype)
    total = blocks * block_bytes if loop.window is None else _window_bytes(loop, args.block_size)[0]
    tokens = blocks * loop.blocks.block_size
    print(f"anatomy serve: {args.model} (weights {args.weights}, {args.dtype}, branches "
          f"{dtypes.name_of(engine.branch_dtype)}) ready in {seconds:.1f} s; kernels "
          f"{'; '.join(engine.kernel_summary())}; a decode step reads {engine.decode_weight_bytes / 1e6:,.0f} MB "
          f"of weights, {engine.native_blocks} of {engine.config.n_layers} blocks as one native "
          f"operator each, {engine.captured_graphs} decode-step shapes captured ({engine.backend.name} backend)",
          file=sys.stderr, flush=True)
    print(f"anatomy serve: KV cache {engine.kv_dtype}, {total / 2 ** 20:,.0f} MiB = {blocks:,} blocks of "
          f"{loop.blocks.block_size} tokens "
          f"= {tokens:,} tokens ({block_bytes // loop.blocks.block_size:,} B per token); context {loop.context:,} "
          f"tokens per sequence, up to {args.batch_size} sequences and {args.max_step_tokens} tokens per step; "
          f"prefix cache {'off' if args.no_prefix_cache else 'on'}; scheduling {args.scheduling_policy}; "
          f"speculative decoding "
          f"{_speculation_note(args, loop)}", file=sys.stderr, flush=True)
    if loop.window is not None:
        print(f"anatomy serve: {_window_note(loop, args.block_size)}", file=sys.stderr, flush=True)
    if getattr(loop, "offload", None) is not None:
        offload = loop.offload
        print(f"anatomy serve: evicted KV blocks kept in {offload.host_bytes / 2 ** 20:,.0f} MiB of host memory"
              f"{f', then in {offload.directory} (also every cached block at shutdown)' if offload.directory else ''}",
              file=sys.stderr, flush=True)
    layout = getattr(engine, "layout", None)
    if layout is not None:
        print(f"anatomy serve: {layout.describe()}: the weights, kernels and KV cache above are rank 0's shard; "
              "every rank holds its own", file=sys.stderr, flush=True)
    if layout is not None and layout.pp > 1:
        print(f"anatomy serve: {layout.pp} serving lanes (one per pipeline stage, each 1/{layout.pp} of the KV "
              "cache and its own batch): their steps overlap on the stages", file=sys.stderr, flush=True)
    config_context = loop.engine.config.max_seq_len
    if loop.context < config_context:
        print(f"anatomy serve: warning: the KV memory holds {loop.context:,} tokens, less than the model's context "
              f"of {config_context:,}: requests are limited to {loop.context:,} tokens", file=sys.stderr, flush=True)


def _window_note(loop, block_size: int) -> str:
    """The capacity line of a cache whose sliding-window layers have their own group of blocks."""
    held, unwindowed = _window_bytes(loop, block_size)
    config, window = loop.engine.config, loop.window
    return (f"the sliding-window layers ({sum(loop.cache.windowed)} of {config.cached_layers}, window "
            f"{window.window:,}) keep {window.manager.num_blocks:,} blocks of their own and give back those outside "
            f"the window: the cache is {held / 2 ** 20:,.0f} MiB, where every layer holding all of its "
            f"{loop.blocks.num_blocks * block_size:,} tokens would need {unwindowed / 2 ** 20:,.0f} MiB")


def _window_bytes(loop, block_size: int) -> tuple[int, int]:
    """(bytes of a windowed cache's two groups of blocks, bytes of every layer holding the full group's tokens)."""
    from anatomy.inference.engine import PagedKVCache

    config, dtype = loop.engine.config, loop.engine.kv_dtype
    full_bytes = PagedKVCache.block_bytes(config, block_size, dtype, windowed=False)
    window_bytes = PagedKVCache.block_bytes(config, block_size, dtype, windowed=True)
    held = loop.blocks.num_blocks * full_bytes + loop.window.manager.num_blocks * window_bytes
    return held, loop.blocks.num_blocks * (full_bytes + window_bytes)


def _speculation(args: argparse.Namespace, tokenizer):
    """The server's default speculation (None: only requests that ask, by prompt lookup)."""
    from anatomy.inference.speculative.rounds import ServedSpeculation

    options = speculative_options(args, tokenizer)
    if not options:
        return None
    return ServedSpeculation(method=args.speculative, num_speculative_tokens=args.num_speculative_tokens or 5,
                             draft=options["draft_model"])


def _speculation_note(args: argparse.Namespace, loop) -> str:
    speculation = loop.speculation
    if speculation is None:
        return "only for requests that set speculative.n_max (prompt lookup)"
    note = f"{speculation.method}, up to {speculation.num_speculative_tokens} tokens per step"
    if loop.drafter is not None:
        draft = loop.drafter
        name = args.draft_model or args.model
        layers = f", its first {args.draft_layers} blocks" if args.draft_layers is not None else ""
        note += (f" (draft {name}{layers}: weights {draft.engine.decode_weight_bytes / 1e6:,.0f} MB a step, "
                 f"its KV cache {loop.blocks.num_blocks * draft.block_bytes / 2 ** 20:,.0f} MiB beside the target's)")
    return note


def _pooling(state, args: argparse.Namespace, engine, tokenizer) -> None:
    """The embedder and the reranker: other models, or the served decoder itself ('self')."""
    from anatomy.serving.pooling import decoder_embedder, encoder_embedder
    from anatomy.serving.rerank import CrossEncoder, YesNoReranker

    if args.embedding_model == "self":
        state.embedder = decoder_embedder(engine, tokenizer, args.embedding_pooling)
    elif state.embedding_name is not None:
        state.embedder = encoder_embedder(state.embedding_name)
    if args.rerank_model == "self":
        state.reranker = YesNoReranker(engine, tokenizer, instruction=args.rerank_instruction)
    elif args.rerank_model is not None:
        state.reranker = CrossEncoder(args.rerank_model)


def parse_memory(text: str) -> int:
    """Bytes of --kv-memory: '2GiB', '512MB', '1e9'; a fraction of the machine's memory from '0.1'."""
    if text.strip() in ("0", "0.0"):
        raise InputError(f"--kv-memory {text!r} must be a positive size or a fraction in (0, 1)")
    return parse_bytes(text, option="--kv-memory")


def _check_args(args: argparse.Namespace) -> None:
    for name, value, low in (("--port", args.port, 0), ("--block-size", args.block_size, 1),
                             ("--batch-size", args.batch_size, 1), ("--max-step-tokens", args.max_step_tokens, 1),
                             ("--max-body-bytes", args.max_body_bytes, 1), ("--max-queue", args.max_queue, -1),
                             ("--shutdown-timeout", args.shutdown_timeout, 0),
                             ("--reasoning-budget", args.reasoning_budget, -1)):
        if value < low:
            raise InputError(f"{name} {value} must be >= {low}")
    if args.port > 65535:
        raise InputError(f"--port {args.port} must be <= 65535")
    if args.api_key is not None and not args.api_key.strip():
        raise InputError("--api-key must not be empty")
    if args.reasoning_budget >= 0 and args.reasoning_parser is None:
        raise InputError("--reasoning-budget needs --reasoning-parser (which names how thinking blocks are written)")
    check_speculative_options(args)
    _check_lora(args)
    offload = args.kv_offload_dir is not None or parse_bytes(args.kv_offload_bytes, option="--kv-offload-bytes")
    if offload and (args.tensor_parallel_size > 1 or args.pipeline_parallel_size > 1):
        raise InputError("--kv-offload-bytes and --kv-offload-dir serve one rank only (not with "
                         "--tensor-parallel-size or --pipeline-parallel-size)")


def _check_lora(args: argparse.Namespace) -> None:
    """--lora NAME=PATH as (name, path) pairs, each name once; --max-loras filled in and checked."""
    pairs = []
    for item in args.lora:
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise InputError(f"--lora {item!r} must be NAME=PATH (a PEFT directory or a GGUF LoRA file)")
        if name == args.model or name in (n for n, _ in pairs):
            taken = "the model's" if name == args.model else "another adapter's"
            raise InputError(f"--lora {item!r}: the name {name!r} is {taken}")
        pairs.append((name, path))
    args.lora = pairs
    if args.max_loras is None:
        args.max_loras = max(len(pairs), 4 if args.allow_runtime_lora else 0)
    if args.max_loras < len(pairs) or args.max_loras < 0 or args.max_lora_rank < 1:
        raise InputError(f"--max-loras {args.max_loras} must be >= the {len(pairs)} --lora adapters, and "
                         f"--max-lora-rank {args.max_lora_rank} >= 1")
    if args.allow_runtime_lora and not args.max_loras:
        raise InputError("--allow-runtime-lora needs --max-loras >= 1")
    if args.max_loras and (args.tensor_parallel_size > 1 or args.pipeline_parallel_size > 1):
        raise InputError("LoRA adapters (--lora, --max-loras) are served on one rank only (not with "
                         "--tensor-parallel-size or --pipeline-parallel-size)")


def _embedding_name(option: str | None) -> str | None:
    if option is not None and option.lower() == "none":
        return None
    if option is not None:
        _resolve(option, "--embedding-model", "embedding")
        return option
    try:
        _resolve(DEFAULT_EMBEDDING_MODEL, "--embedding-model", "embedding")
    except InputError:
        return None  # the default encoder is not installed: no embeddings endpoint model
    return DEFAULT_EMBEDDING_MODEL


def _resolve(name: str, option: str, needs: str) -> None:
    from anatomy.inference.loading import checkpoint_of

    try:
        checkpoint_of(name, needs)
    except InputError as exc:
        raise InputError(f"{option}: {exc}") from None


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise InputError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(2048)
    return sock


def _uvicorn(app, state, shutdown_timeout: float):
    import asyncio

    import uvicorn

    from anatomy.serving.generation import drain

    class DrainingServer(uvicorn.Server):
        """uvicorn, whose first SIGTERM/SIGINT drains the app (serving.app.drain) before it exits; a
        second one is uvicorn's own (SIGINT: at once)."""

        async def serve(self, sockets=None) -> None:
            self.aio = asyncio.get_running_loop()
            await super().serve(sockets)

        def handle_exit(self, sig, frame) -> None:
            if state.draining or not hasattr(self, "aio"):
                return super().handle_exit(sig, frame)
            state.draining = True
            print(f"anatomy serve: shutting down: new requests get 503, those in flight have {shutdown_timeout:g} s",
                  file=sys.stderr, flush=True)
            self.aio.call_soon_threadsafe(lambda: asyncio.ensure_future(self._drain()))

        async def _drain(self) -> None:
            await drain(state, shutdown_timeout)
            if state.loop is not None:
                await asyncio.to_thread(state.loop.stop)
            self.should_exit = True

    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=3,
                            loop="asyncio", http="h11")
    return DrainingServer(config)
