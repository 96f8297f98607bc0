"""KV blocks kept beyond the pool (serving/offload.py): evicted to host memory and restored; written
to a directory when the loop stops and restored by a new loop (a restart); a truncated or foreign
file ignored with a log line. Every output equals the engine's greedy tokens alone (fp32) and only
the prompt's tail is computed."""

from __future__ import annotations

import os

import torch

from anatomy.inference.engine import DecoderEngine, PagedKVCache
from anatomy.inference.sampling import SamplingParams
from anatomy.serving.blocks import chain_hashes
from anatomy.serving.loop import ServingLoop

from .conftest import engine_tokens, run_all
from ..inference.conftest import llama_tiny

GREEDY = SamplingParams(max_new_tokens=6, ignore_eos=True)


def prompt(seed: int, n: int = 26) -> list[int]:
    return torch.randint(3, 97, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def served(loop, ids) -> tuple[list[int], int]:
    """(the greedy tokens of ids, prompt tokens computed for them)."""
    before = loop.metrics.prompt_tokens
    tokens = [e.token for e in run_all(loop, [ids], GREEDY)[0]]
    return tokens, loop.metrics.prompt_tokens - before


def make_loop(engine, **offload) -> ServingLoop:
    block = PagedKVCache.block_bytes(engine.config, 4, torch.float32)
    return ServingLoop(engine, kv_bytes=10 * block, block_size=4, **offload)  # 10 blocks of 4 tokens


def test_evicted_blocks_come_back_from_host_memory():
    engine = DecoderEngine(llama_tiny())
    loop = make_loop(engine, offload_bytes=10 ** 7)
    a = prompt(1)
    alone = engine_tokens(engine, a, GREEDY)
    assert served(loop, a) == (alone, 26)
    for seed in (2, 3):  # their blocks evict all of a's
        served(loop, prompt(seed))
    assert loop.blocks.peek(chain_hashes(a, 4)) == [] and loop.offload.saved >= 6, "a's blocks left the pool"
    tokens, computed = served(loop, a)
    assert tokens == alone and computed == 26 - 6 * 4, "six full blocks restored, the last two tokens computed"
    assert loop.offload.restored == 6


def test_a_directory_outlives_the_loop_and_bad_files_are_ignored(tmp_path, capsys):
    engine = DecoderEngine(llama_tiny())
    a = prompt(1)
    alone = engine_tokens(engine, a, GREEDY)
    first = make_loop(engine, offload_dir=str(tmp_path))
    assert served(first, a) == (alone, 26)
    first.stop()  # the pool's cached blocks are written
    assert len(list(tmp_path.iterdir())) == 7, "a's six prompt blocks and its first full block of output"
    again = make_loop(engine, offload_dir=str(tmp_path))  # a restart
    assert served(again, a) == (alone, 2) and again.offload.restored == 6

    third = tmp_path / (again.offload.key(chain_hashes(a, 4)[2]).hex() + ".kv")  # the third block of a's prompt
    third.write_bytes(third.read_bytes()[:-10])  # truncated
    restarted = make_loop(engine, offload_dir=str(tmp_path))
    assert served(restarted, a) == (alone, 26 - 2 * 4), "two blocks restored, the rest computed"
    assert "ignoring the KV block file" in capsys.readouterr().err


def test_another_model_never_reads_the_blocks(tmp_path, capsys):
    engine = DecoderEngine(llama_tiny())
    a = prompt(1)
    first = make_loop(engine, offload_dir=str(tmp_path))
    served(first, a)
    first.stop()
    torch.manual_seed(5)
    other = DecoderEngine(llama_tiny())  # the same config, other weights
    loop = make_loop(other, offload_dir=str(tmp_path))
    assert served(loop, a) == (engine_tokens(other, a, GREEDY), 26) and loop.offload.restored == 0
    # a file of the first model under the key the other model would look for: read, and refused
    for h in chain_hashes(a, 4):
        os.replace(tmp_path / (first.offload.key(h).hex() + ".kv"), tmp_path / (loop.offload.key(h).hex() + ".kv"))
    again = make_loop(other, offload_dir=str(tmp_path))
    assert served(again, a) == (engine_tokens(other, a, GREEDY), 26) and again.offload.restored == 0
    assert "written for another model" in capsys.readouterr().err
