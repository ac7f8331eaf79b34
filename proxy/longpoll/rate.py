"""Requests per second over a sliding window, in fixed buckets (constant memory at any rate)."""

from __future__ import annotations

import time
from collections.abc import Callable


class SlidingRate:
    def __init__(
        self, window_s: float, buckets: int = 20, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.window_s = window_s
        self._width = window_s / buckets
        self._counts = [0] * buckets
        self._stamps = [-1] * buckets  # which bucket number each slot currently counts
        self._clock = clock

    def _bucket(self) -> int:
        return int(self._clock() / self._width)

    def add(self, count: int = 1) -> None:
        bucket = self._bucket()
        slot = bucket % len(self._counts)
        if self._stamps[slot] != bucket:
            self._stamps[slot] = bucket
            self._counts[slot] = 0
        self._counts[slot] += count

    def per_second(self) -> float:
        bucket = self._bucket()
        size = len(self._counts)
        total = sum(
            count
            for count, stamp in zip(self._counts, self._stamps, strict=True)
            if bucket - stamp < size
        )
        return total / self.window_s
