"""The hold table with metrics: held long polls and polling-full refusals, by kind.

Only requests that actually wait pass through here (an empty pop, pull or notify with a poll
time), so the cost is two gauge updates per hold, nothing per message.
"""

from __future__ import annotations

from collections.abc import Iterable

from popmq.broker.metrics import BrokerMetrics
from popmq.broker.pop.hold import HoldKey, HoldOutcome, HoldTable


class MeteredHoldTable(HoldTable):
    def __init__(self, max_per_key: int, max_total: int, metrics: BrokerMetrics) -> None:
        super().__init__(max_per_key, max_total)
        self._metrics = metrics
        metrics.held_limit.set(max_total)

    async def wait(
        self,
        keys: Iterable[HoldKey],
        timeout_ms: int,
        tags: frozenset[str] | None = None,
        min_offset: int = -1,
        broadcast: bool = False,
    ) -> HoldOutcome:
        # The kinds differ in how they hold: pull waits past an offset, notify only looks
        # (broadcast), pop takes turns.
        kind = "pull" if min_offset >= 0 else "notify" if broadcast else "pop"
        held = self._metrics.held[kind]
        held.inc()
        try:
            outcome = await super().wait(keys, timeout_ms, tags, min_offset, broadcast)
        finally:
            held.dec()
        if outcome is HoldOutcome.FULL:
            self._metrics.polling_full[kind].inc()
        return outcome
