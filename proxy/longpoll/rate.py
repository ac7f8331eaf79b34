"""Requests per second over a sliding window, in fixed buckets (constant memory at any rate)."""

from __future__ import annotations

from popmq.clock import SYSTEM, Clock


class SlidingRate:
    """Counts events in ``buckets`` slots covering ``window_s``.

    Until a whole window has passed since the first event, the rate is taken over the time
    elapsed so far (but at least ``warmup_s``, a tenth of the window by default), so a proxy
    that starts busy is recognised as busy within about ``warmup_s``, not a whole window.
    """

    def __init__(
        self,
        window_s: float,
        buckets: int = 20,
        clock: Clock = SYSTEM,
        warmup_s: float | None = None,
    ) -> None:
        self.window_s = window_s
        self.warmup_s = min(window_s, warmup_s if warmup_s is not None else window_s / 10)
        self._width = window_s / buckets
        self._counts = [0] * buckets
        self._stamps = [-1] * buckets  # which bucket number each slot currently counts
        self._clock = clock.monotonic  # read on every receive: the bound method, once
        self._first: float | None = None

    def _bucket(self, now: float) -> int:
        return int(now / self._width)

    def add(self, count: int = 1) -> None:
        now = self._clock()
        if self._first is None:
            self._first = now
        bucket = self._bucket(now)
        slot = bucket % len(self._counts)
        if self._stamps[slot] != bucket:
            self._stamps[slot] = bucket
            self._counts[slot] = 0
        self._counts[slot] += count

    def per_second(self) -> float:
        now = self._clock()
        bucket = self._bucket(now)
        size = len(self._counts)
        total = sum(
            count
            for count, stamp in zip(self._counts, self._stamps, strict=True)
            if bucket - stamp < size
        )
        if self._first is None:
            return 0.0
        span = min(self.window_s, max(now - self._first, self.warmup_s))
        return total / span
