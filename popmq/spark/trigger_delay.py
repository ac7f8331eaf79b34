"""minOffsetsPerTrigger / maxTriggerDelay, as in Spark's Kafka source: a micro-batch waits until
at least N new messages are there, unless the last batch was maxTriggerDelay ago.

The state (when the last batch was let through) lives in the driver's stream reader, so it
starts afresh when a query restarts (the Kafka source does the same).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from popmq.spark.options import ReadOptions

K = TypeVar("K", bound=Hashable)

DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60_000  # Kafka's "15m"


@dataclass
class MinTrigger:
    min_messages: int
    max_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    clock: Callable[[], float] = time.monotonic
    _last_s: float | None = None

    def hold(self, begin: Mapping[K, int], latest: Mapping[K, int]) -> bool:
        """True: skip this trigger (too few new messages, and the delay has not run out)."""
        now = self.clock()
        if self._last_s is None or (now - self._last_s) * 1000 >= self.max_delay_ms:
            self._last_s = now
            return False
        new = sum(max(end - begin.get(key, 0), 0) for key, end in latest.items())
        if new < self.min_messages:
            return True
        self._last_s = now
        return False


def min_trigger(options: ReadOptions) -> MinTrigger | None:
    if options.min_messages_per_trigger is None:
        return None
    delay = options.max_trigger_delay_ms
    return MinTrigger(options.min_messages_per_trigger, delay or DEFAULT_MAX_TRIGGER_DELAY_MS)
