"""One rank of the tests' parallel runs, started by them under torchrun:

    python -m torch.distributed.run --standalone --nproc-per-node 2 worker.py OUT CASES.json

CASES.json lists {"name", "model" (a saved model directory), "weights", "tp", "pp"}. For each case
every rank cuts its shard and builds its engine; rank 0 drives (the others follow its calls) and
records what the tests compare with one rank's engine: full-pass logits, a padded batch's prefill
and decode logits, 64 greedy tokens; then one prefill and one decode step with every rank
recording the collectives it issues, and each rank's weight bytes. Each rank saves its results to
OUT/<name>.rank<r>.pt (torch.save of plain values and tensors).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

import anatomy
from anatomy.inference.engine import DecoderEngine
from anatomy.inference.sampling import SamplingParams
from anatomy.parallel.channel import Channel
from anatomy.parallel.collectives import recording
from anatomy.parallel.driver import ParallelEngine
from anatomy.parallel.follower import follow
from anatomy.parallel.layout import Layout
from anatomy.parallel.shard import shard_model
from anatomy.parallel.world import join, leave
from anatomy.weights.modules import stored_bytes

IDS = [[5, 6, 7, 8, 9, 10, 11, 12]]
BATCH = [[5, 6, 7, 8, 9], [20, 21, 22]]  # left-padded to [2, 5]
GREEDY = [[3, 14, 15, 92, 65]]
COMM_PROMPT = [[7, 8, 9, 10]]


def session(world, shard, drive, kv_dtype: str | None = None) -> dict:
    """A fresh engine on every rank over the same shard; rank 0 runs `drive(engine)`, the others follow."""
    channel = Channel(world.control)
    if world.is_driver:
        engine = ParallelEngine(shard, world, channel=channel, kv_dtype=kv_dtype)
        try:
            return drive(engine)
        finally:
            engine.close()
    follow(DecoderEngine(shard, capture=False, kv_dtype=kv_dtype), channel)
    return {}


def checks(engine) -> dict:
    out = {"logits": engine.logits(torch.tensor(IDS))}
    run = engine.start(BATCH, SamplingParams(max_new_tokens=2))
    out["batch_prefill"] = run.prefill()
    out["batch_decode"] = run.decode(torch.tensor([31, 32]))
    out["greedy"] = [int(t[0]) for t in engine.tokens(GREEDY, SamplingParams(max_new_tokens=64, ignore_eos=True))]
    return out


def comm(engine) -> dict:
    run = engine.start(COMM_PROMPT, SamplingParams(max_new_tokens=2))
    with recording() as prefill:
        token = run.choose(run.prefill())
    with recording() as decode:
        run.decode(token)
    return {"prefill_ops": _ops(prefill), "decode_ops": _ops(decode)}


def lanes(engine) -> dict:
    """Two threads, each its own paged cache and steps (serving's lanes), then the same steps one after the
    other: the logits of each, and when each thread entered rank 0's stage and got its step back."""
    import threading
    import time

    from anatomy.inference.engine import Chunk

    def steps(cache, lane):
        yield [Chunk([5 + lane, 6, 7, 8], 0, [0])]
        for j in range(6):
            yield [Chunk([10 + j + lane], 4 + j, [0])]

    stage, times = engine._stage, []

    class Recorded:  # rank 0's stage lock, its acquisitions timed
        def acquire(self):
            stage.acquire()
            times.append(("enter", threading.get_ident(), time.perf_counter()))

        def release(self):
            stage.release()

    engine._stage = Recorded()
    out = {"lanes": [None, None], "alone": []}

    def run(lane):
        cache = caches[lane]
        logits = []
        for chunks in steps(cache, lane):
            logits.append(engine.step(cache, chunks))
            times.append(("done", threading.get_ident(), time.perf_counter()))
        out["lanes"][lane] = torch.cat(logits)

    caches = [engine.paged_cache(num_blocks=4, block_size=16) for _ in range(2)]
    threads = [threading.Thread(target=run, args=(lane,)) for lane in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    engine._stage = stage
    for lane in range(2):
        cache = engine.paged_cache(num_blocks=4, block_size=16)
        out["alone"].append(torch.cat([engine.step(cache, chunks) for chunks in steps(cache, lane)]))
    out["overlaps"] = _overlaps(times)
    return out


def _overlaps(times: list) -> int:
    """Entries into the stage while the other thread's step was still waiting for its logits."""
    open_since: dict[int, float] = {}
    count = 0
    for what, thread, _ in times:
        if what == "enter":
            count += any(other != thread for other in open_since)
            open_since[thread] = 0.0
        else:
            open_since.pop(thread, None)
    return count


def _ops(log) -> list:
    return [[op.kind, op.where, list(op.shape), op.bytes] for op in log.ops]


def main(out: Path, cases: list[dict]) -> None:
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    for case in cases:
        model = anatomy.load(case["model"], weights=case.get("weights", "auto"))
        world = join(Layout(tp=case["tp"], pp=case["pp"]))
        shard = shard_model(model, world.place)
        result = {"stored_bytes": stored_bytes(shard), "params": sum(p.numel() for p in shard.parameters()),
                  "engine_weight_bytes": DecoderEngine(shard, capture=False).decode_weight_bytes}
        if not case.get("lanes"):
            result |= session(world, shard, checks, kv_dtype=case.get("kv_dtype"))
        if case.get("lanes"):
            result |= session(world, shard, lanes)
        elif world.is_driver:
            result |= session(world, shard, comm)
        elif not case.get("lanes"):  # a follower records every collective of the comm session: a prefill, a decode
            with recording() as log:
                session(world, shard, comm)
            result["ops"] = _ops(log)
        torch.save(result, out / f"{case['name']}.rank{rank}.pt")
    leave(world)


if __name__ == "__main__":
    main(Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text()))
