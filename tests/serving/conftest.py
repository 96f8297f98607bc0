"""Helpers shared by the serving tests: tiny random decoders and a synchronous way to run the loop."""

from __future__ import annotations

import pytest
import torch

from ..inference.conftest import gpt2_tiny, llama_tiny


@pytest.fixture(params=["llama", "gpt2"])
def tiny(request):
    return {"llama": llama_tiny, "gpt2": gpt2_tiny}[request.param]()


@pytest.fixture(scope="module")
def vocab_model(smollm2_tokenizer):
    """A tiny random LLaMA-style decoder of SmolLM2's vocabulary (for grammars and tags on its tokenizer)."""
    from anatomy import build_model, get_preset

    torch.manual_seed(0)
    return build_model(get_preset("llama-7b", vocab_size=smollm2_tokenizer.vocab_size, d_model=32, n_heads=2,
                                  n_kv_heads=1, d_ff=64, n_layers=1, max_seq_len=512)).eval()


@pytest.fixture(scope="module")
def grammars(smollm2_tokenizer):
    from anatomy.serving.grammar import GrammarEngine

    return GrammarEngine(smollm2_tokenizer, vocab_size=smollm2_tokenizer.vocab_size,
                         stop_ids=smollm2_tokenizer.eos_ids)


def random_prompts(n: int, *, vocab: int = 97, longest: int = 40, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (int(torch.randint(1, longest, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def run_all(loop, prompts, params, **submit) -> list[list]:
    """Submit every prompt, step the loop until it is idle; each prompt's events."""
    events = [[] for _ in prompts]
    for i, prompt in enumerate(prompts):
        loop.submit(prompt, params, events[i].append, **submit)
    while loop.step():
        pass
    return events


def engine_tokens(engine, prompt, params) -> list[int]:
    return [int(t[0]) for t in engine.tokens([prompt], params)]


# -- a real server in a subprocess ---------------------------------------------------------------

def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_ready(proc, url: str, timeout: float) -> str | None:
    """Wait until the server `proc` answers {url}/health with 200: None, or why it did not."""
    import time
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"the server exited with {proc.returncode}"
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return None
        except OSError:
            pass
        time.sleep(0.2)
    return f"the server was not ready within {timeout} s"


class Server:
    """`anatomy serve` in a subprocess on a free 127.0.0.1 port, ready (health 200) when made."""

    def __init__(self, *args: str, timeout: float = 180.0) -> None:
        import os
        import subprocess
        import sys
        import tempfile

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()
        # Threads that sleep rather than spin at OpenMP barriers: on a machine shared with other busy
        # processes, spinning torch threads slow each other down tenfold (the tests check behaviour,
        # not speed; see docs/serving.md)
        env = {"OMP_WAIT_POLICY": "PASSIVE", **os.environ}
        self.proc = subprocess.Popen([sys.executable, "-m", "anatomy", "serve", "--port", str(self.port), *args],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env)
        failure = wait_until_ready(self.proc, self.url, timeout)
        if failure is not None:
            output = self.output()
            self.close()
            raise RuntimeError(f"{failure}:\n{output}")

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def client(self, **options):
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=options.pop("api_key", "none"),
                             max_retries=options.pop("max_retries", 0), **options)

    def post(self, path: str, body: bytes | dict, headers: dict | None = None) -> tuple[int, dict]:
        """(status, JSON body) of a raw POST (any body, any status)."""
        import json
        import urllib.error
        import urllib.request

        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method="POST",
                                         headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=120) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def get(self, path: str, headers: dict | None = None) -> tuple[int, str]:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(urllib.request.Request(f"{self.url}{path}", headers=headers or {}),
                                        timeout=60) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def metric(self, name: str, **labels: str) -> float:
        """The value of one sample of /metrics."""
        import re

        _, text = self.get("/metrics")
        for line in text.splitlines():
            match = re.fullmatch(rf"{name}\{{([^}}]*)\}} (\S+)", line)
            if match and all(f'{k}="{v}"' in match.group(1) for k, v in labels.items()):
                return float(match.group(2))
        raise KeyError(f"{name} {labels} not in /metrics")

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Return once no sequence is running or waiting (a client's cut-off request is counted by then)."""
        import time

        deadline = time.monotonic() + timeout
        while self.metric("anatomy_requests_running") + self.metric("anatomy_requests_waiting") > 0:
            assert time.monotonic() < deadline, f"a sequence still runs after {timeout} s"
            time.sleep(0.05)

    def close(self) -> None:
        import subprocess

        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
