"""`anatomy generate/serve --tensor-parallel-size N --pipeline-parallel-size M` end to end: the ranks
started by the command itself (2 gloo processes on this machine), the same answers as one process,
the served API through the openai client, a rank killed mid-request (one clear error, nothing left
running), and what is refused before any rank starts."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

import anatomy
from anatomy import build_model, get_preset
from anatomy.cli import main
from anatomy.inference.sampling import SamplingParams

from ..serving.conftest import Server

ENV = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
PROMPTS = [[1, 504, 3046, 314, 4649, 30], [1, 19556, 28, 421, 359, 346]]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    """A tiny random LLaMA-style model (GQA 4/2) with SmolLM2's tokenizer, in the HF layout."""
    tokenizer = anatomy.load_tokenizer("smollm2-135m-instruct")
    torch.manual_seed(0)
    model = build_model(get_preset("llama-7b", vocab_size=tokenizer.vocab_size, d_model=64, n_heads=4, n_kv_heads=2,
                                   n_layers=2, d_ff=128, max_seq_len=256, bos_token_id=tokenizer.bos_id,
                                   eos_token_id=tokenizer.eos_id))
    path = tmp_path_factory.mktemp("tiny") / "llama"
    anatomy.save(model, path)
    tokenizer.save(path)
    return path


def one_process_text(path: Path, prompt: list[int], n: int) -> str:
    """The greedy continuation of one process's engine, decoded as the server decodes it."""
    model, tokenizer = anatomy.load(path), anatomy.load_tokenizer(path)
    ids = [int(t[0]) for t in anatomy.engine_for(model).tokens([prompt], SamplingParams(max_new_tokens=n,
                                                                                         ignore_eos=True))]
    return tokenizer.decode(ids, skip_special_tokens=True)


def anatomy_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "anatomy", *args], env=ENV, capture_output=True, text=True,
                          timeout=timeout)


# -- refused before any rank starts ------------------------------------------------------------

@pytest.mark.parametrize("args,message", [
    (["--tensor-parallel-size", "3"], "n_heads=4 is not divisible by --tensor-parallel-size 3"),
    (["--pipeline-parallel-size", "3"], "n_layers=2 cannot be split into --pipeline-parallel-size 3 stages"),
    (["--tensor-parallel-size", "0"], "--tensor-parallel-size 0 must be a positive integer"),
    (["--tensor-parallel-size", "2", "--compile"], "--compile does not run with --tensor-parallel-size"),
    (["--tensor-parallel-size", "2", "--speculative", "ngram"], "--speculative does not run with"),
])
def test_generate_refuses_at_once_with_nothing_started(tiny_dir, capsys, args, message):
    started = time.monotonic()
    assert main(["generate", "Hi", "--model", str(tiny_dir), *args]) == 2
    assert message in capsys.readouterr().err
    assert time.monotonic() - started < 10  # no rank was started (each takes seconds to import torch)


def test_serve_refuses_a_port_in_use_before_any_rank_starts(tiny_dir, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert main(["serve", "--model", str(tiny_dir), "--port", str(port), "--tensor-parallel-size", "2",
                     "--embedding-model", "none"]) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


# -- the ranks at work -------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("layout", [["--tensor-parallel-size", "2"], ["--pipeline-parallel-size", "2"]])
def test_generate_on_two_ranks_answers_as_one_process(tiny_dir, layout):
    args = ["generate", "What is the capital of France?", "--model", str(tiny_dir), "--max-new-tokens", "64",
            "--ignore-eos"]
    one = anatomy_cli(*args)
    two = anatomy_cli(*args, *layout, "--stats")
    assert one.returncode == 0 and two.returncode == 0, two.stderr
    assert two.stdout == one.stdout and len(one.stdout) > 64
    assert "64 new" in two.stderr


@pytest.mark.slow
@pytest.mark.parametrize("layout", [["--tensor-parallel-size", "2"], ["--pipeline-parallel-size", "2"]])
def test_the_served_api_gives_one_process_s_answers(tiny_dir, layout):
    server = Server("--model", str(tiny_dir), "--kv-memory", "16MiB", "--embedding-model", "none", *layout)
    try:
        client = server.client()
        assert "2 ranks: the weights, kernels and KV cache above are rank 0's shard" in server.output()

        def complete(prompt):
            return client.completions.create(model=str(tiny_dir), prompt=prompt, max_tokens=24, temperature=0,
                                             extra_body={"ignore_eos": True}).choices[0].text

        with ThreadPoolExecutor(2) as pool:  # two at once: one batched step over both
            texts = list(pool.map(complete, PROMPTS))
        assert texts == [one_process_text(tiny_dir, p, 24) for p in PROMPTS]
        stream = client.completions.create(model=str(tiny_dir), prompt=PROMPTS[0], max_tokens=24, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True})
        assert "".join(c.choices[0].text for c in stream if c.choices) == texts[0]
    finally:
        server.close()
    assert server.proc.returncode is not None


@pytest.mark.slow
def test_a_rank_killed_mid_request_stops_every_rank_with_one_clear_error(tiny_dir):
    server = Server("--model", str(tiny_dir), "--kv-memory", "16MiB", "--embedding-model", "none",
                    "--tensor-parallel-size", "2")
    ranks = rank_pids(server.proc.pid)
    assert sorted(ranks) == [0, 1]
    client = server.client(timeout=60)
    stream = client.completions.create(model=str(tiny_dir), prompt=PROMPTS[0], max_tokens=200, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    first = next(iter(stream))  # the request is being served
    assert first.choices
    os.kill(ranks[1], 9)
    with pytest.raises(Exception):  # the stream ends with an error or a dropped connection, never hangs
        for _ in stream:
            pass
    try:
        server.proc.wait(60)
    except subprocess.TimeoutExpired:
        server.close()
        pytest.fail("the server was still running 60 s after a rank died")
    output = server.output()
    assert server.proc.returncode == 1
    assert f"error: rank 1 of 2 (pid {ranks[1]}) was killed by SIGKILL; the other ranks were stopped" in output
    for pid in ranks.values():
        assert not alive(pid), f"rank pid {pid} is still running"
    server.log.close()


def rank_pids(launcher: int, timeout: float = 30) -> dict[int, int]:
    """{rank: pid} of the processes the launcher started (their RANK in /proc/<pid>/environ)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == launcher:
                env = dict(item.split(b"=", 1) for item in environ if b"=" in item)
                if b"RANK" in env:
                    found[int(env[b"RANK"])] = int(entry.name)
        if len(found) == 2:
            return found
        time.sleep(0.2)
    raise AssertionError(f"the launcher {launcher} did not start 2 ranks")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
def test_profile_on_two_ranks_puts_the_collectives_at_their_own_position(tiny_dir):
    """Rank 0's profile of a TP=2 run: the all-reduces and the head's gather (and the waits for the other
    rank) at `communication`, verdict "communication"; the local GEMMs still meet their rows of the
    shape trace of the shard's shapes (the LM head: its 1/2 of the vocabulary)."""
    import json

    done = anatomy_cli("profile", "--model", str(tiny_dir), "--tensor-parallel-size", "2", "--prompt-len", "8",
                       "--new-tokens", "4", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    decode = report["phases"]["decode"]
    assert decode["positions"]["communication"] > 0
    comm = [o for o in decode["ops"] if o["position"] == "communication"]
    assert {o["op"] for o in comm} >= {"c10d::allreduce_", "c10d::gather_"}
    assert all(o["bound"] == "communication" for o in comm)
    head = next(o for o in decode["ops"] if o["module"] == "lm_head" and o["op"] == "linear")
    vocab = anatomy.load_tokenizer(tiny_dir).vocab_size
    assert head["flops"] == 2 * 64 * (vocab // 2)
    out = next(o for o in decode["ops"] if o["module"] == "stack.blocks.*.attn.out" and o["op"] == "linear")
    assert out["flops"] == 2 * 2 * (2 * 16) * 64  # 2 layers x [1, 32] @ [32, 64]: the rank's 2 heads of 16
    assert report["parallel"] == {"tensor_parallel": 2, "pipeline_parallel": 1, "profiled_rank": 0}
