"""Decode, prefill and batching speed of anatomy's engine against HF transformers and llama.cpp.

Same machine, same run, same weights: SmolLM2-135M-Instruct in fp32 (anatomy loads the embedded
GGUF; HF gets it as the HF directory `anatomy.save` writes, llama.cpp as the F32 GGUF it writes).
Batch 1, a 128-token prompt, 128 new tokens, greedy, EOS ignored; each figure is the median of
REPEATS runs, the engines interleaved so that they share the machine's noise. The memory
bandwidth (torch sum over 256 MiB) and the fp32 matmul peak (2048^3) are measured in the same run,
giving the decode roofline (weight + KV bytes per token / bandwidth) and the prefill fraction of peak.

    python -m benchmarks decode            (ANATOMY_BENCH_REPEATS=5, ANATOMY_BENCH_COMPILE=0 to skip compile)
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

import anatomy
from anatomy.analysis.hardware import measure_matmul_peak
from anatomy.inference.engine import DecoderEngine
from anatomy.inference.kv_cache import bytes_per_token
from anatomy.inference.sampling import SamplingParams
from benchmarks.timing import median_seconds

MODEL = "smollm2-135m-instruct"
PROMPT, NEW, PREFILL, BATCH = 128, 128, 512, 8
REPEATS = int(os.environ.get("ANATOMY_BENCH_REPEATS", "3"))
COMPILE = os.environ.get("ANATOMY_BENCH_COMPILE", "1") != "0"


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


# -- the three engines ----------------------------------------------------------------------------

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
                    max_new_tokens=new, min_new_tokens=new, do_sample=False, streamer=stamps,
                    pad_token_id=0)
    tokens = stamps.calls[1:]  # the first put() is the prompt
    decode_s = tokens[-1] - tokens[0]
    return tokens[0] - start, (len(tokens) - 1) / decode_s if decode_s > 0 else 0.0


def llama_model(model: torch.nn.Module, path: Path):
    from llama_cpp import Llama

    anatomy.save(model, path, dtype="f32")
    return Llama(model_path=str(path), n_ctx=1024, n_batch=512, n_threads=torch.get_num_threads(),
                 verbose=False)


def llama_run(llm, prompt: list[int], new: int) -> tuple[float, float]:
    llm.reset()
    tokens = llm.generate(prompt, temp=0.0, top_k=1, reset=True)
    return step_times(next(tokens) for _ in range(new))


# -- the table ------------------------------------------------------------------------------------

def main() -> None:
    torch.manual_seed(0)
    model = anatomy.load(MODEL)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    kv_read = bytes_per_token(model.config) * (PROMPT + NEW // 2)  # mean cache bytes read per step
    short, long_ = prompt_ids(PROMPT), prompt_ids(PREFILL, seed=1)
    batch = [prompt_ids(PROMPT, seed=10 + i) for i in range(BATCH)]
    engines = {"anatomy (eager)": DecoderEngine(model)}
    if COMPILE:
        engines["anatomy (--compile)"] = DecoderEngine(model, compile=True)
    with tempfile.TemporaryDirectory() as tmp:
        hf, llm = hf_model(model, Path(tmp) / "hf"), llama_model(model, Path(tmp) / "smollm2-f32.gguf")
        print(f"warming up (compiling: {COMPILE}) ...", flush=True)
        for engine in engines.values():
            for prompts, new in (([short], NEW), ([long_], 1), (batch, NEW)):
                anatomy_run(engine, prompts, new)
        runs = {k: [] for k in ("bandwidth", "peak")}
        for rep in range(REPEATS):
            runs["bandwidth"].append(bandwidth_gbs())
            runs["peak"].append(measure_matmul_peak(torch.device("cpu"), size=2048, repeats=5) / 1e9)
            for name, engine in engines.items():
                _record(runs, name, anatomy_run(engine, [short], NEW), anatomy_run(engine, [long_], 1)[0],
                        anatomy_run(engine, batch, NEW)[1])
            _record(runs, "HF transformers", hf_run(hf, short, NEW), hf_run(hf, long_, 1)[0])
            _record(runs, "llama.cpp F32", llama_run(llm, short, NEW), llama_run(llm, long_, 1)[0])
            print(f"  run {rep + 1}/{REPEATS} done", flush=True)
    _print(runs, params, kv_read, model)


def _record(runs: dict, name: str, decode: tuple[float, float], prefill_s: float, batch_tps: float | None = None):
    row = runs.setdefault(name, {"ttft": [], "decode": [], "prefill": [], "batch": []})
    row["ttft"].append(decode[0])
    row["decode"].append(decode[1])
    row["prefill"].append(PREFILL / prefill_s)
    if batch_tps is not None:
        row["batch"].append(batch_tps)


def _print(runs: dict, weight_bytes: int, kv_read: int, model) -> None:
    med = statistics.median
    bandwidth, peak = med(runs.pop("bandwidth")), med(runs.pop("peak"))
    roofline = bandwidth * 1e9 / (weight_bytes + kv_read)
    flops_per_token = 2 * sum(p.numel() for n, p in model.named_parameters() if n != "stack.embed.tokens.weight")
    hf, llama = med(runs["HF transformers"]["decode"]), med(runs["llama.cpp F32"]["decode"])
    hf_prefill = med(runs["HF transformers"]["prefill"])
    print(f"\nmeasured: memory bandwidth {bandwidth:.1f} GB/s (torch sum, 256 MiB); fp32 matmul {peak:.0f} GFLOP/s "
          f"(2048^3); weights {weight_bytes / 1e6:.0f} MB + KV {kv_read / 1e6:.1f} MB per step -> decode roofline "
          f"{roofline:.1f} tok/s\n")
    print(f"| engine | decode tok/s | vs HF | vs llama.cpp | of roofline | TTFT {PROMPT} (ms) | prefill {PREFILL} tok/s"
          f" | prefill vs HF | prefill of matmul peak | batch {BATCH} tok/s | batch {BATCH} / batch 1 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, row in runs.items():
        dec, pre = med(row["decode"]), med(row["prefill"])
        batch = f"{med(row['batch']):.1f} | {med(row['batch']) / dec:.2f}x" if row["batch"] else "- | -"
        print(f"| {name} | {dec:.1f} | {dec / hf:.2f}x | {dec / llama:.2f}x | {dec / roofline:.2f} | "
              f"{med(row['ttft']) * 1e3:.0f} | {pre:.0f} | {pre / hf_prefill:.2f}x | "
              f"{pre * flops_per_token / 1e9 / peak:.2f} | {batch} |")
    print(f"\n(medians of {REPEATS} runs; batch 1, {PROMPT}-token prompt, {NEW} new tokens, greedy, EOS ignored, fp32, "
          f"{torch.get_num_threads()} threads; prefill FLOPs counted as 2 x non-embedding parameters per token)")


if __name__ == "__main__":
    main()
