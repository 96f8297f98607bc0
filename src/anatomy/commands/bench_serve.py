"""`anatomy bench-serve`: load-test an OpenAI-compatible server on this machine.

    anatomy bench-serve --url http://127.0.0.1:8000 --concurrency 16 --requests 64
    anatomy bench-serve --url http://127.0.0.1:8000 --rate 4 --requests 100 --json
    anatomy bench-serve --shared-prefix-words 1500 --requests 32      # one long system prompt, many users
    anatomy bench-serve --priority-share 0.25 --concurrency 16          # a quarter of them with priority -1
"""

from __future__ import annotations

import argparse
import json
import os

from anatomy.commands.common import DefaultsHelpFormatter, add_quiet_option
from anatomy.errors import InputError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench-serve", help="load-test an OpenAI-compatible server: throughput, TTFT, TPOT, latency percentiles",
        description="Send streamed completion requests to a server on this machine (anatomy serve, llama-server, "
                    "vLLM, ...) at a fixed concurrency or with Poisson arrivals, and report request and token "
                    "throughput and the mean, median and p99 of TTFT, TPOT, inter-token and end-to-end latency "
                    "(the figures vLLM's serving benchmark reports).",
        formatter_class=DefaultsHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL (loopback only)")
    p.add_argument("--model", default="smollm2-135m-instruct", help="the model name the requests carry")
    p.add_argument("--concurrency", type=int, default=4, help="most requests in flight at once")
    p.add_argument("--requests", type=int, default=32, help="how many requests to send")
    p.add_argument("--rate", type=float, default=None,
                   help="Poisson arrivals at this many requests/s (default: all at once, capped by --concurrency)")
    p.add_argument("--input-words", type=int, default=64, help="words per prompt (random ordinary words)")
    p.add_argument("--shared-prefix-words", type=int, default=0,
                   help="the same text of this many words before every prompt (a long system prompt shared by "
                        "many users: what a prefix cache saves)")
    p.add_argument("--priority-share", type=float, default=0.0,
                   help="this share of the requests (at random) carry priority -1, the rest 0 (vLLM's field; a "
                        "server under --scheduling-policy priority runs them first); the figures also per priority")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens each request generates (EOS ignored)")
    p.add_argument("--chat", action="store_true", help="use /v1/chat/completions instead of /v1/completions")
    p.add_argument("--api-key", default=None, help="sent as a Bearer token (default: $ANATOMY_API_KEY, else none)")
    p.add_argument("--seed", type=int, default=0, help="prompts and arrival times")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_quiet_option(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from anatomy.loadgen import make_prompts, priority_mix, run_benchmark

    for name, value, low in (("--requests", args.requests, 1), ("--input-words", args.input_words, 1),
                             ("--max-tokens", args.max_tokens, 1), ("--shared-prefix-words", args.shared_prefix_words, 0)):
        if value < low:
            raise InputError(f"{name} {value} must be >= {low}")
    prompts = make_prompts(args.requests, args.input_words, seed=args.seed, shared_words=args.shared_prefix_words)
    priorities = priority_mix(args.requests, args.priority_share, seed=args.seed) if args.priority_share else None
    result = run_benchmark(args.url, model=args.model, prompts=prompts,
                           max_tokens=args.max_tokens, concurrency=args.concurrency, rate=args.rate, chat=args.chat,
                           api_key=args.api_key or os.environ.get("ANATOMY_API_KEY"), extra={"ignore_eos": True},
                           seed=args.seed, groups=priorities,
                           fields=[{"priority": p} for p in priorities] if priorities else None)
    print(json.dumps(result.as_dict(), indent=2) if args.json else result.report())
    if result.failed == result.requests:
        raise InputError(f"every request failed; the first: {result.errors[0]}")
    return 0
