"""Speculative decoding against plain greedy decoding: the same engine, prompts and run.

SmolLM2-135M-Instruct in fp32 (the target the identity holds for); greedy; the prompts of
benchmarks/speculative_prompts.py: input-grounded tasks whose answer copies a long passage
(copy-edit, quote, answer) and open-ended chat (story, advice, explain), each through the chat
template, up to NEW new tokens (EOS ends a reply, the same for every method: the outputs are equal).
Per prompt, interleaved so that they share the machine's noise, REPEATS runs of

    plain    anatomy.generate(...)                                         one target forward per token
    ngram    speculative="ngram", num_speculative_tokens=K                 prompt lookup, adaptive k
    draft    speculative="draft", draft_model=<the GGUF's own Q4_1 copy>   the same model at ~5 bits a weight

and, where llama-cpp-python is installed, llama.cpp's own prompt lookup (LlamaPromptLookupDecoding,
K tokens) against plain llama.cpp on the F32 GGUF anatomy writes, for the same token counts.
Every speculative run's tokens are checked against the plain run's (a mismatch is printed and
fails the run). Decode tokens/s are medians; speedups are median speculative / median plain.
`predicted` is `anatomy inspect --speculative K --acceptance a` on this machine measured now
(bandwidth and f32 matmul peak), with a the run's measured per-token acceptance.

    python -m benchmarks speculative
    ANATOMY_BENCH_REPEATS=3 ANATOMY_BENCH_NEW=128 ANATOMY_BENCH_PROMPTS=copy-edit,story ANATOMY_BENCH_LLAMA=0
"""

from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path

import anatomy
from anatomy.analysis.hardware import measure_local
from anatomy.analysis.speculative import SpeculativeOptions, speculative_report
from anatomy.checkpoints.registry import resolve
from anatomy.inference.engine import DecoderEngine
from anatomy.inference.generate import encode_prompt
from benchmarks.bench_decode import step_times
from benchmarks.speculative_prompts import CHAT, GROUNDED

MODEL = "smollm2-135m-instruct"
K = 5
NEW = int(os.environ.get("ANATOMY_BENCH_NEW", "128"))
REPEATS = int(os.environ.get("ANATOMY_BENCH_REPEATS", "3"))
LLAMA = os.environ.get("ANATOMY_BENCH_LLAMA", "1") != "0"
PROMPTS = {**{n: ("grounded", p) for n, p in GROUNDED.items()}, **{n: ("chat", p) for n, p in CHAT.items()}}
WANTED = [n for n in os.environ.get("ANATOMY_BENCH_PROMPTS", ",".join(PROMPTS)).split(",") if n]


def methods(draft: DecoderEngine) -> dict[str, dict]:
    return {"plain": {}, "ngram": dict(speculative="ngram", num_speculative_tokens=K),
            "draft": dict(speculative="draft", draft_model=draft, num_speculative_tokens=K)}


def main() -> None:
    unknown = sorted(set(WANTED) - set(PROMPTS))
    if unknown:
        raise SystemExit(f"ANATOMY_BENCH_PROMPTS: unknown prompt(s) {unknown}; known: {', '.join(PROMPTS)}")
    gguf = resolve(MODEL)
    target = DecoderEngine(anatomy.load(gguf, weights="f32"))
    tokenizer = anatomy.load_tokenizer(gguf)
    runs = methods(DecoderEngine(anatomy.load(gguf)))  # the file's own Q4_1 blocks, kept compact
    print("warming up: each prompt and method once (kernel plans, captured steps) ...", flush=True)
    for name in WANTED:
        for options in runs.values():
            anatomy.generate(target, PROMPTS[name][1], tokenizer=tokenizer, max_new_tokens=NEW, **options)
    results: dict[tuple[str, str], list] = {}
    for rep in range(REPEATS):
        for name in WANTED:
            for method, options in runs.items():
                r = anatomy.generate(target, PROMPTS[name][1], tokenizer=tokenizer, max_new_tokens=NEW, **options)
                results.setdefault((name, method), []).append(r)
        print(f"  run {rep + 1}/{REPEATS} done", flush=True)
    mismatches = _mismatches(results)
    llama = _llama(gguf, tokenizer, results) if LLAMA else {}
    _print(results, llama, measure_local(), target.model.config, mismatches)
    if mismatches:
        raise SystemExit(f"speculative output differs from plain greedy output: {mismatches}")


def _mismatches(results: dict[tuple[str, str], list]) -> list[str]:
    """(prompt, method) pairs whose tokens differ from that prompt's plain run in some repeat."""
    plain = {name: runs[0].token_ids for (name, method), runs in results.items() if method == "plain"}
    return [f"{name}/{method}" for (name, method), runs in results.items()
            if any(r.token_ids != plain[name] for r in runs)]


def _llama(gguf: Path, tokenizer, results: dict[tuple[str, str], list]) -> dict[str, tuple[float, float]]:
    """prompt -> (plain, prompt-lookup) median decode tok/s of llama.cpp on the F32 GGUF, as many
    new tokens as anatomy's plain run made (EOS not checked)."""
    try:
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    except ImportError:
        print("(llama-cpp-python is not installed: no llama.cpp rows)")
        return {}
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "f32.gguf"
        anatomy.save(anatomy.load(gguf, weights="f32"), path, dtype="f32", tokenizer=tokenizer)
        plain = _llama_lookup(path, None)
        lookup = _llama_lookup(path, LlamaPromptLookupDecoding(num_pred_tokens=K))
        for name in WANTED:
            ids = encode_prompt(PROMPTS[name][1], tokenizer)
            new = max(2, len(results[(name, "plain")][0].token_ids))
            times = [(_llama_tps(plain, ids, new), _llama_tps(lookup, ids, new)) for _ in range(REPEATS)]
            out[name] = (statistics.median(t[0] for t in times), statistics.median(t[1] for t in times))
    return out


def _llama_lookup(path: Path, draft):
    """llama.cpp's binding on `path`, with a draft model (prompt lookup) or none (plain decoding)."""
    import torch
    from llama_cpp import Llama

    return Llama(model_path=str(path), n_ctx=1024, n_batch=512, n_threads=torch.get_num_threads(), verbose=False,
                 draft_model=draft)


def _llama_tps(llm, ids: list[int], new: int) -> float:
    llm.reset()
    tokens = llm.generate(ids, temp=0.0, top_k=1, reset=True)
    return step_times(next(tokens) for _ in range(new))[1]


def _predicted(config, hardware, stats, draft: bool, prompt_tokens: int) -> float:
    """The roofline's speedup at the run's per-token acceptance (k = K, as `anatomy inspect` takes it)."""
    options = SpeculativeOptions(k=K, acceptance=stats.acceptance_per_token, draft=config if draft else None,
                                 draft_name="the Q4_1 copy" if draft else "n-gram", draft_dtype="int4" if draft else None)
    return speculative_report(config, hardware, options, context=prompt_tokens + NEW // 2, weight_dtype="f32",
                              kv_dtype="f32", compute_dtype="f32")["speedup"]


# -- the table ------------------------------------------------------------------------------------

def _print(results: dict[tuple[str, str], list], llama: dict, hardware, config, mismatches: list[str]) -> None:
    med = statistics.median
    print(f"\nmeasured: memory bandwidth {hardware.bandwidth / 1e9:.1f} GB/s, f32 matmul "
          f"{hardware.peak('f32') / 1e9:.0f} GFLOP/s (for `predicted`)\n")
    print("| prompt | task | method | new tokens | decode tok/s | speedup | acceptance | a per token "
          "| tokens per target forward | predicted | same tokens as plain |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    speedups: dict[tuple[str, str], list[float]] = {}
    for name in WANTED:
        task, plain = PROMPTS[name][0], med(r.tokens_per_s for r in results[(name, "plain")])
        for method in ("plain", "ngram", "draft"):
            runs = results[(name, method)]
            tps, new = med(r.tokens_per_s for r in runs), len(runs[0].token_ids)
            same = "no" if f"{name}/{method}" in mismatches else "yes"
            if method == "plain":
                print(f"| {name} | {task} | plain | {new} | {tps:.1f} | 1.00x | - | - | 1.00 | - | - |")
                continue
            speedups.setdefault((task, method), []).append(tps / plain)
            s = _summed([r.speculative for r in runs])
            predicted = _predicted(config, hardware, s, method == "draft", runs[0].prompt_tokens)
            print(f"| {name} | {task} | {method} (k <= {K}) | {new} | {tps:.1f} | {tps / plain:.2f}x | "
                  f"{s.acceptance_rate:.0%} | {s.acceptance_per_token:.2f} | {s.tokens_per_forward:.2f} | "
                  f"{predicted:.2f}x | {same} |")
        if name in llama:
            base, lookup = llama[name]
            print(f"| {name} | {task} | llama.cpp F32 | {new} | {base:.1f} | 1.00x | - | - | 1.00 | - | - |")
            print(f"| {name} | {task} | llama.cpp prompt lookup (k = {K}) | {new} | {lookup:.1f} | "
                  f"{lookup / base:.2f}x | - | - | - | - | - |")
    _targets(speedups)
    print(f"\n(medians of {REPEATS} runs; fp32 target, greedy, up to {NEW} new tokens; acceptance = kept / proposed "
          "and a = kept / (kept + rejections) summed over the runs; predicted at k = "
          f"{K} and the measured a)")


def _summed(stats: list):
    total = type(stats[0])(stats[0].method, stats[0].num_speculative_tokens)
    for s in stats:
        for field in ("proposed", "accepted", "rejections", "target_forwards", "verifications", "draft_forwards",
                      "tokens"):
            setattr(total, field, getattr(total, field) + getattr(s, field))
    return total


def _targets(speedups: dict[tuple[str, str], list[float]]) -> None:
    print()
    if ("grounded", "ngram") in speedups:
        g = speedups[("grounded", "ngram")]
        print(f"n-gram on input-grounded prompts: median {statistics.median(g):.2f}x, lowest {min(g):.2f}x "
              f"(target >= 1.5x: {'met' if statistics.median(g) >= 1.5 else 'MISSED'})")
    if ("chat", "ngram") in speedups:
        c = speedups[("chat", "ngram")]
        print(f"n-gram on open-ended chat: lowest {min(c):.2f}x (target >= 0.95x: {'met' if min(c) >= 0.95 else 'MISSED'})")
    for task in ("grounded", "chat"):
        if (task, "draft") in speedups:
            print(f"Q4_1 draft on {task} prompts: median {statistics.median(speedups[(task, 'draft')]):.2f}x")


if __name__ == "__main__":
    main()
