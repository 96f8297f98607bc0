"""A smaller KV cache: int8 and fp8 keys and values against the bf16 cache and llama.cpp's q8_0 cache.

Same machine, same run, SmolLM2-135M-Instruct from its Q4_1 GGUF, 2 threads:

- quality: mean token NLL on 2,068 tokens of English (tests/data/english.txt) fed through the cache
  (anatomy.inference.quality.cached_nll, spans of 64 tokens), relative to the bf16 cache; llama.cpp's
  f16 and q8_0 caches (llama-cpp-python's type_k/type_v, flash attention) on the same tokens;
- bytes: KV bytes per token (anatomy.kv_format.kv_bytes_per_token) and the tokens a served 256 MiB
  budget holds, read from `anatomy serve`'s own start-up line;
- speed: decode tok/s at a 2,048-token context through the public API (anatomy.generate(model, ...,
  kv_dtype=...)), against `llama-bench -d 2048` with -ctk/-ctv f16 and q8_0 (flash attention on).

Targets (issue 20): int8 NLL within +0.5% of the unquantized cache; bytes per token halved and the
served capacity doubled; decode at 2,048 no slower than the unquantized cache.

    python -m benchmarks kv
"""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

import anatomy
from anatomy.checkpoints.registry import resolve
from anatomy.inference.engine import DecoderEngine
from anatomy.inference.quality import cached_nll
from anatomy.kv_format import available, kv_bytes_per_token
from benchmarks.llama_cpp import llama_tool

MODEL = "smollm2-135m-instruct"
ENGLISH = Path(__file__).parents[1] / "tests" / "data" / "english.txt"
DEPTH, NEW, REPEATS = 2048, 128, 3
KINDS = ("bf16", *[k for k in ("int8", "fp8_e4m3", "fp8_e5m2") if k in available()])
GGML = {"f16": 1, "q8_0": 8}  # ggml's type ids for llama.cpp's type_k / type_v


def llama_nll(gguf: Path, ids: list[int], cache: str) -> float:
    """Mean token NLL of llama.cpp on `ids` with its K and V cache in `cache` (f16 or q8_0)."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(gguf), n_ctx=len(ids) + 8, n_batch=512, logits_all=True, type_k=GGML[cache],
                type_v=GGML[cache], flash_attn=True, n_threads=torch.get_num_threads(), verbose=False)
    llm.eval(ids)
    logits = np.asarray(llm.scores[:len(ids) - 1], dtype=np.float64)  # position i predicts token i + 1
    logits -= logits.max(axis=1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(ids) - 1), ids[1:]].mean())


def llama_depth(gguf: Path, cache: str) -> float:
    """llama-bench's decode tok/s after DEPTH tokens, its cache in `cache`."""
    import json

    out = subprocess.run([llama_tool("llama-bench"), "-m", str(gguf), "-t", str(torch.get_num_threads()), "-p", "0",
                          "-n", str(NEW), "-d", str(DEPTH), "-ctk", cache, "-ctv", cache, "-fa", "1", "-o", "json",
                          "-r", "3"], capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"llama-bench failed:\n{out.stderr[-2000:]}")
    return float(json.loads(out.stdout)[0]["avg_ts"])


def served_tokens(kind: str) -> int:
    """The tokens `anatomy serve --kv-dtype kind --kv-memory 256MiB` says its cache holds."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "anatomy", "serve", "--port", str(port), "--kv-dtype", kind,
                             "--kv-memory", "256MiB", "--embedding-model", "none"], stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            if match := re.search(r"KV cache \S+, .* = ([0-9,]+) tokens", line):
                return int(match.group(1).replace(",", ""))
        raise RuntimeError("anatomy serve printed no KV cache line")
    finally:
        proc.terminate()
        proc.wait(30)


def decode_at_depth(model: torch.nn.Module, kind: str, prompt: list[int]) -> float:
    anatomy.generate(model, prompt, kv_dtype=kind, max_new_tokens=NEW, ignore_eos=True)  # warm: the kept engine
    return statistics.median(anatomy.generate(model, prompt, kv_dtype=kind, max_new_tokens=NEW,
                                              ignore_eos=True).tokens_per_s for _ in range(REPEATS))


def main() -> None:
    gguf = resolve(MODEL)
    model = anatomy.load(gguf)
    tokenizer = anatomy.load_tokenizer(MODEL)
    ids = tokenizer.encode(ENGLISH.read_text())
    g = torch.Generator().manual_seed(2)
    deep = torch.randint(200, 40000, (DEPTH,), generator=g).tolist()
    print(f"quality: {len(ids)} tokens of English through each cache ...", flush=True)
    nll = {kind: cached_nll(DecoderEngine(model, kv_dtype=kind), ids) for kind in KINDS}
    llama = {cache: llama_nll(gguf, ids, cache) for cache in GGML}
    print("speed: decode at a 2,048-token context (anatomy.generate, llama-bench) ...", flush=True)
    start = time.perf_counter()
    speed = {kind: decode_at_depth(model, kind, deep) for kind in KINDS}
    llama_speed = {cache: llama_depth(gguf, cache) for cache in GGML}
    print(f"  ({time.perf_counter() - start:.0f} s); served capacity (anatomy serve's start-up line) ...", flush=True)
    served = {kind: served_tokens(kind) for kind in ("bf16", "int8")}
    config = model.config
    print(f"\n| KV cache | mean NLL | vs its float cache | bytes per token | decode tok/s at {DEPTH} | vs the float "
          f"cache | served tokens in 256 MiB |")
    print("|---|---|---|---|---|---|---|")
    for kind in KINDS:
        print(f"| anatomy {kind} | {nll[kind]:.4f} | {nll[kind] / nll['bf16'] - 1:+.3%} | "
              f"{kv_bytes_per_token(config, kind):,} | {speed[kind]:.1f} | {speed[kind] / speed['bf16']:.2f}x | "
              f"{f'{served[kind]:,}' if kind in served else '-'} |")
    ggml_bytes = {"f16": 2 * config.kv_values_per_token, "q8_0": config.kv_values_per_token * 34 // 32}  # q8_0: 34 B / 32
    for cache in GGML:
        print(f"| llama.cpp {cache} | {llama[cache]:.4f} | {llama[cache] / llama['f16'] - 1:+.3%} | "
              f"{ggml_bytes[cache]:,} | "
              f"{llama_speed[cache]:.1f} | {llama_speed[cache] / llama_speed['f16']:.2f}x | - |")
    print(f"\nserved capacity int8 / bf16: {served['int8'] / served['bf16']:.2f}x; bytes per token "
          f"{kv_bytes_per_token(config, 'int8') / kv_bytes_per_token(config, 'bf16'):.3f}x "
          f"(llama.cpp's q8_0: 34 bytes per 32 values = 0.531x of f16)")


if __name__ == "__main__":
    main()
