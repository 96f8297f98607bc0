"""The server's metrics in the Prometheus text format (`GET /metrics`), with vLLM's meanings.

Counters and histograms are updated by the serving loop's thread and read by the HTTP thread, under
one lock. Gauges (running/waiting, KV blocks, prefix-cache hit rate) are read from the scheduler and
the block manager when scraped. Every metric and its meaning: docs/serving.md, "Metrics".
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import Counter, deque
from collections.abc import Callable

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0)
RATE_WINDOW_S = 10.0


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one: above every bucket (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value

    def lines(self, name: str, labels: str) -> list[str]:
        out, total = [], 0
        for bound, count in zip((*self.buckets, float("inf")), self.counts):
            total += count
            le = "+Inf" if bound == float("inf") else repr(bound)
            out.append(f'{name}_bucket{{{labels},le="{le}"}} {total}')
        return out + [f"{name}_sum{{{labels}}} {self.sum}", f"{name}_count{{{labels}}} {total}"]


class ServingMetrics:
    """What the serving loop records; `render(gauges)` writes it all out."""

    def __init__(self, model: str) -> None:
        self.labels = f'model_name="{_escape(model)}"'
        self.lock = threading.Lock()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished: Counter[str] = Counter()
        self.draft_tokens = self.accepted_tokens = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self._recent: deque[tuple[float, int, int]] = deque()  # (time, prompt tokens, generated tokens)

    def step(self, prompt_tokens: int, generated: int) -> None:
        now = time.perf_counter()
        with self.lock:
            self.prompt_tokens += prompt_tokens
            self.generation_tokens += generated
            self._recent.append((now, prompt_tokens, generated))
            while self._recent and self._recent[0][0] < now - RATE_WINDOW_S:
                self._recent.popleft()

    def speculated(self, proposed: int, accepted: int) -> None:
        with self.lock:
            self.draft_tokens += proposed
            self.accepted_tokens += accepted

    def token(self, *, first: bool, latency: float) -> None:
        with self.lock:
            (self.ttft if first else self.itl).observe(latency)

    def finish(self, reason: str, e2e: float | None) -> None:
        with self.lock:
            self.finished[reason] += 1
            if e2e is not None:
                self.e2e.observe(e2e)

    def median_latency(self) -> float | None:
        """The upper bound of the e2e-latency bucket that holds the median request (None before any)."""
        with self.lock:
            counts, total = self.e2e.counts, sum(self.e2e.counts)
        if not total:
            return None
        seen = 0
        for bound, count in zip((*E2E_BUCKETS, float("inf")), counts):
            seen += count
            if seen * 2 >= total:
                return bound if bound != float("inf") else E2E_BUCKETS[-1]
        return None

    def rates(self) -> tuple[float, float]:
        """(prompt tokens/s, generated tokens/s) over the last RATE_WINDOW_S seconds."""
        now = time.perf_counter()
        with self.lock:
            recent = [r for r in self._recent if r[0] >= now - RATE_WINDOW_S]
        return (sum(r[1] for r in recent) / RATE_WINDOW_S, sum(r[2] for r in recent) / RATE_WINDOW_S)

    def render(self, gauges: Callable[[], dict[str, tuple[str, float]]]) -> str:
        """The Prometheus text exposition: `gauges()` gives name -> (help, value) read at scrape time."""
        prompt_rate, generation_rate = self.rates()
        values = dict(gauges())
        values["prompt_tokens_per_second"] = ("Prompt tokens computed per second (last 10 s)", prompt_rate)
        values["generation_tokens_per_second"] = ("Tokens generated per second (last 10 s)", generation_rate)
        lines: list[str] = []
        for name, (help_text, value) in values.items():
            kind = "counter" if name.endswith("_total") else "gauge"
            lines += [f"# HELP anatomy_{name} {help_text}", f"# TYPE anatomy_{name} {kind}",
                      f"anatomy_{name}{{{self.labels}}} {_number(value)}"]
        with self.lock:
            lines += self._counter("prompt_tokens_total", "Prompt tokens computed", self.prompt_tokens)
            lines += self._counter("generation_tokens_total", "Tokens generated", self.generation_tokens)
            lines += self._counter("spec_decode_num_draft_tokens_total", "Speculative tokens proposed and verified",
                                   self.draft_tokens)
            lines += self._counter("spec_decode_num_accepted_tokens_total", "Speculative tokens kept",
                                   self.accepted_tokens)
            lines += ["# HELP anatomy_requests_finished_total Sequences finished, by reason",
                      "# TYPE anatomy_requests_finished_total counter"]
            for reason in ("stop", "length", "abort", "error"):
                lines.append(f'anatomy_requests_finished_total{{{self.labels},reason="{reason}"}} '
                             f"{self.finished[reason]}")
            for name, help_text, hist in (
                    ("time_to_first_token_seconds", "Time from arrival to the first token", self.ttft),
                    ("inter_token_latency_seconds", "Time between consecutive tokens of a sequence", self.itl),
                    ("e2e_request_latency_seconds", "Time from arrival to the last token", self.e2e)):
                lines += [f"# HELP anatomy_{name} {help_text}", f"# TYPE anatomy_{name} histogram"]
                lines += hist.lines(f"anatomy_{name}", self.labels)
        return "\n".join(lines) + "\n"

    def _counter(self, name: str, help_text: str, value: float) -> list[str]:
        return [f"# HELP anatomy_{name} {help_text}", f"# TYPE anatomy_{name} counter",
                f"anatomy_{name}{{{self.labels}}} {_number(value)}"]


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _escape(label: str) -> str:
    return label.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
