"""Serving throughput and latency: `anatomy serve` against llama.cpp's own server (`llama-server`,
continuous batching, one slot per concurrent request) and llama-cpp-python's server
(`python -m llama_cpp.server`), on the same GGUF file (the embedded SmolLM2-135M-Instruct Q4_1),
with the same prompts and the same client (anatomy.loadgen, vLLM's serving metrics).

Three scenarios, each server started once and warmed up, the servers measured in turn:

    plain        random 64-word prompts, /v1/completions, concurrency 1, 4, 16: anatomy (its defaults),
                 llama-server, llama_cpp.server
    speculative  input-grounded chat prompts (benchmarks/speculative_prompts.py: copy-edits, typo fixes,
                 code edits), concurrency 1 and 4: anatomy plain and with llama-server's per-request
                 `speculative.n_max` = 5 (prompt lookup), llama-server plain
    draft        a draft model's proposals: the target in f32 (--weights f32), the draft the file's own
                 Q4_1 blocks (--speculative draft --draft-model, --draft-weights auto), grounded and
                 open-ended chat prompts, concurrency 1 and 4, against the same f32 server plain
    kv           long prompts (800 words), concurrency 16, a 128 MiB KV budget: anatomy --kv-dtype bf16
                 against --kv-dtype int8 (twice the tokens in the same memory)
    prefix       one long system prompt (~2,000 tokens) before each user's question, one request at a
                 time: TTFT cold, with the prefix cached, and after a restart with the same
                 --kv-offload-dir (the prefix restored from its files)
    priority     concurrency 16, a quarter of the requests with priority -1: their TTFT and latency
                 against the others', under --scheduling-policy priority and under fcfs
    lora         concurrency 16 on one server holding 8 rank-16 adapters (q, k, v, o, gate, up, down,
                 random): requests spread over 1, 3 and 8 of them against the same requests to the
                 base model (the cost of mixing adapters in a batch step); llama-server the same, its
                 adapters converted by llama.cpp's convert_lora_to_gguf.py, picked by the request's
                 `lora` list

Every run: REQUESTS x concurrency streamed requests (at least MIN_REQUESTS) behind the concurrency cap,
MAX_TOKENS new tokens each (EOS ignored: a run whose server gave another count fails the benchmark),
greedy, ROUNDS rounds (at least 3: the run with the median output tok/s is reported); threads: torch's
intra-op count for anatomy, -t / --n_threads the same for the llama.cpp servers. The run starts with its
provenance: anatomy's commit and kernels, the CPU, llama-server's build.

    python -m benchmarks serve
        ANATOMY_BENCH_SERVE_REQUESTS=3 (per unit of concurrency), ANATOMY_BENCH_SERVE_MAX_TOKENS=128,
        ANATOMY_BENCH_SERVE_ROUNDS=3, ANATOMY_BENCH_SERVE_SCENARIOS=plain,speculative,draft,kv,prefix,priority,lora
        LLAMA_SERVER=/path/to/llama-server (else benchmarks/build_llama_cpp.sh builds it, once, ~10-15 min)

Targets (issues 11, 22, 20): concurrency 1 >= 1.0x llama-server's, concurrency 16 >= 1.5x; speculation
faster on grounded prompts with the same greedy text; int8 KV at least as fast as bf16 with long prompts.
Figures vary with the machine's load: the targets are judged on a run with the machine otherwise idle.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import torch

import anatomy
from anatomy.loadgen import BenchResult, make_prompts, priority_mix, run_benchmark
from benchmarks.llama_cpp import llama_tool
from benchmarks.provenance import anatomy_lines, llama_lines, print_provenance

MODEL = "smollm2-135m-instruct"
REQUESTS = int(os.environ.get("ANATOMY_BENCH_SERVE_REQUESTS", "3"))
MAX_TOKENS = int(os.environ.get("ANATOMY_BENCH_SERVE_MAX_TOKENS", "128"))
PROMPT_WORDS, LONG_WORDS = 64, 800
ROUNDS = max(3, int(os.environ.get("ANATOMY_BENCH_SERVE_ROUNDS", "3")))
MIN_REQUESTS = 16  # per run: fewer make a median of noise
SCENARIOS = os.environ.get("ANATOMY_BENCH_SERVE_SCENARIOS",
                           "plain,speculative,draft,kv,prefix,priority,lora").split(",")
ADAPTERS, LORA_RANK = 8, 16
SHARED_WORDS = 2000  # the system prompt every user of the prefix scenario shares (~2,000 tokens)
SPECULATIVE = {"speculative.n_max": 5}
PLAIN = {"speculative.n_max": 0}  # on a server that speculates by default: this request does not
DRAFTED = f"anatomy --weights f32 --speculative draft --draft-model {MODEL} --draft-weights auto"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gguf_path() -> Path:
    from anatomy.checkpoints.registry import resolve

    return resolve(MODEL)


def llama_server_binary() -> str:
    return llama_tool("llama-server")


def server_command(name: str, port: int, threads: int, slots: int) -> tuple[list[str], dict, str]:
    """(argv, extra request fields, readiness path) of each server: "anatomy [--option value ...]",
    "llama-server", "llama_cpp.server"."""
    gguf = str(gguf_path())
    context = slots * (LONG_WORDS * 2 + MAX_TOKENS + 64)
    if name.startswith("anatomy"):
        options = name.split()[1:]
        return ([sys.executable, "-m", "anatomy", "serve", "--port", str(port), "--kv-memory", "1GiB",
                 "--embedding-model", "none", "--batch-size", str(max(slots, 16)), *options],
                {"ignore_eos": True}, "/health")
    if name.startswith("llama-server"):
        return ([llama_server_binary(), "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
                 "-tb", str(threads), "--parallel", str(slots), "--cont-batching", "-c", str(context), "--no-webui",
                 "--log-disable", *name.split()[1:]], {"ignore_eos": True}, "/health")
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
            log.seek(0)
            said = log.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"{' '.join(argv[:4])} ... exited with {proc.returncode}:\n{said}")
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

    def __init__(self, name: str, threads: int, slots: int = 16) -> None:
        self.name, self.port = name, free_port()
        argv, self.extra, ready = server_command(name, self.port, threads, slots)
        self.log = tempfile.TemporaryFile()
        self.proc = start(argv, self.port, ready, self.log)
        self.url = f"http://127.0.0.1:{self.port}"
        if name.startswith("anatomy"):  # its start-up report: the weights, the kernels per phase, the KV cache
            self.log.seek(0)
            print("\n".join(f"  {line}" for line in self.log.read().decode(errors="replace").splitlines()
                            if "ready in" in line or "KV cache" in line), flush=True)
        try:
            self.run(make_prompts(2, PROMPT_WORDS, seed=99), 8, 2)  # warm-up
        except BaseException:
            self.close()
            raise

    def run(self, prompts: list[str], max_tokens: int, concurrency: int, *, chat: bool = False,
            extra: dict | None = None, fields: list[dict] | None = None,
            groups: list | None = None) -> BenchResult:
        result = run_benchmark(self.url, model=MODEL, prompts=prompts, max_tokens=max_tokens,
                               concurrency=concurrency, extra={**self.extra, **(extra or {})}, chat=chat,
                               fields=fields, groups=groups)
        if result.failed:
            raise RuntimeError(f"{self.name}: {result.failed} requests failed: {result.errors[:2]}")
        return result

    def close(self) -> None:
        stop(self.proc)
        self.log.close()

    def __enter__(self) -> Running:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def measure(rows: dict[str, tuple[Running, dict]], prompts_of, levels: list[int], *,
            chat: bool = False) -> dict[str, dict[int, BenchResult]]:
    """Every concurrency level, ROUNDS times, the rows in turn ({row: (server, extra request fields)});
    per row and level the run with the median output throughput."""
    runs: dict[str, dict[int, list[BenchResult]]] = {name: {c: [] for c in levels} for name in rows}
    for round_ in range(ROUNDS):
        for concurrency in levels:
            prompts = prompts_of(max(MIN_REQUESTS, REQUESTS * concurrency), seed=concurrency + 100 * round_)
            for name, (server, extra) in rows.items():
                r = server.run(prompts, MAX_TOKENS, concurrency, chat=chat, extra=extra)
                _check_counts(name, r, len(prompts))
                runs[name][concurrency].append(r)
                print(f"  {name} c={concurrency}: {r.output_throughput:.1f} output tok/s, TTFT median "
                      f"{r.ttft_ms['median']:.0f} ms p99 {r.ttft_ms['p99']:.0f} ms, TPOT median "
                      f"{r.tpot_ms['median']:.1f} ms", flush=True)
    return {name: {c: sorted(rs, key=lambda r: r.output_throughput)[len(rs) // 2] for c, rs in by_c.items()}
            for name, by_c in runs.items()}


def _check_counts(name: str, r: BenchResult, requests: int) -> None:
    """Every request answered with MAX_TOKENS tokens: a throughput of other counts compares nothing."""
    if r.failed or r.output_tokens != requests * MAX_TOKENS:
        raise RuntimeError(f"{name}: {r.requests - r.failed} of {requests} requests answered with {r.output_tokens} "
                           f"tokens in all, not {requests} x {MAX_TOKENS}; errors: {r.errors[:3]}")


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


def ratio(runs: dict, a: str, b: str, c: int) -> float:
    return runs[a][c].output_throughput / runs[b][c].output_throughput


def plain(threads: int) -> list[str]:
    with contextlib.ExitStack() as up:  # a server that fails to start stops the ones already up
        servers = {name: up.enter_context(Running(name, threads))
                   for name in ("anatomy", "llama-server", "llama_cpp.server")}
        runs = measure({name: (s, {}) for name, s in servers.items()},
                       lambda n, seed: make_prompts(n, PROMPT_WORDS, seed=seed), [1, 4, 16])
    print("\n" + table(runs) + "\n")
    return [f"plain: concurrency 1 {ratio(runs, 'anatomy', 'llama-server', 1):.2f}x llama-server (>= 1.0x)",
            f"plain: concurrency 16 {ratio(runs, 'anatomy', 'llama-server', 16):.2f}x llama-server (>= 1.5x)",
            f"plain: concurrency 16 {runs['anatomy'][16].output_throughput / runs['anatomy'][1].output_throughput:.2f}x "
            f"its own concurrency 1 (>= 3x); p99 TTFT at 16: "
            f"{runs['anatomy'][16].ttft_ms['p99'] / runs['anatomy'][16].ttft_ms['median']:.2f}x its median (< 2x)"]


def speculative(threads: int) -> list[str]:
    from benchmarks.speculative_prompts import GROUNDED

    texts = [messages[0]["content"] for messages in GROUNDED.values()]
    with contextlib.ExitStack() as up:
        anatomy_server = up.enter_context(Running("anatomy", threads))
        llama = up.enter_context(Running("llama-server", threads))
        rows = {"anatomy": (anatomy_server, {}), "anatomy, speculative.n_max 5": (anatomy_server, SPECULATIVE),
                "llama-server": (llama, {})}
        runs = measure(rows, lambda n, seed: [texts[(seed + i) % len(texts)] for i in range(n)], [1, 4], chat=True)
        same = _same_text(anatomy_server, texts, {}, SPECULATIVE)
    print("\n" + table(runs) + "\n")
    return [f"speculative (grounded prompts): concurrency {c} {ratio(runs, 'anatomy, speculative.n_max 5', 'anatomy', c):.2f}x "
            f"plain anatomy, {ratio(runs, 'anatomy, speculative.n_max 5', 'llama-server', c):.2f}x llama-server"
            for c in (1, 4)] + [f"speculative: greedy text identical to plain on {same}/{len(texts)} prompts"]


def draft(threads: int) -> list[str]:
    from benchmarks.speculative_prompts import CHAT, GROUNDED

    lines = []
    with contextlib.ExitStack() as up:
        drafted = up.enter_context(Running(DRAFTED, threads))
        for kind, prompts in (("grounded", GROUNDED), ("chat", CHAT)):
            texts = [messages[0]["content"] for messages in prompts.values()]
            rows = {"anatomy --weights f32": (drafted, PLAIN), "anatomy --weights f32, Q4_1 draft": (drafted, {})}
            runs = measure(rows, lambda n, seed: [texts[(seed + i) % len(texts)] for i in range(n)], [1, 4], chat=True)
            print("\n" + table(runs) + "\n")
            same = _same_text(drafted, texts, PLAIN, {})
            lines += [f"draft ({kind} prompts): concurrency {c} "
                      f"{ratio(runs, 'anatomy --weights f32, Q4_1 draft', 'anatomy --weights f32', c):.2f}x plain f32"
                      for c in (1, 4)] + [f"draft ({kind}): greedy text identical to plain on {same}/{len(texts)} prompts"]
        lines.append(f"draft: {_acceptance(drafted)}")
    return lines


def _acceptance(server: Running) -> str:
    """The server's own count of proposed and kept tokens (/metrics)."""
    import re

    with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as r:
        text = r.read().decode()
    proposed, kept = (int(re.search(rf"anatomy_spec_decode_num_{name}_tokens_total\{{[^}}]*\}} (\d+)", text).group(1))
                      for name in ("draft", "accepted"))
    return f"{kept:,} of {proposed:,} proposed tokens kept ({kept / max(proposed, 1):.0%})"


def _same_text(server: Running, texts: list[str], plain_extra: dict, fast_extra: dict) -> int:
    """On how many prompts the greedy answer with speculation (`fast_extra` request fields) is the plain one
    (`plain_extra`), through the openai client."""
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none")
    same = 0
    for text in texts:
        answers = [client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}],
                                                  max_tokens=MAX_TOKENS, temperature=0, extra_body=extra)
                   .choices[0].message.content for extra in (plain_extra, fast_extra)]
        same += answers[0] == answers[1]
    return same


def kv(threads: int) -> list[str]:
    with contextlib.ExitStack() as up:
        servers = {kind: up.enter_context(Running(f"anatomy --kv-dtype {kind} --kv-memory 128MiB", threads))
                   for kind in ("bf16", "int8")}
        runs = measure({f"anatomy --kv-dtype {k}": (s, {}) for k, s in servers.items()},
                       lambda n, seed: make_prompts(n, LONG_WORDS, seed=seed), [16])
    print("\n" + table(runs) + "\n")
    return [f"kv (800-word prompts, 128 MiB): int8 {ratio(runs, 'anatomy --kv-dtype int8', 'anatomy --kv-dtype bf16', 16):.2f}x "
            "the bf16 cache's output tok/s at concurrency 16 (>= 1.0x)"]


def prefix(threads: int) -> list[str]:
    """TTFT of one user's question after a long shared system prompt: cold, cached in the pool, and
    restored from --kv-offload-dir by a restarted server (SIGTERM writes the cached blocks there)."""
    prompts = make_prompts(6, 24, seed=7, shared_words=SHARED_WORDS)
    name = "anatomy --kv-offload-bytes 256MiB --kv-offload-dir {}"
    with tempfile.TemporaryDirectory() as folder:
        with Running(name.format(folder), threads) as first:
            cold = first.run(prompts[:1], 16, 1)
            cached = first.run(prompts[1:3], 16, 1)
        with Running(name.format(folder), threads) as second:
            restored = second.run(prompts[3:4], 16, 1)
            again = second.run(prompts[4:6], 16, 1)
    ttft = {kind: r.ttft_ms["median"] for kind, r in
            (("cold", cold), ("cached", cached), ("restored", restored), ("cached after restart", again))}
    print("\n".join(f"  {kind}: TTFT {ms:.0f} ms" for kind, ms in ttft.items()) + "\n", flush=True)
    return [f"prefix (~{cold.input_tokens:,}-token prompts sharing {SHARED_WORDS} words): TTFT cold {ttft['cold']:.0f} ms, "
            f"cached {ttft['cached']:.0f} ms, restored after a restart {ttft['restored']:.0f} ms = "
            f"{ttft['restored'] / ttft['cold']:.2f}x cold (<= 0.25x)"]


def priority(threads: int) -> list[str]:
    """A quarter of the requests with priority -1 at concurrency 16, on a server that honors it and on
    one that runs arrivals in order (the same requests, no priority sent)."""
    n = max(MIN_REQUESTS, 2 * REQUESTS * 16)
    prompts, mix = make_prompts(n, PROMPT_WORDS, seed=11), priority_mix(n, 0.25, seed=11)
    lines = []
    for policy in ("priority", "fcfs"):
        with Running(f"anatomy --scheduling-policy {policy} --batch-size 8", threads) as server:
            r = server.run(prompts, MAX_TOKENS, 16, groups=mix,
                           fields=[{"priority": p} for p in mix] if policy == "priority" else None)
        high, low = r.by_group[-1], r.by_group[0]
        print(f"  {policy}: {r.output_throughput:.1f} output tok/s; TTFT median priority -1 "
              f"{high['ttft_ms']['median']:.0f} ms, 0 {low['ttft_ms']['median']:.0f} ms", flush=True)
        lines.append(f"priority ({policy}, 16 at once, 8 slots): TTFT median {high['ttft_ms']['median']:.0f} ms for "
                     f"priority -1 against {low['ttft_ms']['median']:.0f} ms for the rest; E2E latency median "
                     f"{high['e2el_ms']['median'] / 1e3:.2f} s against {low['e2el_ms']['median'] / 1e3:.2f} s; "
                     f"{r.output_throughput:.1f} output tok/s")
    return lines


def random_adapters(folder: Path, n: int) -> list[str]:
    """n PEFT adapters of the default model (rank LORA_RANK on every projection, B random, as a trained
    adapter's is non-zero), written under `folder`; their NAME=PATH options."""
    from anatomy.lora import LoraConfig, apply_lora, lora_layers, save_adapter

    model = apply_lora(anatomy.load(MODEL, weights="f32"), LoraConfig(rank=LORA_RANK, alpha=2 * LORA_RANK,
                                                                      targets="all"))
    options = []
    for i in range(n):  # one model, its LoRA layers drawn again for each adapter
        torch.manual_seed(i)
        for layer in lora_layers(model).values():
            layer.reset_parameters()
            for b in layer.lora_B.values():
                torch.nn.init.normal_(b, std=0.02)
        options.append(f"a{i}={save_adapter(model, folder / f'a{i}')}")
    return options


def gguf_adapters(folder: Path, options: list[str]) -> list[str]:
    """The adapters (NAME=PATH) converted by llama.cpp's convert_lora_to_gguf.py against the default
    model's weights as an HF directory; the GGUF files' paths."""
    from benchmarks.llama_cpp import llama_sources

    base = folder / "base-hf"
    anatomy.save(anatomy.load(MODEL, weights="f32"), base)
    anatomy.load_tokenizer(MODEL).save(base)
    sources = llama_sources()
    out = []
    for option in options:
        name, path = option.split("=", 1)
        target = folder / f"{name}.gguf"
        subprocess.run([sys.executable, str(sources / "convert_lora_to_gguf.py"), "--base", str(base), "--outtype",
                        "f32", "--outfile", str(target), path], check=True, capture_output=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(sources / "gguf-py")})
        out.append(str(target))
    return out


def lora_runs(server: Running, n: int, pick) -> dict[int, BenchResult]:
    """Output throughput with requests spread over k = 0 (the base), 1, 3 and ADAPTERS adapters;
    `pick(i)`: the request fields that choose adapter i (None: the base)."""
    runs = {}
    for k in (0, 1, 3, ADAPTERS):
        prompts = make_prompts(n, PROMPT_WORDS, seed=13 + k)  # new ones: no run reuses another's prefixes
        runs[k] = r = server.run(prompts, MAX_TOKENS, 16, fields=[pick(i % k if k else None) for i in range(n)])
        print(f"  {server.name.split()[0]}, {k or 'no'} adapter(s): {r.output_throughput:.1f} output tok/s, "
              f"TTFT median {r.ttft_ms['median']:.0f} ms", flush=True)
    return runs


def lora(threads: int) -> list[str]:
    n = max(MIN_REQUESTS, REQUESTS * 16)
    with tempfile.TemporaryDirectory() as folder:
        options = random_adapters(Path(folder), ADAPTERS)
        files = gguf_adapters(Path(folder), options)
        with Running(f"anatomy --lora {' '.join(options)} --max-loras {ADAPTERS}", threads) as server:
            ours = lora_runs(server, n, lambda i: {} if i is None else {"model": f"a{i}"})
        flags = " ".join(f"--lora {f}" for f in files)
        with Running(f"llama-server --lora-init-without-apply {flags}", threads) as server:
            theirs = lora_runs(server, n, lambda i: {"lora": [] if i is None else [{"id": i, "scale": 1.0}]})
    lines = []
    for k in (1, 3, ADAPTERS):
        a, b = ours[k].output_throughput, theirs[k].output_throughput
        lines.append(f"lora (16 at once, rank {LORA_RANK} on every projection), {k} adapter(s): anatomy {a:.1f} "
                     f"output tok/s = {a / ours[0].output_throughput:.2f}x its base model's "
                     f"{ours[0].output_throughput:.1f}; llama-server {b:.1f} = {b / theirs[0].output_throughput:.2f}x "
                     f"its {theirs[0].output_throughput:.1f}; anatomy / llama-server {a / b:.2f}x")
    return lines


def main() -> None:
    threads = torch.get_num_threads()
    print(f"{MODEL} ({gguf_path().name}), {MAX_TOKENS} new tokens each (EOS ignored), greedy; {REQUESTS} x "
          f"concurrency requests per run (at least {MIN_REQUESTS}), {ROUNDS} rounds; {threads} threads", flush=True)
    print_provenance(anatomy_lines() + llama_lines(llama_server_binary()))
    lines = []
    for name in SCENARIOS:
        print(f"\n### {name}\n", flush=True)
        lines += {"plain": plain, "speculative": speculative, "draft": draft, "kv": kv, "prefix": prefix,
                  "priority": priority, "lora": lora}[name](threads)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
