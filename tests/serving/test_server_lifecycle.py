"""`anatomy serve` under overload and at shutdown (each test its own server; loopback only):
past --max-queue a request gets 429 with Retry-After and the server keeps serving; on SIGTERM new
requests get 503, a request in flight that finishes within --shutdown-timeout finishes, a stream
still running at the deadline ends with an error event and [DONE], and the server exits 0; SIGINT
does the same without a traceback from the serving loop's thread."""

from __future__ import annotations

import http.client
import json
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest

from .conftest import Server

MODEL = "smollm2-135m-instruct"
LONG = {"model": MODEL, "messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 1000,
        "ignore_eos": True, "temperature": 0}
pytestmark = pytest.mark.slow


@contextmanager
def start(*args: str) -> Iterator[Server]:
    server = Server("--weights", "f32", "--kv-memory", "64MiB", "--embedding-model", "none", *args)
    try:
        yield server
    finally:
        server.close()


def raw_post(server: Server, body: dict, *, timeout: float = 60) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    connection.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()


class Stream(threading.Thread):
    """A streamed request read line by line in the background; `first` is set at its first chunk."""

    def __init__(self, server: Server, body: dict) -> None:
        super().__init__(daemon=True)
        self.server, self.body, self.lines = server, {**body, "stream": True}, []
        self.first = threading.Event()
        self.start()

    def run(self) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=120)
        connection.request("POST", "/v1/chat/completions", json.dumps(self.body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        for line in response:
            if line.strip():
                self.lines.append(line.decode().strip())
                self.first.set()


def exits(server: Server, sig: int, seconds: float = 60) -> int:
    server.proc.send_signal(sig)
    return server.proc.wait(seconds)


def test_overload_gets_429_with_retry_after_and_the_server_keeps_serving():
    with start("--batch-size", "1", "--max-queue", "0") as server:
        body = {**LONG, "max_tokens": 60}
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: raw_post(server, body), range(4)))
        statuses = sorted(status for status, _, _ in answers)
        assert statuses[0] == 200 and 429 in statuses, statuses
        for status, headers, payload in answers:
            if status == 429:
                error = json.loads(payload)["error"]
                assert error["code"] == "too_many_requests" and int(headers["retry-after"]) >= 1
        assert raw_post(server, {**body, "max_tokens": 2})[0] == 200, "served again once the queue drained"


def test_sigterm_drains_then_ends_the_streams_still_running():
    with start("--shutdown-timeout", "3") as server:
        long = Stream(server, LONG)
        short = Stream(server, {**LONG, "max_tokens": 12})
        assert long.first.wait(60) and short.first.wait(60)
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        status, _, payload = raw_post(server, {**LONG, "max_tokens": 2}, timeout=10)
        assert status == 503 and json.loads(payload)["error"]["code"] == "shutting_down"
        assert server.proc.wait(60) == 0
        long.join(10)
        short.join(10)
        assert short.lines[-1] == "data: [DONE]" and '"finish_reason":"length"' in short.lines[-2], \
            "a request that finished within the deadline finished"
        assert long.lines[-1] == "data: [DONE]" and json.loads(long.lines[-2][6:])["error"]["code"] == "shutting_down"
        assert "Traceback" not in server.output()


def test_sigint_exits_without_tracebacks():
    with start("--shutdown-timeout", "1") as server:
        stream = Stream(server, LONG)
        assert stream.first.wait(60)
        assert exits(server, signal.SIGINT) == 0
        stream.join(10)
        assert stream.lines[-1] == "data: [DONE]"
        log = server.output()
        assert "Event loop is closed" not in log and "Traceback" not in log, log
