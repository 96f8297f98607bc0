"""A load generator for OpenAI-compatible servers, reporting what vLLM's serving benchmark reports.

Streamed requests (EOS ignored: each generates `max_tokens`), all at once behind a concurrency or
Poisson arrivals; optionally one long shared prefix before every prompt, or a share of requests with a
better `priority`. Per request TTFT, ITL, TPOT and end-to-end latency; in all, request and token
throughput and the mean, median and p99 of each latency (docs/serving.md, `anatomy bench-serve`).
Loopback only and a bounded number of requests: a benchmark, not a load test of someone else's
machine. Plain `http.client` in threads: the same client measures every server.
"""

from __future__ import annotations

import http.client
import json
import random
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

from anatomy import progress
from anatomy.errors import InputError

LOOPBACK = ("127.0.0.1", "localhost", "::1")
MAX_REQUESTS, MAX_CONCURRENCY = 10_000, 512
WORDS = ("time year people way day man thing woman life child world school state family student group country "
         "problem hand part place case week company system program question work government number night point "
         "home water room mother area money story fact month lot right study book eye job word business issue "
         "side kind head house service friend father power hour game line end member law car city community name "
         "president team minute idea kid body information back parent face others level office door health person "
         "art war history party result change morning reason research girl guy moment air teacher force "
         "education").split()


@dataclass
class RequestResult:
    ok: bool
    error: str | None = None
    output_tokens: int = 0
    prompt_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    text: str = ""

    @property
    def tpot(self) -> float | None:
        return (self.latency - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else None


@dataclass
class BenchResult:
    requests: int
    failed: int
    concurrency: int
    rate: float | None
    duration_s: float
    input_tokens: int
    output_tokens: int
    request_throughput: float
    output_throughput: float
    total_throughput: float
    ttft_ms: dict[str, float]
    tpot_ms: dict[str, float]
    itl_ms: dict[str, float]
    e2el_ms: dict[str, float]
    errors: list[str]
    by_group: dict[int, dict[str, Any]] = field(default_factory=dict)  # a request label (its priority) -> figures

    def report(self) -> str:
        lines = [f"{'Successful requests:':<40}{self.requests - self.failed}",
                 f"{'Failed requests:':<40}{self.failed}",
                 f"{'Concurrency / request rate:':<40}{self.concurrency} / "
                 f"{'all at once' if self.rate is None else f'{self.rate:g} req/s (Poisson)'}",
                 f"{'Benchmark duration (s):':<40}{self.duration_s:.2f}",
                 f"{'Total input tokens:':<40}{self.input_tokens}",
                 f"{'Total generated tokens:':<40}{self.output_tokens}",
                 f"{'Request throughput (req/s):':<40}{self.request_throughput:.2f}",
                 f"{'Output token throughput (tok/s):':<40}{self.output_throughput:.2f}",
                 f"{'Total token throughput (tok/s):':<40}{self.total_throughput:.2f}"]
        for title, short, stats in (("Time to First Token", "TTFT", self.ttft_ms),
                                    ("Time per Output Token (excl. 1st token)", "TPOT", self.tpot_ms),
                                    ("Inter-token Latency", "ITL", self.itl_ms),
                                    ("End-to-end Latency", "E2EL", self.e2el_ms)):
            lines.append(f"{title:-^50}")
            lines += [f"{f'{kind.capitalize()} {short} (ms):':<40}{stats[kind]:.2f}" for kind in ("mean", "median", "p99")]
        for group, figures in sorted(self.by_group.items()):
            title = f" priority {group} ({figures['requests']} requests) "
            lines.append(f"{title:-^50}")
            lines += [f"{f'{kind.capitalize()} {short} (ms):':<40}{figures[key][kind]:.2f}"
                      for short, key in (("TTFT", "ttft_ms"), ("E2EL", "e2el_ms")) for kind in ("median", "p99")]
        lines += [f"error: {e}" for e in self.errors[:5]]
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def make_prompts(n: int, words: int, *, seed: int = 0, shared_words: int = 0) -> list[str]:
    """n different prompts of `words` ordinary English words each (the same for every server), each
    after the same `shared_words`-word prefix when asked (one long system prompt, many users)."""
    rng = random.Random(seed)
    shared = " ".join(random.Random(seed + 1).choice(WORDS) for _ in range(shared_words))
    prompts = [" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(n)]
    return [f"{shared}\n\n{p}" for p in prompts] if shared_words else prompts


def priority_mix(n: int, share: float, *, priority: int = -1, seed: int = 0) -> list[int]:
    """The priorities of n requests: `share` of them (spread at random) get `priority`, the rest 0."""
    if not 0 <= share <= 1:
        raise InputError(f"--priority-share must be in [0, 1], got {share}")
    chosen = set(random.Random(seed).sample(range(n), round(n * share)))
    return [priority if i in chosen else 0 for i in range(n)]


def check_url(url: str) -> tuple[str, int, str]:
    """(host, port, path prefix) of a loopback http:// URL."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname not in LOOPBACK:
        raise InputError(f"--url {url!r}: only http:// on this machine ({', '.join(LOOPBACK)}) can be benchmarked")
    try:
        port = parts.port or 80
    except ValueError:
        raise InputError(f"--url {url!r}: the port is not a number") from None
    return parts.hostname, port, parts.path.rstrip("/")


def run_benchmark(url: str, *, model: str, prompts: list[str], max_tokens: int, concurrency: int,
                  rate: float | None = None, chat: bool = False, api_key: str | None = None,
                  extra: dict[str, Any] | None = None, seed: int = 0, timeout: float = 600.0,
                  fields: list[dict[str, Any]] | None = None, groups: list[Any] | None = None) -> BenchResult:
    """Send every prompt once (streamed) and measure; see the module docstring. `fields`: each
    request's own body fields (its `priority`, its `model`: a LoRA adapter's name); `groups`: a label
    per request (its priority class), the figures then per label too."""
    host, port, prefix = check_url(url)
    if not 1 <= len(prompts) <= MAX_REQUESTS:
        raise InputError(f"the number of requests must be in [1, {MAX_REQUESTS}], got {len(prompts)}")
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise InputError(f"--concurrency must be in [1, {MAX_CONCURRENCY}], got {concurrency}")
    if rate is not None and not rate > 0:
        raise InputError(f"--rate must be > 0 requests/s, got {rate}")
    for name, labels in (("fields", fields), ("groups", groups)):
        if labels is not None and len(labels) != len(prompts):
            raise InputError(f"{len(labels)} {name} for {len(prompts)} prompts")
    path = f"{prefix}/v1/chat/completions" if chat else f"{prefix}/v1/completions"
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"

    def one(i: int) -> RequestResult:
        body = {"model": model, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
                "stream_options": {"include_usage": True}, **(extra or {})}
        body.update({"messages": [{"role": "user", "content": prompts[i]}]} if chat else {"prompt": prompts[i]})
        body.update(fields[i] if fields is not None else {})
        return stream_request(host, port, path, json.dumps(body).encode(), headers, chat=chat, timeout=timeout)

    gaps = random.Random(seed)
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool, \
            progress.task("requests", total=len(prompts)) as bar:
        slots = threading.Semaphore(concurrency)
        futures = []
        for i in range(len(prompts)):
            if rate is not None and i:
                time.sleep(gaps.expovariate(rate))
            slots.acquire()
            future = pool.submit(one, i)
            future.add_done_callback(lambda _: (slots.release(), bar.advance()))
            futures.append(future)
        results = [f.result() for f in futures]
    return summarize(results, duration=time.perf_counter() - start, concurrency=concurrency, rate=rate,
                     groups=groups)


def stream_request(host: str, port: int, path: str, body: bytes, headers: dict[str, str], *, chat: bool,
                   timeout: float) -> RequestResult:
    """POST one streamed request and time its chunks."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    sent = time.perf_counter()
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        if response.status != 200:
            return RequestResult(False, f"HTTP {response.status}: {response.read()[:200]!r}")
        return _read_events(response, sent, chat=chat)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return RequestResult(False, f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()


def _read_events(response: http.client.HTTPResponse, sent: float, *, chat: bool) -> RequestResult:
    result = RequestResult(True)
    chunks, last, usage, pieces = 0, sent, None, []
    for raw in response:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        event = json.loads(data)
        if "error" in event:
            return RequestResult(False, f"error event: {event['error']}")
        usage = event.get("usage") or usage
        for choice in event.get("choices") or []:
            text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
            if not text:
                continue
            now = time.perf_counter()
            if chunks == 0:
                result.ttft = now - sent
            else:
                result.itl.append(now - last)
            last, chunks = now, chunks + 1
            pieces.append(text)
    result.latency = time.perf_counter() - sent
    result.text = "".join(pieces)
    result.output_tokens = usage["completion_tokens"] if usage else chunks
    result.prompt_tokens = usage["prompt_tokens"] if usage else 0
    if chunks == 0:
        return RequestResult(False, "no content arrived")
    return result


def summarize(results: list[RequestResult], *, duration: float, concurrency: int, rate: float | None,
              groups: list[int] | None = None) -> BenchResult:
    good = [r for r in results if r.ok]
    by_group = {}
    for group in sorted(set(groups)) if groups is not None and len(set(groups)) > 1 else []:
        mine = [r for r, g in zip(results, groups) if g == group and r.ok]
        by_group[group] = {"requests": len(mine), "ttft_ms": _stats([r.ttft for r in mine]),
                           "e2el_ms": _stats([r.latency for r in mine])}
    output = sum(r.output_tokens for r in good)
    prompt = sum(r.prompt_tokens for r in good)
    return BenchResult(
        requests=len(results), failed=len(results) - len(good), concurrency=concurrency, rate=rate,
        duration_s=duration, input_tokens=prompt, output_tokens=output,
        request_throughput=len(good) / duration, output_throughput=output / duration,
        total_throughput=(output + prompt) / duration,
        ttft_ms=_stats([r.ttft for r in good]), tpot_ms=_stats([r.tpot for r in good if r.tpot is not None]),
        itl_ms=_stats([gap for r in good for gap in r.itl]), e2el_ms=_stats([r.latency for r in good]),
        errors=[r.error for r in results if not r.ok], by_group=by_group)


def _stats(seconds: list[float]) -> dict[str, float]:
    if not seconds:
        return {"mean": 0.0, "median": 0.0, "p99": 0.0}
    ms = sorted(s * 1e3 for s in seconds)
    return {"mean": statistics.fmean(ms), "median": statistics.median(ms), "p99": percentile(ms, 99)}


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    k = (len(sorted_values) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)
