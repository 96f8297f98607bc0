"""How many tokens to propose next: adaptive k, and plain decoding when speculation does not pay.

A round proposing k tokens, each kept with probability a, emits E(a, k) = (1 - a^(k+1)) / (1 - a)
tokens; the policy picks the k in 0..k_max with the most tokens per second from running estimates
of a and of the target's and draft's step times (k > 0 must beat a plain step by MARGIN). When no k
pays, decoding falls back to plain steps: n-gram proposals are still scored against the emitted
tokens, a draft model probes again after 8, 16, 32, ... plain steps.
`FixedK` always proposes k (benchmarks, and tests that need the same rounds every run); `BackOff`, a
served sequence's, proposes k and waits longer and longer after rounds that keep nothing.
"""

from __future__ import annotations

import statistics
from collections import deque

PROBE_FIRST, PROBE_MAX = 8, 256
MARGIN = 0.05  # speculation must promise this much more than a plain step
WINDOW = 5  # a time is the median of its last WINDOW measurements (a loaded machine has wild outliers)


class FixedK:
    """Propose k tokens every round (fewer near the end of the generation)."""

    def __init__(self, k: int) -> None:
        self.k = k

    def next_k(self) -> int:
        return self.k

    def kept(self, tried: int, accepted: int) -> None:
        pass

    def target_time(self, rows: int, seconds: float) -> None:
        pass

    def draft_time(self, seconds: float) -> None:
        pass


class BackOff:
    """A served sequence's policy: propose k every round, but after `misses` rounds in a row that kept
    nothing, decode plainly for 1, 2, 4, ... up to `most` steps before trying again (a round that keeps
    a token resets it), so open-ended text costs few wasted verification rows."""

    def __init__(self, k: int, *, misses: int = 2, most: int = 64) -> None:
        self.k, self.limit, self.most = k, misses, most
        self.misses, self.wait, self.backoff = 0, 0, 1

    def next_k(self) -> int:
        if self.wait > 0:
            self.wait -= 1
            return 0
        return self.k

    def kept(self, tried: int, accepted: int) -> None:
        if accepted:
            self.misses, self.backoff = 0, 1
            return
        self.misses += 1
        if self.misses >= self.limit:
            self.wait, self.backoff, self.misses = self.backoff, min(2 * self.backoff, self.most), 0

    def target_time(self, rows: int, seconds: float) -> None:
        pass

    def draft_time(self, seconds: float) -> None:
        pass


class AdaptiveK:
    """The k with the most expected tokens per second, from measured acceptance and step times."""

    def __init__(self, k_max: int, *, free: bool, forget: float = 0.8) -> None:
        self.k_max, self.free, self.forget = k_max, free, forget
        self.kept_sum, self.tried_sum = 1.0, 2.0  # prior: a = 0.5, worth two tries
        self.times: dict[int, deque[float]] = {}  # rows -> the latest seconds of a target forward
        self.draft_times: deque[float] = deque(maxlen=WINDOW)
        self.plain_rounds, self.probe_after = 0, PROBE_FIRST

    @property
    def acceptance(self) -> float:
        return self.kept_sum / self.tried_sum

    def kept(self, tried: int, accepted: int) -> None:
        """A round proposed `tried` tokens and the target kept the first `accepted` of them: that is
        `accepted` successes of the acceptance coin and, if one was rejected, a failure. Each toss
        weighs `forget` times the one after it, so a (about 1 / (1 - forget) tosses long) memory."""
        for success in [1] * accepted + ([0] if accepted < tried else []):
            self.kept_sum = self.forget * self.kept_sum + success
            self.tried_sum = self.forget * self.tried_sum + 1

    def target_time(self, rows: int, seconds: float) -> None:
        self.times.setdefault(rows, deque(maxlen=WINDOW)).append(seconds)

    def draft_time(self, seconds: float) -> None:
        self.draft_times.append(seconds)

    @property
    def draft_s(self) -> float:
        return statistics.median(self.draft_times) if self.draft_times else 0.0

    def next_k(self) -> int:
        k = self.best_k()
        if k > 0:
            self.plain_rounds, self.probe_after = 0, PROBE_FIRST
            return k
        self.plain_rounds += 1
        if self.free or self.plain_rounds < self.probe_after:
            return 0  # (the decoder still scores a free proposer's guesses)
        self.plain_rounds, self.probe_after = 0, min(2 * self.probe_after, PROBE_MAX)
        return max(range(1, self.k_max + 1), key=self.rate)  # a probe: the best speculative round

    def best_k(self) -> int:
        """The fastest k, or 0 when no k beats a plain step by MARGIN (within the timing noise)."""
        k = max(range(1, self.k_max + 1), key=self.rate)
        return k if self.rate(k) > (1 + MARGIN) * self.rate(0) else 0

    def rate(self, k: int) -> float:
        """Expected tokens per second of a round proposing k tokens."""
        return expected_tokens(self.acceptance, k) / (self.forward_s(k + 1) + k * self.draft_s)

    def forward_s(self, rows: int) -> float:
        """Seconds of a target forward over `rows` rows: the median of its latest measurements once
        there are two; otherwise read off the straight line through the row counts that have them,
        a plain step (1 row) taken as no dearer than the cheapest of them, and all flat when fewer
        than two are known (decode is bound by the weight reads, which do not grow with the rows)."""
        known = {r: statistics.median(t) for r, t in self.times.items() if len(t) >= 2}
        if rows in known:
            return known[rows]
        if not known:
            return 1.0
        if rows == 1 or len(known) == 1:
            return min(known.values())
        slope, intercept = _line(known)
        return max(intercept + slope * rows, min(known.values()))


def expected_tokens(a: float, k: int) -> float:
    """Tokens a round of k proposals emits when each is kept with probability a: 1 + a + ... + a^k."""
    return float(k + 1) if a >= 1 else (1 - a ** (k + 1)) / (1 - a)


def _line(points: dict[int, float]) -> tuple[float, float]:
    """Least-squares (slope >= 0, intercept) through (x, y) points."""
    n = len(points)
    mx, my = sum(points) / n, sum(points.values()) / n
    sxx = sum((x - mx) ** 2 for x in points)
    slope = max(0.0, sum((x - mx) * (y - my) for x, y in points.items()) / sxx) if sxx else 0.0
    return slope, my - slope * mx
