"""Decode, prefill and batching speed of anatomy's engine against llama.cpp and HF transformers.

Same machine, same run, same weights: SmolLM2-135M-Instruct from the Q4_1 GGUF that anatomy
ships. anatomy runs it as loaded by default (the file's int4/int8 blocks through the measured
kernel plan, each decode step's blocks replayed from a captured graph), the same with the eager
step (`capture=False`), with a bf16 residual stream (`dtype="bf16"`), and dequantized to fp32 (the
first version's default); llama.cpp runs the same Q4_1 file and the F32 file anatomy writes from it; HF
transformers the fp32 HF directory anatomy writes. Batch 1, a 128-token prompt, 128 new tokens,
greedy, EOS ignored; prefill of 512 tokens; batch 8. Each figure is the median of REPEATS runs,
the engines interleaved so that they share the machine's noise. The memory bandwidth (torch sum
over 256 MiB) is measured in the same run: every decode row gives the weight bytes a step reads
and the GB/s it achieves, as a fraction of that bandwidth. Quality: the mean token NLL of each
anatomy row on 2,068 tokens of English (tests/data/english.txt) against fp32.

    python -m benchmarks decode            (ANATOMY_BENCH_REPEATS=5; ANATOMY_BENCH_COMPILE=1 adds --compile)
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

import anatomy
from anatomy import dtypes, progress
from anatomy.checkpoints.gguf_reader import read_gguf
from anatomy.checkpoints.registry import resolve
from anatomy.inference.engine import DecoderEngine
from anatomy.inference.engine.kv_cache import bytes_per_token
from anatomy.inference.quality import mean_nll
from anatomy.inference.sampling import SamplingParams
from benchmarks.timing import median_seconds

MODEL = "smollm2-135m-instruct"
PROMPT, NEW, PREFILL, BATCH = 128, 128, 512, 8
REPEATS = int(os.environ.get("ANATOMY_BENCH_REPEATS", "3"))
COMPILE = os.environ.get("ANATOMY_BENCH_COMPILE", "0") == "1"
ENGLISH = Path(__file__).parents[1] / "tests" / "data" / "english.txt"


def prompt_ids(n: int, seed: int = 0) -> list[int]:
    """n token ids of ordinary vocabulary (the same for every engine)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(200, 40000, (n,), generator=g).tolist()


def bandwidth_gbs() -> float:
    x = torch.ones(64 * 1024 * 1024)  # 256 MiB of fp32
    return x.nbytes / median_seconds(x.sum, 7, warmup=True) / 1e9


def step_times(tokens) -> tuple[float, float]:
    """(time to first token, decode tokens/s over the rest) of an iterator of per-step tokens."""
    start = time.perf_counter()
    stamps = [time.perf_counter() for _ in tokens]
    decode_s = stamps[-1] - stamps[0]
    return stamps[0] - start, (len(stamps) - 1) / decode_s if decode_s > 0 else 0.0


# -- the engines ----------------------------------------------------------------------------------

def anatomy_run(engine: DecoderEngine, prompts: list[list[int]], new: int) -> tuple[float, float]:
    ttft, tps = step_times(engine.tokens(prompts, SamplingParams(max_new_tokens=new)))
    return ttft, tps * len(prompts)


def hf_model(model: torch.nn.Module, folder: Path):
    from transformers import AutoModelForCausalLM

    anatomy.save(model, folder)
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


def hf_run(hf, prompt: list[int], new: int) -> tuple[float, float]:
    from transformers.generation.streamers import BaseStreamer

    class Stamps(BaseStreamer):
        def __init__(self):
            self.calls = []

        def put(self, value):
            self.calls.append(time.perf_counter())

        def end(self):
            pass

    stamps = Stamps()
    start = time.perf_counter()
    with torch.inference_mode():
        hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                    max_new_tokens=new, min_new_tokens=new, do_sample=False, streamer=stamps, pad_token_id=0)
    tokens = stamps.calls[1:]  # the first put() is the prompt
    decode_s = tokens[-1] - tokens[0]
    return tokens[0] - start, (len(tokens) - 1) / decode_s if decode_s > 0 else 0.0


def llama_model(path: Path):
    from llama_cpp import Llama

    return Llama(model_path=str(path), n_ctx=1024, n_batch=512, n_threads=torch.get_num_threads(), verbose=False)


def llama_run(llm, prompt: list[int], new: int) -> tuple[float, float]:
    llm.reset()
    tokens = llm.generate(prompt, temp=0.0, top_k=1, reset=True)
    return step_times(next(tokens) for _ in range(new))


# -- the table ------------------------------------------------------------------------------------

def main() -> None:
    torch.manual_seed(0)
    gguf = resolve(MODEL)
    f32 = anatomy.load(gguf, weights="f32")
    default = anatomy.load(gguf)
    engines = {"anatomy (default: the file's int4/int8)": DecoderEngine(default),
               "anatomy, eager step (capture=False)": DecoderEngine(default, capture=False),
               "anatomy dtype=bf16": DecoderEngine(anatomy.load(gguf, dtype="bf16")),
               "anatomy weights=f32": DecoderEngine(anatomy.load(gguf, weights="f32"))}
    if COMPILE:
        engines["anatomy --compile"] = DecoderEngine(default, compile=True)
    kv_read = bytes_per_token(f32.config) * (PROMPT + NEW // 2)  # mean fp32 cache bytes read per decode step
    reads = {name: e.decode_weight_bytes + kv_read * e.branch_dtype.itemsize // 4 for name, e in engines.items()}
    file_bytes = sum(t.nbytes for t in read_gguf(gguf).tensors.values())
    f32_bytes = sum(p.numel() * 4 for p in f32.parameters())
    reads.update({"llama.cpp Q4_1 (the same file)": file_bytes + kv_read // 2, "llama.cpp F32": f32_bytes + kv_read,
                  "HF transformers fp32": f32_bytes + kv_read})
    short, long_ = prompt_ids(PROMPT), prompt_ids(PREFILL, seed=1)
    batch = [prompt_ids(PROMPT, seed=10 + i) for i in range(BATCH)]
    with tempfile.TemporaryDirectory() as tmp:
        anatomy.save(f32, Path(tmp) / "f32.gguf", dtype="f32", tokenizer=anatomy.load_tokenizer(gguf))
        llamas = {"llama.cpp Q4_1 (the same file)": llama_model(gguf), "llama.cpp F32": llama_model(Path(tmp) / "f32.gguf")}
        hf = hf_model(f32, Path(tmp) / "hf")
        print(f"warming up (compiling: {COMPILE}) ...", flush=True)
        for engine in engines.values():
            for prompts, new in (([short], NEW), ([long_], 1), (batch, NEW)):
                anatomy_run(engine, prompts, new)
        runs = {"bandwidth": []}
        for rep in progress.track(range(REPEATS), "decode benchmark runs"):
            runs["bandwidth"].append(bandwidth_gbs())
            for name, engine in engines.items():
                _record(runs, name, anatomy_run(engine, [short], NEW), anatomy_run(engine, [long_], 1)[0],
                        anatomy_run(engine, batch, NEW)[1])
            for name, llm in llamas.items():
                _record(runs, name, llama_run(llm, short, NEW), llama_run(llm, long_, 1)[0])
            _record(runs, "HF transformers fp32", hf_run(hf, short, NEW), hf_run(hf, long_, 1)[0])
            print(f"  run {rep + 1}/{REPEATS} done", flush=True)
    _print(runs, reads, _quality(f32, engines))
    for name, engine in engines.items():
        print(f"\n{name}: residual stream {dtypes.name_of(engine.dtype)}, branches and KV cache "
              f"{dtypes.name_of(engine.branch_dtype)}; " + "; ".join(engine.kernel_summary()))


def _quality(f32: torch.nn.Module, engines: dict[str, DecoderEngine]) -> dict[str, float]:
    """Mean token NLL of each engine relative to fp32 inference on the same file's dequantized weights."""
    ids = anatomy.load_tokenizer(MODEL).encode(ENGLISH.read_text())
    reference = mean_nll(f32, ids)
    return {name: mean_nll(engine, ids) / reference - 1 for name, engine in engines.items()}


def _record(runs: dict, name: str, decode: tuple[float, float], prefill_s: float, batch_tps: float | None = None):
    row = runs.setdefault(name, {"ttft": [], "decode": [], "prefill": [], "batch": []})
    row["ttft"].append(decode[0])
    row["decode"].append(decode[1])
    row["prefill"].append(PREFILL / prefill_s)
    if batch_tps is not None:
        row["batch"].append(batch_tps)


def _print(runs: dict, reads: dict[str, int], quality: dict[str, float]) -> None:
    med = statistics.median
    bandwidth = med(runs.pop("bandwidth"))
    base = runs["llama.cpp Q4_1 (the same file)"]
    llama_decode, llama_prefill = med(base["decode"]), med(base["prefill"])
    print(f"\nmeasured: memory bandwidth {bandwidth:.1f} GB/s (torch sum over 256 MiB); "
          f"{torch.get_num_threads()} threads\n")
    print(f"| engine | decode tok/s | vs llama.cpp Q4_1 | MB read per step | GB/s | of bandwidth | TTFT {PROMPT} (ms) "
          f"| prefill {PREFILL} tok/s | vs llama.cpp Q4_1 | batch {BATCH} tok/s | batch {BATCH} / batch 1 | NLL vs fp32 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, row in runs.items():
        dec, pre = med(row["decode"]), med(row["prefill"])
        gbs = reads[name] * dec / 1e9
        batch = f"{med(row['batch']):.0f} | {med(row['batch']) / dec:.2f}x" if row["batch"] else "- | -"
        nll = f"{quality[name]:+.3%}" if name in quality else "-"
        print(f"| {name} | {dec:.1f} | {dec / llama_decode:.2f}x | {reads[name] / 1e6:.0f} | {gbs:.1f} | "
              f"{gbs / bandwidth:.2f} | {med(row['ttft']) * 1e3:.0f} | {pre:.0f} | {pre / llama_prefill:.2f}x | {batch} | {nll} |")
    print(f"\n(medians of {REPEATS} runs; decode: batch 1, {PROMPT}-token prompt, {NEW} new tokens, greedy, EOS ignored; "
          f"MB read per step: the weight layouts a step reads plus the mean KV cache; NLL: mean token NLL on 2,068 "
          f"tokens of English relative to fp32 on the same file's dequantized weights)")


if __name__ == "__main__":
    main()
