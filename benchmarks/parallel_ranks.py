"""One rank of `python -m benchmarks parallel`, under torchrun (TP x PP ranks), or one plain process:

    python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/parallel_ranks.py MODEL 2 1 OUT.json ...
    python benchmarks/parallel_ranks.py MODEL 1 1 OUT.json PROMPT NEW PREFILL REPEATS CAPTURE   (one DecoderEngine)

Rank 0 drives the engine API (the others follow) and writes, as JSON: the median time to first token
of a PROMPT-token prompt, decode tok/s over NEW greedy tokens, prefill tok/s of PREFILL tokens, and
the collectives one decode step issued on rank 0 (count, message bytes). Every row of the benchmark
runs in a process of its own, started the same way, so that they differ only in the layout."""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

import anatomy
from anatomy.inference.engine import DecoderEngine
from anatomy.inference.sampling import SamplingParams
from anatomy.parallel.collectives import recording
from anatomy.parallel.layout import Layout
from anatomy.parallel.ranks import sharded_engine
from anatomy.parallel.world import join, leave


def prompt_ids(n: int, vocab: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=g).tolist()


def measure(engine, *, prompt: int, new: int, prefill: int, repeats: int) -> dict:
    """Medians of `repeats` runs: TTFT, decode tok/s, prefill tok/s; one decode step's collectives."""
    vocab = engine.config.vocab_size
    short, long_ = prompt_ids(prompt, vocab), prompt_ids(prefill, vocab, seed=1)
    greedy = SamplingParams(max_new_tokens=new, ignore_eos=True)
    ttft, decode, prefills = [], [], []
    for _ in range(repeats + 1):  # the first run warms up
        start = time.perf_counter()
        stamps = [time.perf_counter() for _ in engine.tokens([short], greedy)]
        ttft.append(stamps[0] - start)
        decode.append((len(stamps) - 1) / (stamps[-1] - stamps[0]))
        start = time.perf_counter()
        engine.start([long_], SamplingParams(max_new_tokens=1)).prefill()
        prefills.append(prefill / (time.perf_counter() - start))
    run = engine.start([short], SamplingParams(max_new_tokens=2))
    token = run.choose(run.prefill())
    with recording() as log:
        run.decode(token)
    med = lambda xs: statistics.median(xs[1:])  # noqa: E731
    return {"ttft_s": med(ttft), "decode_tok_s": med(decode), "prefill_tok_s": med(prefills),
            "collectives": log.count(), "message_bytes": log.total_bytes(), "threads": torch.get_num_threads()}


def main(model_dir: str, tp: int, pp: int, out: str, prompt: int, new: int, prefill: int, repeats: int,
         capture: int = 0) -> None:
    sizes = dict(prompt=prompt, new=new, prefill=prefill, repeats=repeats)
    if tp * pp == 1:  # one plain process: the engine as it runs without parallelism
        engine = DecoderEngine(anatomy.load(model_dir), capture=bool(capture))
        _write(out, measure(engine, **sizes) | {"decode_weight_bytes_rank0": engine.decode_weight_bytes})
        return
    world = join(Layout(tp=tp, pp=pp))
    engine = sharded_engine(anatomy.load(model_dir), world)
    if engine is not None:
        result = measure(engine, **sizes) | {"decode_weight_bytes_rank0": engine.decode_weight_bytes}
        engine.close()
        _write(out, result)
    leave(world)


def _write(out: str, result: dict) -> None:
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    model_dir, tp, pp, out, *sizes = sys.argv[1:]
    main(model_dir, int(tp), int(pp), out, *map(int, sizes))
