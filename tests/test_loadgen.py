"""The load generator's arithmetic: percentiles as numpy computes them, TPOT, the summary."""

from __future__ import annotations

import numpy as np
import pytest

from anatomy.errors import InputError
from anatomy.loadgen import RequestResult, check_url, make_prompts, percentile, priority_mix, summarize


def test_percentile_is_numpys_linear_interpolation():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 100):
        values = sorted(rng.random(n).tolist())
        for q in (50, 90, 99):
            assert percentile(values, q) == pytest.approx(np.percentile(values, q))


def test_summary_of_requests():
    results = [RequestResult(True, output_tokens=5, prompt_tokens=3, ttft=0.1, latency=0.5, itl=[0.1] * 4),
               RequestResult(True, output_tokens=3, prompt_tokens=3, ttft=0.2, latency=0.4, itl=[0.1, 0.1]),
               RequestResult(False, "HTTP 500")]
    s = summarize(results, duration=2.0, concurrency=2, rate=None)
    assert (s.requests, s.failed, s.output_tokens, s.input_tokens) == (3, 1, 8, 6)
    assert s.output_throughput == 4.0 and s.request_throughput == 1.0 and s.total_throughput == 7.0
    assert s.tpot_ms["median"] == pytest.approx(100.0)  # (0.5 - 0.1) / 4 and (0.4 - 0.2) / 2
    assert s.ttft_ms["mean"] == pytest.approx(150.0) and s.errors == ["HTTP 500"]


def test_only_loopback_urls():
    assert check_url("http://127.0.0.1:8000/") == ("127.0.0.1", 8000, "")
    assert check_url("http://localhost:9/base") == ("localhost", 9, "/base")
    for url in ("http://10.0.0.1:8000", "https://127.0.0.1:8000", "http://127.0.0.1.example.com"):
        with pytest.raises(InputError, match="only http:// on this machine"):
            check_url(url)


def test_prompts_are_reproducible_and_distinct():
    a, b = make_prompts(5, 10, seed=3), make_prompts(5, 10, seed=3)
    assert a == b and len(set(a)) == 5 and all(len(p.split()) == 10 for p in a)


def test_a_shared_prefix_starts_every_prompt():
    plain, shared = make_prompts(4, 10, seed=2), make_prompts(4, 10, seed=2, shared_words=300)
    prefix = shared[0].split("\n\n")[0]
    assert len(prefix.split()) == 300 and all(p == f"{prefix}\n\n{q}" for p, q in zip(shared, plain))


def test_priorities_mixed_and_reported_per_priority():
    mix = priority_mix(8, 0.25, seed=1)
    assert sorted(mix) == [-1, -1] + [0] * 6 and mix == priority_mix(8, 0.25, seed=1)
    with pytest.raises(InputError, match="--priority-share"):
        priority_mix(8, 1.5)
    results = [RequestResult(True, output_tokens=2, ttft=t, latency=2 * t) for t in (0.1, 0.3, 0.2, 0.4)]
    s = summarize(results, duration=1.0, concurrency=4, rate=None, groups=[-1, 0, -1, 0])
    assert s.by_group[-1]["ttft_ms"]["median"] == pytest.approx(150.0)
    assert s.by_group[0]["e2el_ms"]["median"] == pytest.approx(700.0) and s.by_group[0]["requests"] == 2
    assert "priority -1 (2 requests)" in s.report()
    assert summarize(results, duration=1.0, concurrency=4, rate=None).by_group == {}
