"""Quality as llama.cpp measures quantization: perplexity, mean KL divergence from fp32 and top-1
agreement, anatomy's (every token through the decode step `anatomy generate` runs:
anatomy/inference/perplexity.py) beside `llama-perplexity --kl-divergence`'s, same files, same tokens.

The reference: the shipped Q4_1 file dequantized and written as an F32 GGUF (anatomy.save), whose
log-probabilities `llama-perplexity --kl-divergence-base` saves over tests/data/english.txt in chunks
of CTX tokens (the second half of each scored). Each file is then scored by `llama-perplexity
--kl-divergence` against them, and by anatomy (default engine, `anatomy.load(file)`) on the tokens
llama.cpp read (those the base file holds) against its fp32 forward of the same F32 file. Files:
the shipped Q4_1 (whose dequantized weights the reference is), and where llama-quantize is built,
Q4_0, Q4_K_M, Q5_K_M, Q6_K, Q8_0, IQ4_NL and IQ4_XS made from the F32 file (their KL: from the weights they
were made from).

    python -m benchmarks quality
"""

from __future__ import annotations

import functools
import re
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

import torch

import anatomy
from anatomy.checkpoints.registry import resolve
from anatomy.inference.engine import DecoderEngine
from anatomy.inference.perplexity import perplexity
from benchmarks.llama_cpp import llama_tool

MODEL = "smollm2-135m-instruct"
ENGLISH = Path(__file__).parents[1] / "tests" / "data" / "english.txt"
CTX = 512  # llama-perplexity's default -c; english.txt's 2,068 tokens: 4 chunks, 255 predictions each
# made by llama-quantize from the F32 file, where it is built
QUANTS = ("Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "IQ4_NL", "IQ4_XS")

# llama-perplexity --kl-divergence's summary lines (tools/perplexity/perplexity.cpp's kl_divergence)
SUMMARY = {"perplexity": r"Mean\s+PPL\(Q\)\s*:\s*([0-9.]+)",
           "reference_perplexity": r"Mean\s+PPL\(base\)\s*:\s*([0-9.]+)",
           "kl_divergence": r"Mean\s+KLD:\s*(-?[0-9.]+)", "top1_agreement": r"Same top p:\s*([0-9.]+)\s*±"}


def parse_kl_divergence(text: str) -> dict[str, float]:
    """{perplexity, reference_perplexity, kl_divergence, top1_agreement (a share)} from the output of
    `llama-perplexity --kl-divergence`; RuntimeError naming a missing line."""
    found = {}
    for key, pattern in SUMMARY.items():
        match = re.search(pattern, text)
        if match is None:
            raise RuntimeError(f"llama-perplexity printed no {pattern!r} line:\n{text[-2000:]}")
        found[key] = float(match.group(1))
    found["top1_agreement"] /= 100  # printed as a percentage
    return found


def kld_tokens(path: Path) -> tuple[int, list[int]]:
    """(n_ctx, the tokens) of a --kl-divergence-base file: "_logits_", n_ctx u32, n_vocab i32, n_chunk
    i32, then n_ctx * n_chunk token ids (i32), then the log-probabilities."""
    with open(path, "rb") as f:
        head = f.read(20)
        if len(head) < 20 or head[:8] != b"_logits_":
            raise RuntimeError(f"{path} is not a llama-perplexity log-probability file")
        n_ctx, _, n_chunk = struct.unpack("<Iii", head[8:])
        count = n_ctx * n_chunk
        return n_ctx, list(struct.unpack(f"<{count}i", f.read(4 * count)))


@functools.cache
def perplexity_tool() -> str:
    return llama_tool("llama-perplexity")


def llama_perplexity(*args: str) -> str:
    out = subprocess.run([perplexity_tool(), "-t", str(torch.get_num_threads()), *args],
                         capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"llama-perplexity {' '.join(args)} failed:\n{out.stderr[-3000:]}")
    return out.stdout + out.stderr


def quantized(f32: Path, folder: Path) -> dict[str, Path]:
    """{type: file} of the QUANTS llama-quantize makes from the F32 file, where it is built (none otherwise)."""
    tool = shutil.which("llama-quantize") or str(Path(perplexity_tool()).with_name("llama-quantize"))
    if not Path(tool).exists():
        print("llama-quantize is not built: the shipped file only", flush=True)
        return {}
    files = {}
    for kind in QUANTS:
        files[kind] = folder / f"{kind}.gguf"
        subprocess.run([tool, str(f32), str(files[kind]), kind], check=True, capture_output=True, timeout=1800)
    return files


def anatomy_figures(path: Path, reference: torch.nn.Module, ids: list[int]) -> dict[str, float]:
    q = perplexity(DecoderEngine(anatomy.load(path)), reference, ids, ctx=CTX)
    return {"perplexity": q.perplexity, "reference_perplexity": q.reference_perplexity,
            "kl_divergence": q.kl_divergence, "top1_agreement": q.top1_agreement, "tokens": q.tokens}


def main() -> None:
    gguf = resolve(MODEL)
    tokenizer = anatomy.load_tokenizer(gguf)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        f32 = anatomy.save(anatomy.load(gguf, weights="f32"), folder / "f32.gguf", dtype="f32", tokenizer=tokenizer)
        base = folder / "base.kld"
        llama_perplexity("-m", str(f32), "-f", str(ENGLISH), "-c", str(CTX), "--kl-divergence-base", str(base))
        n_ctx, ids = kld_tokens(base)
        same = ids == tokenizer.encode(ENGLISH.read_text())[:len(ids)]
        print(f"{len(ids)} tokens of tests/data/english.txt in {len(ids) // n_ctx} chunks of {n_ctx} (llama.cpp's "
              f"tokens; anatomy's tokenizer gives {'the same' if same else 'OTHER'} ids); reference: the F32 file",
              flush=True)
        reference = anatomy.load(f32)
        files = {"Q4_1 (shipped)": gguf} | quantized(f32, folder)
        rows = {}
        for name, path in files.items():
            print(f"  {name} ...", flush=True)
            llama = parse_kl_divergence(llama_perplexity("-m", str(path), "--kl-divergence-base", str(base),
                                                         "--kl-divergence", "-c", str(n_ctx)))
            rows[name] = (anatomy_figures(path, reference, ids), llama)
    print_table(rows)


def print_table(rows: dict[str, tuple[dict, dict]]) -> None:
    print("\n| file | engine | PPL | PPL fp32 | PPL / fp32 | mean KL | same top-1 |\n|---|---|---|---|---|---|---|")
    for name, figures in rows.items():
        for engine, f in zip(("anatomy (decode step)", "llama-perplexity"), figures):
            print(f"| {name} | {engine} | {f['perplexity']:.4f} | {f['reference_perplexity']:.4f} | "
                  f"{f['perplexity'] / f['reference_perplexity'] - 1:+.3%} | {f['kl_divergence']:.6f} | "
                  f"{f['top1_agreement']:.2%} |")
    scored = next(iter(rows.values()))[0]["tokens"]
    print(f"\n({scored} predictions: the second half of each chunk of {CTX}, as llama-perplexity scores them)")


if __name__ == "__main__":
    main()
