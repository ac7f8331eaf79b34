"""Adaptive: pop with notify while requests are few, plain pop long polling when busy.

The signal is the rate of receive calls (pop requests) this proxy sees over a sliding window,
as article 001 describes. Many requests mean many waiting clients, which already cover every
broker, so notifications would only add broker calls. To avoid flapping, the switch to ``pop``
happens at ``threshold`` requests/s and the switch back only below
``threshold * (1 - hysteresis)``. Each proxy decides on its own traffic alone.
"""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from typing import Any, Literal

from popmq.broker.contract.port import ConsumePort
from popmq.broker.contract.types import PoppedMessage
from popmq.proxy.events import ProxyEvents
from popmq.proxy.longpoll.base import LongPollRequest
from popmq.proxy.longpoll.calls import BrokerCalls
from popmq.proxy.longpoll.notify import FILL_MAX_MS, FILL_TURNS, NotifyStrategy
from popmq.proxy.longpoll.pop import PopStrategy
from popmq.proxy.longpoll.rate import SlidingRate

from popmq.clock import SYSTEM, Clock

Mode = Literal["notify", "pop"]


class AdaptiveStrategy:
    name = "adaptive"

    def __init__(
        self,
        calls: BrokerCalls,
        metrics: ProxyEvents,
        *,
        threshold_rps: float = 100.0,
        window_s: float = 10.0,
        hysteresis: float = 0.2,
        probe_false_empty: bool = True,
        clock: Clock = SYSTEM,
        warmup_s: float | None = None,
        fill_turns: int = FILL_TURNS,
        fill_max_ms: float = FILL_MAX_MS,
    ) -> None:
        self.calls = calls
        self.metrics = metrics
        self.threshold_rps = threshold_rps
        self.low_rps = threshold_rps * (1 - hysteresis)
        self.rate = SlidingRate(window_s, clock=clock, warmup_s=warmup_s)
        probe = probe_false_empty
        self._strategies = {
            "notify": NotifyStrategy(
                calls,
                metrics,
                label=self.name,
                probe_false_empty=probe,
                fill_turns=fill_turns,
                fill_max_ms=fill_max_ms,
            ),
            "pop": PopStrategy(calls, metrics, label=self.name, probe_false_empty=probe),
        }
        self.mode: Mode = "notify"
        metrics.watch_pop_rate(self.rate.per_second)
        self._show_mode()

    def _show_mode(self) -> None:
        self.metrics.adaptive_mode(self.mode, ("notify", "pop"))

    def decide(self) -> Mode:
        """Count one request and return the mode it runs in."""
        self.rate.add()
        rps = self.rate.per_second()
        if self.mode == "notify" and rps >= self.threshold_rps:
            self._switch("pop")
        elif self.mode == "pop" and rps < self.low_rps:
            self._switch("notify")
        return self.mode

    def _switch(self, mode: Mode) -> None:
        self.mode = mode
        self.metrics.adaptive_switched(mode)
        self._show_mode()

    def receive(
        self, brokers: Sequence[ConsumePort], request: LongPollRequest
    ) -> Coroutine[Any, Any, list[PoppedMessage]]:
        # The chosen strategy's coroutine itself: no frame of ours held per idle long poll.
        return self._strategies[self.decide()].receive(brokers, request)

    def drain(self) -> None:
        for strategy in self._strategies.values():
            strategy.drain()

    async def aclose(self) -> None:
        # Each closes what it owns (notify: its notification hub), then the shared calls.
        for strategy in self._strategies.values():
            await strategy.aclose()
