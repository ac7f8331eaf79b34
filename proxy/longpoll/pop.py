"""The baseline: one client long poll is one pop long poll on one broker.

This is what the open-source RocketMQ proxy does. The broker is the one of the client's
message queue (else round robin); a message on any other broker waits for a later poll, which
is the false empty response the other strategies remove.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from popmq.broker.contract.port import ConsumePort
from popmq.proxy.longpoll.base import LongPollRequest, StrategyBase, is_broker_down
from popmq.proxy.longpoll.custody import Custody


class PopStrategy(StrategyBase):
    name = "pop"

    async def _poll(
        self,
        brokers: Sequence[ConsumePort],
        request: LongPollRequest,
        deadline: float,
        custody: Custody,
    ) -> None:
        start = self.picker.start_index(brokers, request.preferred_broker)
        for turn in range(len(brokers)):
            port = brokers[(start + turn) % len(brokers)]
            try:
                if request.poll_ms <= 0:
                    await self.calls.pop(port, replace(request.pop, poll_time_ms=0), custody)
                else:
                    await self.calls.hold_pop(port, request.pop, deadline, custody)
                break
            except Exception as exc:
                # A broker that is down or leaderless: the next one serves this receive (if
                # none can, the base waits for one: _retrying).
                if not is_broker_down(exc):
                    raise
                self.calls.note_error("pop", exc, port)
                if turn == len(brokers) - 1:
                    raise
        if custody.count:
            self.metrics.first_pop_hit(self.label)
