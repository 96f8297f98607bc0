"""The files people download: one model's weights quantized by llama.cpp's own llama-quantize to each
common type, anatomy beside native llama.cpp on each file, in one run.

Per file: anatomy through its public API (`anatomy.generate` on the engine `anatomy generate` runs,
`anatomy.engine_for(anatomy.load(file), take_weights=True)`: decode tokens/s after a 128-token prompt,
prefill 512, 8 sequences) against `llama-bench` tg128 / pp512 and `llama-batched-bench` (8 sequences),
after a warm-up of each shape, in ROUNDS paired rounds (each side once, back to back; each ratio the
median of the rounds'); and each side's peak RSS and seconds from start to exit: `anatomy generate`
answering a question in a fresh process (its kernel plan already measured) against `llama-bench -n 64`
on the same file, both under one meter (ru_maxrss); before each decode round, the host's read bandwidth
(a decode of equal bytes runs at the host's cap on both sides when it is low). Sizes: SmolLM2-135M (the
shipped model's own weights) and a 1B-class decoder of Llama-3.2-1B's shape with random weights (llama.cpp's Llama 3
vocabulary); the 2026 families (`python -m benchmarks families`): Gemma 3 1B's shape and a 1B-class
Qwen3-MoE (32 experts, 4 per token), random weights, the same vocabulary.
"""

from __future__ import annotations

import gc
import statistics
import subprocess
import sys
from pathlib import Path

import torch
from gguf import GGUFReader

import anatomy
from anatomy import progress
from anatomy.checkpoints.registry import resolve
from benchmarks.llama_cpp import batched_bench, built_tools, llama_bench, llama_tool
from benchmarks.timing import bandwidth_gbs

PROMPT, NEW, PREFILL, BATCH = 128, 128, 512, 8
ROUNDS = 5  # paired rounds of each figure: anatomy's run and llama.cpp's, the order swapped each round
SMALL, LARGE, GEMMA3, MOE = ("SmolLM2-135M", "1B (Llama-3.2-1B's shape)", "Gemma 3 1B's shape",
                             "1B MoE (Qwen3-MoE's shape, 32 experts)")
TYPES = {SMALL: ("Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "IQ4_NL", "IQ4_XS"), LARGE: ("Q4_K_M", "Q8_0"),
         GEMMA3: ("Q4_K_M",),
         MOE: ("Q4_K_M",)}
FAMILIES = (GEMMA3, MOE)
_ONE_B = {"decode": 1.1, "prefill": 1.25, "batch": 1.5}
TARGETS = {SMALL: {"decode": 1.25, "prefill": 1.5, "batch": 2.0}, LARGE: _ONE_B, GEMMA3: _ONE_B, MOE: _ONE_B}
RSS_FACTOR, RSS_EXTRA = 1.15, 300 * 2 ** 20  # anatomy's peak RSS <= 1.15x llama.cpp's + 300 MiB
QUESTION = "What is the capital of France?"
METER = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
         "subprocess.run(sys.argv[1:], check=True, capture_output=True); "
         "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, time.perf_counter() - t)")


def prompt_ids(n: int, seed: int = 0, vocab: int = 40000) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(200, vocab, (n,), generator=g).tolist()


def quantized(source: Path, kind: str) -> Path:
    """`source` (an F32/F16 GGUF) quantized to `kind` by llama.cpp's llama-quantize, beside it."""
    out = source.with_name(f"{source.stem}-{kind}.gguf")
    done = subprocess.run([llama_tool("llama-quantize"), str(source), str(out), kind], capture_output=True,
                          text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"llama-quantize {kind} failed:\n{done.stderr[-2000:]}")
    return out


def small_source(folder: Path) -> Path:
    """The shipped SmolLM2-135M's weights as an F32 GGUF (dequantized from the file anatomy ships)."""
    gguf = resolve("smollm2-135m-instruct")
    out = folder / "smollm2-135m-f32.gguf"
    anatomy.save(anatomy.load(gguf, weights="f32"), out, dtype="f32", tokenizer=anatomy.load_tokenizer(gguf))
    return out


def large_source(folder: Path, size: str = LARGE) -> Path:
    """A 1B-class decoder with random weights (the model's own initialisation) as an F16 GGUF, with the
    Llama 3 vocabulary llama.cpp ships in its sources (models/ggml-vocab-llama-bpe.gguf)."""
    found = sorted(built_tools().parents[1].glob("llama_cpp_python-*/vendor/llama.cpp/models/ggml-vocab-llama-bpe.gguf"))
    if not found:
        raise RuntimeError(f"no ggml-vocab-llama-bpe.gguf in the llama.cpp sources beside {built_tools()}")
    torch.manual_seed(0)
    model = anatomy.build_model(_config(size), dtype=torch.float16)
    vocab = found[-1]
    out = folder / "large-f16.gguf"
    anatomy.save(model, out, dtype="f16", tokenizer=anatomy.load_tokenizer(vocab))
    del model
    gc.collect()
    return out


def _config(size: str):
    """The config of a 1B-class size (the Llama 3 vocabulary's 128,256 tokens)."""
    if size == GEMMA3:
        return anatomy.get_preset("gemma-3-1b", vocab_size=128256, bos_token_id=128000, eos_token_id=128001)
    if size == MOE:
        return anatomy.get_preset("qwen3-8b", vocab_size=128256, d_model=1024, n_layers=16, n_heads=16, n_kv_heads=4,
                                  head_dim=128, n_experts=32, n_experts_per_token=4, d_ff_expert=512,
                                  moe_renormalize=True, bos_token_id=128000, eos_token_id=128001)
    return anatomy.get_preset("llama-3.2-1b")


def process(argv: list[str]) -> tuple[int, float]:
    """Peak RSS (bytes) and wall seconds of `argv` run as the only child of a fresh Python."""
    out = subprocess.run([sys.executable, "-c", METER, *argv], check=True, capture_output=True, text=True)
    rss, seconds = out.stdout.split()
    return int(rss) * 1024, float(seconds)


def anatomy_process(path: Path) -> tuple[int, float]:
    """`anatomy generate` answering QUESTION in 64 tokens on `path`, start to exit: peak RSS and seconds
    (run once first: the plan is measured)."""
    argv = [sys.executable, "-m", "anatomy", "generate", QUESTION, "--model", str(path), "--max-new-tokens", "64",
            "--quiet"]
    process(argv)
    return process(argv)


def llama_process(path: Path, threads: int) -> tuple[int, float]:
    """`llama-bench` generating 64 tokens once (after its warm-up) on `path`: peak RSS and seconds."""
    return process([llama_tool("llama-bench"), "-m", str(path), "-t", str(threads), "-p", "0", "-n", "64", "-r", "1"])


def file_row(path: Path, vocab: int) -> dict[str, float]:
    """anatomy's public API and llama.cpp's tools on one file: tokens/s and peak RSS of each."""
    threads = torch.get_num_threads()
    short, long_ = prompt_ids(PROMPT, vocab=vocab), prompt_ids(PREFILL, seed=1, vocab=vocab)
    batch = [prompt_ids(PROMPT, seed=10 + i, vocab=vocab) for i in range(BATCH)]
    engine = anatomy.engine_for(anatomy.load(path), take_weights=True)  # the weights held once, as the CLI does

    def run(prompts, new):
        return anatomy.generate(engine, prompts, max_new_tokens=new, ignore_eos=True)[0]

    # the plan and the captured steps first: each shape as measured (a decode step of a new shape runs
    # eagerly PAGED_RECORD_AFTER times, then is recorded, inside the run that meets it)
    run([short], NEW), run([long_], 1), run(batch, NEW)
    row = {"read": engine.decode_weight_bytes, "llama_read": llama_read_bytes(path), "file": path.stat().st_size}
    host = []  # the host's read bandwidth before each decode round: what either side could read then
    row |= _paired("decode", "tg", lambda: run([short], NEW).tokens_per_s,
                   lambda: llama_bench(path, threads=threads, new=NEW, repetitions=1),
                   before=lambda: host.append(bandwidth_gbs()))
    row["host_min"], row["host_max"] = min(host), max(host)
    row |= _paired("prefill", "pp", lambda: PREFILL / run([long_], 1).ttft_s,
                   lambda: llama_bench(path, threads=threads, prompt=PREFILL, repetitions=1))
    row |= _paired("batch", "batched", lambda: run(batch, NEW).tokens_per_s,
                   lambda: batched_bench(path, threads=threads, prompt=PROMPT, new=NEW, sequences=(BATCH,))[BATCH])
    del engine
    gc.collect()
    row["rss"], row["start"] = anatomy_process(path)
    row["llama_rss"], row["llama_start"] = llama_process(path, threads)
    return row


def llama_read_bytes(path: Path) -> int:
    """The weight bytes llama.cpp reads for one decode token (gguf-py's reading of the file): every tensor,
    less the token table where the file has an output matrix of its own (the table's rows are gathered)."""
    tensors = {t.name: int(t.n_bytes) for t in GGUFReader(path).tensors}
    if "output.weight" in tensors:
        tensors.pop("token_embd.weight", None)
    return sum(tensors.values())


def _paired(ours: str, theirs: str, measure_ours, measure_theirs, rounds: int = ROUNDS,
            before=lambda: None) -> dict[str, float]:
    """{ours: median, theirs: median, ours_ratio: the median of the rounds' ratios}: each round measures both
    sides back to back, in the other order every second round, so that a change of the host's speed during
    the run (other tenants, clocks) falls on both sides of a round's ratio. `before` runs before each round."""
    mine, others, ratios = [], [], []
    for r in range(rounds):
        before()
        if r % 2 == 0:
            a, b = measure_ours(), measure_theirs()
        else:
            b, a = measure_theirs(), measure_ours()
        mine.append(a), others.append(b), ratios.append(a / b)
    return {ours: statistics.median(mine), theirs: statistics.median(others),
            f"{ours}_ratio": statistics.median(ratios)}


def measure(folder: Path, sizes: tuple[str, ...] = (SMALL, LARGE)) -> dict[str, dict[str, dict[str, float]]]:
    """{size: {type: row}} for each size's TYPES, the files made in `folder`."""
    out = {}
    for size in sizes:
        source = small_source(folder) if size == SMALL else large_source(folder, size)
        vocab = 40000 if size == SMALL else 120000
        out[size] = {}
        for kind in progress.track(TYPES[size], f"files people download: {size}"):
            path = quantized(source, kind)
            out[size][kind] = file_row(path, vocab)
            path.unlink()
        source.unlink()
    return out


def print_table(rows: dict[str, dict[str, dict[str, float]]], bandwidth_gbs: float) -> None:
    threads = torch.get_num_threads()
    print(f"\n| model | file (llama-quantize) | MiB | anatomy decode | tg{NEW} | ratio | weights read, GB/s: anatomy / "
          f"llama.cpp (host) | anatomy prefill {PREFILL} | pp{PREFILL} | ratio | anatomy {BATCH} seqs | "
          f"batched-bench {BATCH} | ratio | "
          f"peak RSS anatomy / llama-bench | RSS target | start to 64 tokens, s: anatomy / llama-bench |\n"
          f"|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for size, kinds in rows.items():
        goal = TARGETS[size]
        for kind, r in kinds.items():
            limit = RSS_FACTOR * r["llama_rss"] + RSS_EXTRA
            print(f"| {size} | {kind} | {r['file'] / 2 ** 20:.0f} | {r['decode']:.1f} | {r['tg']:.1f} | "
                  f"{_ratio(r['decode_ratio'], goal['decode'])} | {r['read'] * r['decode'] / 1e9:.1f} / "
                  f"{r['llama_read'] * r['tg'] / 1e9:.1f} ({r['host_min']:.0f}-{r['host_max']:.0f}) | "
                  f"{r['prefill']:.0f} | {r['pp']:.0f} | "
                  f"{_ratio(r['prefill_ratio'], goal['prefill'])} | {r['batch']:.0f} | {r['batched']:.0f} | "
                  f"{_ratio(r['batch_ratio'], goal['batch'])} | {r['rss'] / 2 ** 20:.0f} / "
                  f"{r['llama_rss'] / 2 ** 20:.0f} MiB | {'met' if r['rss'] <= limit else 'missed'} "
                  f"(<= {limit / 2 ** 20:.0f}) | {r['start']:.2f} / {r['llama_start']:.2f} "
                  f"({'met' if r['start'] <= r['llama_start'] else 'missed'}) |")
    print(f"\n({ROUNDS} paired rounds of each figure, anatomy's run and llama.cpp's back to back (llama-bench -r 1 "
          f"after its warm-up), the order swapped each round; tokens/s: each side's median; ratio: the median of "
          f"the rounds' anatomy / llama.cpp, with the issue's target in brackets; {threads} threads; decode after a "
          f"{PROMPT}-token prompt, greedy, EOS ignored; weights read: each side's weight bytes a token times its "
          f"median tokens/s, the host's the read bandwidth measured before each decode round (torch's sum over "
          f"256 MiB, lowest-highest; a product's streaming read can pass it), against {bandwidth_gbs:.1f} GB/s "
          f"at the start; RSS target: <= {RSS_FACTOR}x llama.cpp's + "
          f"{RSS_EXTRA // 2 ** 20} MiB; start to 64 tokens: a fresh process loading the file and generating, "
          f"`anatomy generate` answering a question (its Python and torch "
          f"imports included) against `llama-bench -p 0 -n 64 -r 1` (its warm-up included))")


def _ratio(value: float, goal: float) -> str:
    return f"{value:.2f}x ({'met' if value >= goal else 'missed'} {goal}x)"
