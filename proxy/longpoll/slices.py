"""MNS-style slices: short polls across the brokers within a quota, then one long poll.

The poll time is cut into slices of ``slice_ms``; each slice holds a pop on the next broker in
turn, so several brokers are looked at during one client poll. After ``quota`` slices (or when
no more than one slice of time is left) the rest of the time goes to one final pop long poll.
It narrows the false-empty window, but a message that lands on a broker just after its slice
still waits, and the final long poll is bound to one broker.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from popmq.broker.contract.port import ConsumePort
from popmq.proxy.events import ProxyEvents
from popmq.proxy.longpoll.base import LongPollRequest, StrategyBase, is_broker_down
from popmq.proxy.longpoll.calls import BrokerCalls, remaining_ms
from popmq.proxy.longpoll.custody import Custody


class SlicesStrategy(StrategyBase):
    name = "slices"

    def __init__(
        self,
        calls: BrokerCalls,
        metrics: ProxyEvents,
        *,
        quota: int = 8,
        slice_ms: int = 500,
        label: str | None = None,
        probe_false_empty: bool = True,
    ) -> None:
        super().__init__(calls, metrics, label=label, probe_false_empty=probe_false_empty)
        self.quota = quota
        self.slice_ms = slice_ms

    async def _poll(
        self,
        brokers: Sequence[ConsumePort],
        request: LongPollRequest,
        deadline: float,
        custody: Custody,
    ) -> None:
        start = self.picker.start_index(brokers, request.preferred_broker)
        turn = 0
        down: set[str] = set()  # brokers that failed to answer during this receive
        while True:
            port = brokers[(start + turn) % len(brokers)]
            if port.name in down:
                turn += 1
                continue
            left = remaining_ms(deadline)
            try:
                if turn >= self.quota or left <= self.slice_ms:
                    # Quota used up or time nearly out: the last request takes all that is left.
                    await self.calls.hold_pop(port, request.pop, deadline, custody)
                    break
                await self.calls.pop(
                    port, replace(request.pop, poll_time_ms=self.slice_ms), custody
                )
            except Exception as exc:
                # A broker that is down or leaderless is skipped; if all are, the base waits
                # for one (_retrying).
                if not is_broker_down(exc):
                    raise
                down.add(port.name)
                self.calls.note_error("pop", exc, port)
                if len(down) == len(brokers):
                    raise
            if custody.count:
                break
            turn += 1
        if custody.count and turn == 0:
            self.metrics.first_pop_hit(self.label)
