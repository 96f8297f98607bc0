"""Decode, prefill, batches and long contexts: anatomy through its public API against native llama.cpp.

Same machine, same run, same file: SmolLM2-135M-Instruct from the Q4_1 GGUF anatomy ships, 2 threads.
anatomy is timed as a user calls it, `anatomy.generate(model, ...)` on `model = anatomy.load(...)`
(its second and later calls: the engine kept for the model), beside a kept `DecoderEngine` (the
public API must be >= 0.95x of it), its eager step and `weights="f32"`. llama.cpp is timed with its
own native tools built from the llama-cpp-python sdist's sources (benchmarks/build_llama_cpp.sh):
`llama-bench` (tg128, pp512, tg128 at depth 2048) and `llama-batched-bench` (-npp 128 -ntg 128 -npl
1,8), on the shipped file in each round right after anatomy's rows (the hosts drift by +-15% over
minutes: each ratio is of medians taken side by side); its Python binding's per-token loop and HF
transformers (fp32) are rows of their own. llama.cpp has no repacked x86 layout for Q4_1, so the same
weights are also quantized by its own llama-quantize to the types people download (benchmarks/downloaded.py:
Q4_0, Q4_K_M, Q5_K_M, Q6_K, Q8_0, and a 1B-class model in Q4_K_M and Q8_0), both timed on each with
their peak RSS: a reader sees the anchor's best format beside the shipped file. The run ends
with its provenance: anatomy's commit and kernels, the CPU and its bandwidth, llama.cpp's build.

Targets (issue 23): decode >= 1.25x llama-bench tg128; prefill 512 >= 2.5x pp512; 8 sequences >= 5x
batch 1 and >= 2x llama-batched-bench's 8; decode at a 2,048-token context >= 1.25x llama-bench -d
2048; mean token NLL on 2,068 tokens of English within 0.5% of fp32 on the file's dequantized
weights; greedy output on the README's prompts identical to the fp32 path for 64 tokens; peak RSS of
`anatomy generate` under 2x the weights it keeps plus its KV cache.

    python -m benchmarks decode            (ANATOMY_BENCH_REPEATS=3; ANATOMY_BENCH_FILES=0 leaves out the
                                            downloaded files, which `python -m benchmarks files` times alone)
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import anatomy
from anatomy import progress
from anatomy.checkpoints.registry import resolve
from anatomy.inference.engine import DecoderEngine, held_bytes
from anatomy.inference.perplexity import perplexity
from anatomy.inference.sampling import SamplingParams
from benchmarks import downloaded
from benchmarks.llama_cpp import batched_bench, llama_bench, llama_bench_record, llama_tool
from benchmarks.provenance import anatomy_lines, llama_lines, print_provenance
from benchmarks.timing import bandwidth_gbs

MODEL = "smollm2-135m-instruct"
PROMPT, NEW, PREFILL, BATCH, DEPTH = 128, 128, 512, 8, 2048
REPEATS = int(os.environ.get("ANATOMY_BENCH_REPEATS", "3"))
FILES = os.environ.get("ANATOMY_BENCH_FILES", "1") != "0"
ENGLISH = Path(__file__).parents[1] / "tests" / "data" / "english.txt"
README_PROMPTS = ["What is the capital of France?", "Name three rivers."]


def prompt_ids(n: int, seed: int = 0) -> list[int]:
    """n token ids of ordinary vocabulary (the same for every engine)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(200, 40000, (n,), generator=g).tolist()


def step_times(tokens) -> tuple[float, float]:
    """(time to first token, decode tokens/s over the rest) of an iterator of per-step tokens."""
    start = time.perf_counter()
    stamps = [time.perf_counter() for _ in tokens]
    decode_s = stamps[-1] - stamps[0]
    return stamps[0] - start, (len(stamps) - 1) / decode_s if decode_s > 0 else 0.0


# -- anatomy: the public API, and a kept engine beside it ----------------------------------------

class Public:
    """`anatomy.generate(model, ...)` as the README shows it."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def decode(self, prompts: list[list[int]], new: int) -> tuple[float, float]:
        results = anatomy.generate(self.model, prompts, max_new_tokens=new, ignore_eos=True)
        return results[0].ttft_s, results[0].tokens_per_s  # tokens/s of the whole batch


class Kept:
    """A DecoderEngine made once and kept, its tokens iterated (what the engine alone reaches)."""

    def __init__(self, engine: DecoderEngine) -> None:
        self.engine = engine

    def decode(self, prompts: list[list[int]], new: int) -> tuple[float, float]:
        ttft, tps = step_times(self.engine.tokens(prompts, SamplingParams(max_new_tokens=new, ignore_eos=True)))
        return ttft, tps * len(prompts)


def anatomy_rows(default: torch.nn.Module, gguf: Path) -> dict[str, Public | Kept]:
    return {"anatomy.generate(model) (default: the file's int4/int8)": Public(default),
            "anatomy, a kept DecoderEngine": Kept(DecoderEngine(default)),
            "anatomy, eager step (DecoderEngine capture=False)": Kept(DecoderEngine(default, capture=False)),
            "anatomy.generate(model), weights=f32": Public(anatomy.load(gguf, weights="f32"))}


def measure(runner, short, long_, batch, deep) -> dict[str, float]:
    ttft, decode = runner.decode([short], NEW)
    return {"ttft": ttft, "decode": decode, "prefill": PREFILL / runner.decode([long_], 1)[0],
            "batch": runner.decode(batch, NEW)[1], "depth": runner.decode([deep], NEW)[1]}


# -- the references -------------------------------------------------------------------------------

NATIVE = "llama.cpp native, Q4_1 (the same file)"


def native_llama(path: Path) -> dict[str, float]:
    """llama-bench's decode, prefill and depth figures on one file (its mean of 3 each)."""
    threads = torch.get_num_threads()
    return {"decode": llama_bench(path, threads=threads, new=NEW),
            "prefill": llama_bench(path, threads=threads, prompt=PREFILL),
            "depth": llama_bench(path, threads=threads, new=NEW, depth=DEPTH)}


def native_round(gguf: Path) -> dict[str, float]:
    """One round of the native tools on the shipped file, between anatomy's rounds (this project's
    hosts drift by +-15% over minutes: the ratios are of figures taken side by side)."""
    batched = batched_bench(gguf, threads=torch.get_num_threads(), prompt=PROMPT, new=NEW, sequences=(1, BATCH))
    return native_llama(gguf) | {"batch": batched[BATCH], "batch1": batched[1]}


def binding_run(gguf: Path, short: list[int], long_: list[int]) -> dict[str, float]:
    """llama.cpp through llama-cpp-python's per-token loop (Llama.generate)."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(gguf), n_ctx=1024, n_batch=512, n_threads=torch.get_num_threads(), verbose=False)

    def run(prompt, new):
        llm.reset()
        tokens = llm.generate(prompt, temp=0.0, top_k=1, reset=True)
        return step_times(next(tokens) for _ in range(new))

    ttft, decode = run(short, NEW)
    return {"ttft": ttft, "decode": decode, "prefill": PREFILL / run(long_, 1)[0]}


def hf_run(f32: torch.nn.Module, folder: Path, short: list[int], long_: list[int]) -> dict[str, float]:
    from transformers import AutoModelForCausalLM
    from transformers.generation.streamers import BaseStreamer

    anatomy.save(f32, folder)
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()

    class Stamps(BaseStreamer):
        def __init__(self):
            self.calls = []

        def put(self, value):
            self.calls.append(time.perf_counter())

        def end(self):
            pass

    def run(prompt, new):
        stamps = Stamps()
        start = time.perf_counter()
        with torch.inference_mode():
            hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                        max_new_tokens=new, min_new_tokens=new, do_sample=False, streamer=stamps, pad_token_id=0)
        tokens = stamps.calls[1:]  # the first put() is the prompt
        return tokens[0] - start, (len(tokens) - 1) / max(tokens[-1] - tokens[0], 1e-9)

    ttft, decode = run(short, NEW)
    return {"ttft": ttft, "decode": decode, "prefill": PREFILL / run(long_, 1)[0]}


# -- quality and memory ---------------------------------------------------------------------------

def quality(f32: torch.nn.Module, default: torch.nn.Module) -> tuple[float, list[bool]]:
    """(mean token NLL of the default decode step relative to fp32, every token teacher-forced through it;
    greedy identity on each README prompt)."""
    tokenizer = anatomy.load_tokenizer(MODEL)
    scored = perplexity(anatomy.engine_for(default), f32, tokenizer.encode(ENGLISH.read_text()))
    nll = scored.nll / scored.reference_nll - 1
    same = []
    for question in README_PROMPTS:
        chat = [{"role": "user", "content": question}]
        a, b = (anatomy.generate(m, chat, tokenizer=tokenizer, max_new_tokens=64, ignore_eos=True).token_ids
                for m in (default, f32))  # EOS ignored: the answers end after ~8 tokens, 64 are compared
        same.append(a == b and len(a) == 64)
    return nll, same


def peak_rss() -> tuple[int, int]:
    """(peak RSS of `anatomy generate` answering the README's question, the process's RSS after `import
    torch, anatomy` alone), bytes. Each is run under a fresh Python whose only child it is (ru_maxrss of
    RUSAGE_CHILDREN is the largest child so far: this process has run llama.cpp's tools)."""
    question = [sys.executable, "-m", "anatomy", "generate", README_PROMPTS[0], "--max-new-tokens", "64", "--quiet"]
    baseline = [sys.executable, "-c", "import torch, anatomy"]
    meter = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, capture_output=True); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    rss = [int(subprocess.run([sys.executable, "-c", meter, *argv], check=True, capture_output=True,
                              text=True).stdout) * 1024 for argv in (question, baseline)]
    return rss[0], rss[1]


# -- the run --------------------------------------------------------------------------------------

def main() -> None:
    torch.manual_seed(0)
    gguf = resolve(MODEL)
    f32 = anatomy.load(gguf, weights="f32")
    default = anatomy.load(gguf)
    rows = anatomy_rows(default, gguf)
    short, long_, deep = prompt_ids(PROMPT), prompt_ids(PREFILL, seed=1), prompt_ids(DEPTH, seed=2)
    batch = [prompt_ids(PROMPT, seed=10 + i) for i in range(BATCH)]
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in rows}
    bandwidth = []
    with tempfile.TemporaryDirectory() as tmp:
        f32_gguf = Path(tmp) / "f32.gguf"
        anatomy.save(f32, f32_gguf, dtype="f32", tokenizer=anatomy.load_tokenizer(gguf))
        print("warming up: every anatomy row's shapes once (kernel plans, captured steps) ...", flush=True)
        for runner in rows.values():
            measure(runner, short, long_, batch, deep)
        runs[NATIVE] = []
        for rep in progress.track(range(REPEATS), "decode benchmark runs"):
            bandwidth.append(bandwidth_gbs())
            for name, runner in rows.items():
                runs[name].append(measure(runner, short, long_, batch, deep))
            runs[NATIVE].append(native_round(gguf))
            print(f"  run {rep + 1}/{REPEATS} done (anatomy's rows, then llama-bench and llama-batched-bench)", flush=True)
        print("llama.cpp native on the F32 file, its binding, HF ...", flush=True)
        references = {"llama.cpp native, F32": native_llama(f32_gguf),
                      "llama.cpp through llama-cpp-python (per-token loop)": binding_run(gguf, short, long_),
                      "HF transformers fp32": hf_run(f32, Path(tmp) / "hf", short, long_)}
        files = downloaded.measure(Path(tmp)) if FILES else None
        record = llama_bench_record(gguf, threads=torch.get_num_threads(), new=16)
    table = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()} | references
    nll, same = quality(f32, default)
    rss, base_rss = peak_rss()
    engine = anatomy.engine_for(default)
    kept = held_bytes(default, engine.model) + engine.start([short], SamplingParams(max_new_tokens=64)).cache.nbytes
    _print(table, statistics.median(bandwidth), engine)
    if files is not None:
        downloaded.print_table(files, statistics.median(bandwidth))
    _targets(table, nll, same, rss, base_rss, kept)
    print_provenance(anatomy_lines(statistics.median(bandwidth)) + llama_lines(llama_tool("llama-bench"), record))


def _print(table: dict[str, dict[str, float]], bandwidth: float, engine: DecoderEngine) -> None:
    native = table[NATIVE]
    read = engine.decode_weight_bytes
    print(f"\nmeasured: memory bandwidth {bandwidth:.1f} GB/s (torch sum over 256 MiB on 2 MiB pages); "
          f"{torch.get_num_threads()} "
          f"threads; the default decode step reads {read / 1e6:.0f} MB of weights\n")
    print(f"| engine | decode tok/s | vs llama-bench tg{NEW} | GB/s of weights | prefill {PREFILL} tok/s | vs pp{PREFILL} | "
          f"{BATCH} sequences tok/s | vs batch 1 | decode at depth {DEPTH} | vs llama-bench -d {DEPTH} |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, row in table.items():
        gbs = f"{read * row['decode'] / 1e9:.1f}" if "default" in name or "kept" in name else "-"
        batch = f"{row['batch']:.0f} | {row['batch'] / row.get('batch1', row['decode']):.2f}x" if "batch" in row else "- | -"
        depth = f"{row['depth']:.1f} | {row['depth'] / native['depth']:.2f}x" if "depth" in row else "- | -"
        print(f"| {name} | {row['decode']:.1f} | {row['decode'] / native['decode']:.2f}x | {gbs} | {row['prefill']:.0f} | "
              f"{row['prefill'] / native['prefill']:.2f}x | {batch} | {depth} |")
    print(f"\n(anatomy and llama.cpp's Q4_1 row: medians of {REPEATS} rounds, taken in turn; batch 1, {PROMPT}-token "
          f"prompt, {NEW} new tokens, greedy, EOS ignored; llama.cpp's native rows: llama-bench's mean of 3 per round "
          f"(-t {torch.get_num_threads()}), llama-batched-bench -npp {PROMPT} -ntg {NEW} -npl 1,{BATCH} (its batch-1 "
          f"row is the ratio's base))")
    print("\n" + "; ".join(engine.kernel_summary()))


def _targets(table, nll: float, same: list[bool], rss: int, base_rss: int, kept: int) -> None:
    api = table["anatomy.generate(model) (default: the file's int4/int8)"]
    kept_engine = table["anatomy, a kept DecoderEngine"]
    native = table[NATIVE]
    checks = [
        ("public API / kept engine, decode", api["decode"] / kept_engine["decode"], 0.95),
        (f"decode / llama-bench tg{NEW}", api["decode"] / native["decode"], 1.25),
        (f"prefill {PREFILL} / llama-bench pp{PREFILL}", api["prefill"] / native["prefill"], 2.5),
        (f"{BATCH} sequences / batch 1", api["batch"] / api["decode"], 5.0),
        (f"{BATCH} sequences / llama-batched-bench {BATCH}", api["batch"] / native["batch"], 2.0),
        (f"decode at depth {DEPTH} / llama-bench -d {DEPTH}", api["depth"] / native["depth"], 1.25),
    ]
    print("\n| target | measured | asked | |\n|---|---|---|---|")
    for what, value, asked in checks:
        print(f"| {what} | {value:.2f}x | >= {asked}x | {'met' if value >= asked else 'missed'} |")
    print(f"| mean token NLL vs fp32 (2,068 tokens of English, through the decode step) | {nll:+.3%} | within 0.5% | "
          f"{'met' if abs(nll) <= 0.005 else 'missed'} |")
    print(f"| greedy = fp32 for 64 tokens on the README's prompts | {sum(same)}/{len(same)} | all | "
          f"{'met' if all(same) else 'missed'} |")
    ratio = rss / kept if kept else float("inf")
    print(f"| peak RSS of `anatomy generate` / (weights kept + KV cache) | {rss / 2 ** 20:.0f} MiB / "
          f"{kept / 2 ** 20:.0f} MiB = {ratio:.2f}x | < 2x | {'met' if ratio < 2 else 'missed'} |")
    if base_rss:
        print(f"\n(python with torch and anatomy imported, nothing loaded: {base_rss / 2 ** 20:.0f} MiB of that RSS; "
              f"above it: {(rss - base_rss) / 2 ** 20:.0f} MiB = {(rss - base_rss) / kept:.2f}x the weights and cache)")


if __name__ == "__main__":
    main()
