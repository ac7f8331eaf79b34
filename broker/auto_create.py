"""Auto-creation on first use, bounded: switchable off, a total cap and a rate.

A client that asks for thousands of new topic or group names must not make the broker create
thousands of queues (descriptors, disk, memory). RocketMQ switches auto-creation with
autoCreateTopicEnable / autoCreateSubscriptionGroup; popmq also caps the total and the rate
(a token bucket whose burst equals one second's worth), and answers a refusal with the
not-found code a disabled auto-creation would give, saying why.
"""

from __future__ import annotations

from collections.abc import Callable

from popmq.broker.contract.errors import Code, RefusedError

from popmq.clock import SYSTEM

_NOT_FOUND = {"topic": Code.TOPIC_NOT_FOUND, "group": Code.CONSUMER_GROUP_NOT_FOUND}
_SETTING = {"topic": "broker.topics", "group": "broker.groups"}


class AutoCreateGate:
    def __init__(
        self,
        kind: str,
        enabled: bool,
        max_total: int,
        per_second: float,
        on_refused: Callable[[str, str], None] | None = None,
        clock: Callable[[], float] = SYSTEM.monotonic,
    ) -> None:
        self._kind = kind
        self._enabled = enabled
        self._max_total = max_total
        self._rate = per_second
        self._burst = max(per_second, 1.0)
        self._tokens = self._burst
        self._clock = clock
        self._last = clock()
        self._on_refused = on_refused

    def admit(self, name: str, existing: int) -> None:
        """Allow creating ``name`` when ``existing`` are already there, or raise the
        not-found RefusedError that tells the client why it was not created."""
        setting = _SETTING[self._kind]
        if not self._enabled:
            self._refuse(name, "disabled", f"auto-creation is off ({setting}.auto_create)")
        if existing >= self._max_total:
            self._refuse(name, "total", f"the broker holds {existing} {self._kind}s, the "
                         f"auto-creation limit ({setting}.max_auto_created)")  # fmt: skip
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._last) * self._rate)
        self._last = now
        if self._tokens < 1:
            self._refuse(name, "rate", f"more than {self._rate:g} {self._kind}s auto-created "
                         f"per second ({setting}.auto_create_per_second); retry later")  # fmt: skip
        self._tokens -= 1

    def _refuse(self, name: str, reason: str, why: str) -> None:
        if self._on_refused is not None:
            self._on_refused(self._kind, reason)
        text = f"{self._kind} {name!r} does not exist and was not created: {why}"
        raise RefusedError(_NOT_FOUND[self._kind], text)
