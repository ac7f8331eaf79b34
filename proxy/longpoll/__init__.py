"""Long-polling strategies for the proxy's ReceiveMessage (see docs/longpolling.md).

``make_strategy`` builds the one the config names: ``pop`` (baseline), ``slices`` (MNS-style),
``notify`` (pop with notify, article 001) or ``adaptive`` (notify when quiet, pop when busy).
"""

from __future__ import annotations

from popmq.proxy.events import ProxyEvents
from popmq.proxy.longpoll.adaptive import AdaptiveStrategy
from popmq.proxy.longpoll.base import LongPollRequest, LongPollStrategy
from popmq.proxy.longpoll.calls import BrokerCalls
from popmq.proxy.longpoll.notify import NotifyStrategy
from popmq.proxy.longpoll.pop import PopStrategy
from popmq.proxy.longpoll.slices import SlicesStrategy

from popmq.config import ProxyConfig

__all__ = [
    "AdaptiveStrategy",
    "LongPollRequest",
    "LongPollStrategy",
    "NotifyStrategy",
    "PopStrategy",
    "SlicesStrategy",
    "make_strategy",
]


def make_strategy(config: ProxyConfig, metrics: ProxyEvents) -> LongPollStrategy:
    calls = BrokerCalls(metrics, fallback_invisible_ms=config.min_invisible_ms)
    probe = config.false_empty_probe
    turns, max_ms = config.fill_window_turns, config.fill_window_ms  # notify's fill window
    if config.strategy == "pop":
        return PopStrategy(calls, metrics, probe_false_empty=probe)
    if config.strategy == "slices":
        return SlicesStrategy(
            calls, metrics, quota=config.slices_quota, slice_ms=config.slice_ms,
            probe_false_empty=probe,
        )  # fmt: skip
    if config.strategy == "notify":
        return NotifyStrategy(
            calls, metrics, probe_false_empty=probe, fill_turns=turns, fill_max_ms=max_ms
        )
    return AdaptiveStrategy(
        calls, metrics, threshold_rps=config.notify_threshold_rps,
        window_s=config.notify_window_s, hysteresis=config.notify_hysteresis,
        probe_false_empty=probe, fill_turns=turns, fill_max_ms=max_ms,
    )  # fmt: skip
