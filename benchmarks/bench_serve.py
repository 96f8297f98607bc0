"""Serving throughput and latency: `anatomy serve` against llama.cpp's own server (`llama-server`,
continuous batching, one slot per concurrent request) and llama-cpp-python's server
(`python -m llama_cpp.server`), on the same GGUF file (the embedded SmolLM2-135M-Instruct Q4_1),
with the same prompts and the same client (anatomy.serving.bench, vLLM's serving metrics).

    every server started and warmed up; then for concurrency 1, 4, 16, each server in turn:
        REQUESTS x concurrency streamed /v1/completions requests, all at once behind the concurrency cap,
        PROMPT_WORDS random ordinary words each, MAX_TOKENS new tokens each (EOS ignored), greedy
        (ROUNDS times over: the run with the median output tok/s is reported)
    threads: torch's intra-op count for anatomy; -t / --n_threads the same for the llama.cpp servers

    python -m benchmarks serve
        ANATOMY_BENCH_SERVE_REQUESTS=3 (per unit of concurrency), ANATOMY_BENCH_SERVE_MAX_TOKENS=128,
        ANATOMY_BENCH_SERVE_CONCURRENCY=1,4,16, ANATOMY_BENCH_SERVE_SERVERS=anatomy,llama-server,llama_cpp.server
        ANATOMY_BENCH_SERVE_ROUNDS=1, ANATOMY_BENCH_SERVE_DTYPES=f32,bf16 (anatomy's; bf16 only on CPUs with bf16 instructions)
        LLAMA_SERVER=/path/to/llama-server (else benchmarks/build_llama_cpp.sh builds it, once, ~10-15 min)

Figures vary with the machine's load: the targets are judged on a run with the machine otherwise idle.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import torch

from anatomy.serving.bench import BenchResult, make_prompts, run_benchmark
from benchmarks.llama_cpp import llama_tool

MODEL = "smollm2-135m-instruct"
REQUESTS = int(os.environ.get("ANATOMY_BENCH_SERVE_REQUESTS", "3"))
MAX_TOKENS = int(os.environ.get("ANATOMY_BENCH_SERVE_MAX_TOKENS", "128"))
PROMPT_WORDS = 64
ROUNDS = int(os.environ.get("ANATOMY_BENCH_SERVE_ROUNDS", "1"))
CONCURRENCY = [int(c) for c in os.environ.get("ANATOMY_BENCH_SERVE_CONCURRENCY", "1,4,16").split(",")]
SERVERS = os.environ.get("ANATOMY_BENCH_SERVE_SERVERS", "anatomy,llama-server,llama_cpp.server").split(",")
DTYPES = os.environ.get("ANATOMY_BENCH_SERVE_DTYPES", "f32,bf16").split(",")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gguf_path() -> Path:
    from anatomy.checkpoints.registry import resolve

    return resolve(MODEL)


def llama_server_binary() -> str:
    return llama_tool("llama-server")


def cpu_has_bf16() -> bool:
    """Does this CPU have bf16 matrix instructions (AVX-512 BF16 or AMX)? Without them torch's bf16
    products are emulated and hundreds of times slower than f32 (docs/serving.md)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def anatomy_variants() -> list[str]:
    return [f"anatomy {d}" for d in DTYPES if d != "bf16" or cpu_has_bf16()]


def server_command(name: str, port: int, threads: int, slots: int) -> tuple[list[str], dict, str]:
    """(argv, extra request fields, readiness path) of each server."""
    gguf = str(gguf_path())
    context = slots * (PROMPT_WORDS * 2 + MAX_TOKENS + 64)
    if name.startswith("anatomy"):
        dtype = name.split()[-1]
        return ([sys.executable, "-m", "anatomy", "serve", "--port", str(port), "--kv-memory", "1GiB",
                 "--dtype", dtype, "--embedding-model", "none", "--batch-size", str(max(slots, 16))],
                {"ignore_eos": True}, "/health")
    if name == "llama-server":
        return ([llama_server_binary(), "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
                 "-tb", str(threads), "--parallel", str(slots), "--cont-batching", "-c", str(context), "--no-webui",
                 "--log-disable"], {"ignore_eos": True}, "/health")
    if name == "llama_cpp.server":
        # no ignore_eos here: the end-of-generation ids are made impossible instead
        return ([sys.executable, "-m", "llama_cpp.server", "--model", gguf, "--model_alias", MODEL, "--host",
                 "127.0.0.1", "--port", str(port), "--n_threads", str(threads), "--n_threads_batch", str(threads),
                 "--interrupt_requests", "False",
                 "--n_ctx", str(PROMPT_WORDS * 2 + MAX_TOKENS + 64)],
                {"logit_bias": {"0": -100.0, "2": -100.0}}, "/v1/models")
    raise ValueError(name)


def start(argv: list[str], port: int, ready: str, log) -> subprocess.Popen:
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{argv[0]} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{ready}", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"{argv[0]} was not ready in 300 s")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Running:
    """One server up for the whole run (idle servers cost nothing), so that the servers can be
    measured in turn, each concurrency level after the others: they share the machine's ups and downs."""

    def __init__(self, name: str, threads: int) -> None:
        self.name, self.port = name, free_port()
        argv, self.extra, ready = server_command(name, self.port, threads, max(CONCURRENCY))
        self.log = tempfile.TemporaryFile()
        self.proc = start(argv, self.port, ready, self.log)
        self.url = f"http://127.0.0.1:{self.port}"
        if name.startswith("anatomy"):  # its start-up report: the weights, the kernels per phase, the KV cache
            self.log.seek(0)
            print("\n".join(f"  {line}" for line in self.log.read().decode(errors="replace").splitlines()
                            if "ready in" in line), flush=True)
        self.run(make_prompts(2, PROMPT_WORDS, seed=99), 8, 2)  # warm-up

    def run(self, prompts: list[str], max_tokens: int, concurrency: int) -> BenchResult:
        result = run_benchmark(self.url, model=MODEL, prompts=prompts, max_tokens=max_tokens,
                               concurrency=concurrency, extra=self.extra)
        if result.failed:
            raise RuntimeError(f"{self.name}: {result.failed} requests failed: {result.errors[:2]}")
        return result

    def close(self) -> None:
        stop(self.proc)
        self.log.close()


def measure(servers: list[Running]) -> dict[str, dict[int, BenchResult]]:
    """Every concurrency level, ROUNDS times, the servers in turn; per server and level the run with
    the median output throughput."""
    runs: dict[str, dict[int, list[BenchResult]]] = {s.name: {c: [] for c in CONCURRENCY} for s in servers}
    for round_ in range(ROUNDS):
        for concurrency in CONCURRENCY:
            prompts = make_prompts(REQUESTS * concurrency, PROMPT_WORDS, seed=concurrency + 100 * round_)
            for server in servers:
                r = server.run(prompts, MAX_TOKENS, concurrency)
                runs[server.name][concurrency].append(r)
                print(f"  {server.name} c={concurrency}: {r.output_throughput:.1f} output tok/s, TTFT median "
                      f"{r.ttft_ms['median']:.0f} ms p99 {r.ttft_ms['p99']:.0f} ms, TPOT median "
                      f"{r.tpot_ms['median']:.1f} ms", flush=True)
    return {name: {c: sorted(rs, key=lambda r: r.output_throughput)[len(rs) // 2] for c, rs in by_c.items()}
            for name, by_c in runs.items()}


def table(runs: dict[str, dict[int, BenchResult]]) -> str:
    head = ("| server | concurrency | output tok/s | req/s | TTFT median / p99 (ms) | TPOT median / p99 (ms) "
            "| ITL median / p99 (ms) | E2E latency median (s) |")
    lines = [head, "|" + "---|" * 8]
    for name, by_c in runs.items():
        for c, r in by_c.items():
            lines.append(f"| {name} | {c} | {r.output_throughput:.1f} | {r.request_throughput:.2f} | "
                         f"{r.ttft_ms['median']:.0f} / {r.ttft_ms['p99']:.0f} | "
                         f"{r.tpot_ms['median']:.1f} / {r.tpot_ms['p99']:.1f} | "
                         f"{r.itl_ms['median']:.1f} / {r.itl_ms['p99']:.1f} | {r.e2el_ms['median'] / 1e3:.2f} |")
    return "\n".join(lines)


def targets(runs: dict[str, dict[int, BenchResult]]) -> list[str]:
    top, lines = max(CONCURRENCY), []
    for name in (n for n in runs if n.startswith("anatomy")):
        ours = runs[name]
        if top in ours and top in runs.get("llama-server", {}):
            ratio = ours[top].output_throughput / runs["llama-server"][top].output_throughput
            lines.append(f"{name}: output tok/s at concurrency {top}: {ratio:.2f}x llama-server "
                         "(target >= 1.0x, moonshot 2x)")
        if top in ours and 1 in ours:
            ratio = ours[top].output_throughput / ours[1].output_throughput
            lines.append(f"{name}: output tok/s at concurrency {top}: {ratio:.2f}x its own at concurrency 1 "
                         "(target >= 3x)")
        if top in ours:
            ttft = ours[top].ttft_ms
            lines.append(f"{name}: p99 TTFT at concurrency {top}: {ttft['p99'] / ttft['median']:.2f}x its median "
                         "(target < 2x)")
    return lines


def main() -> None:
    threads = torch.get_num_threads()
    print(f"{MODEL} ({gguf_path().name}), {PROMPT_WORDS}-word prompts, {MAX_TOKENS} new tokens each (EOS ignored), "
          f"greedy; {REQUESTS} x concurrency requests per run, {ROUNDS} round(s); {threads} threads", flush=True)
    names = [v for name in SERVERS for v in (anatomy_variants() if name == "anatomy" else [name])]
    servers: list[Running] = []
    try:
        for name in names:
            servers.append(Running(name, threads))
        runs = measure(servers)
    finally:
        for server in servers:
            server.close()
    print()
    print(table(runs))
    print()
    print("\n".join(targets(runs)))


if __name__ == "__main__":
    main()
