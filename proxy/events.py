"""The domain facts the proxy's metrics are made of: the one hook the core reports through.

The core, the long polls and the services around them (admission, renewal, the broker watch)
call a ``ProxyEvents`` where something happens ("a pop went to a broker", "a receive ended
empty after 0.8 s"); they know nothing of Prometheus. ``ProxyMetrics`` (proxy/metrics.py) is
the implementation that turns each fact into its metrics, declared there as data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class ProxyEvents(Protocol):
    # -- receives (the long-poll strategies and the core's receive) ----------------------------
    def receive_started(self, strategy: str) -> None:
        """A receive that may long-poll began (``strategy`` is the configured one's label)."""

    def receive_ended(self, strategy: str, result: str, seconds: float, delivered: int) -> None:
        """A receive ended after ``seconds``: 'found' (``delivered`` messages), 'empty',
        'cancelled' (its client went away) or 'error'."""

    def receive_waited_unavailable(self, strategy: str) -> None:
        """Every broker a receive could ask was unavailable: it waited instead of failing."""

    def first_pop_hit(self, strategy: str) -> None:
        """A long poll was answered by its first pop."""

    def fill_pop(self, strategy: str, result: str) -> None:
        """A receive with fewer messages than its batch popped a further broker without
        hold: 'found' messages, 'empty' or 'failed'."""

    def went_past_first_pop(self) -> None:
        """A notify long poll found nothing at once and went on to notifications."""

    def false_empty(self, strategy: str, count: int = 1) -> None:
        """Empty answers given while a broker held a visible message for the group."""

    def released(self, outcome: str, count: int = 1) -> None:
        """Popped messages not delivered (client gone) and what release did with them."""

    # -- calls to brokers ----------------------------------------------------------------------
    def broker_call(self, kind: str) -> None:
        """A call to a broker: 'pop', 'notify', 'hand_back', 'change_invisible', ..."""

    def broker_call_failed(self, kind: str, code: str) -> None: ...

    def notification_held(self, change: int) -> None:
        """A notification task began (+1) or ended (-1) waiting on a broker."""

    def broker_up(self, broker: str, up: bool | None) -> None:
        """Whether the proxy reaches a broker (group); None: it is no longer served."""

    # -- the adaptive long poll ----------------------------------------------------------------
    def adaptive_mode(self, mode: str, modes: tuple[str, ...]) -> None:
        """The adaptive long poll uses ``mode`` now (one of ``modes``)."""

    def adaptive_switched(self, mode: str) -> None: ...

    def watch_pop_rate(self, per_second: Callable[[], float]) -> None:
        """Pop requests per second, read when the metrics are read."""

    # -- admission, memory budget, streams -----------------------------------------------------
    def refused(self, reason: str) -> None:
        """Admission control refused a request (an ADMISSION_REASONS reason)."""

    def active_long_polls(self, count: int) -> None: ...

    def loop_lag(self, seconds: float) -> None: ...

    def budget_refused(self) -> None:
        """A send or receive answer refused because the memory budget was spent."""

    def watch_inflight_bytes(self, held: Callable[[], float]) -> None: ...

    def stream_stalled(self, method: str) -> None:
        """A receive or pull stream ended because its client read nothing."""

    def late_answer(self) -> None:
        """A receive's answer was finished after its client's deadline."""

    def rpc_refused(self, method: str, code: str) -> None:
        """A call refused before it reached its method (access, an undecodable body)."""

    # -- push consumers' handles and transactions ----------------------------------------------
    def renewal(self, outcome: str) -> None:
        """A PushConsumer handle renewal ended: renewed, client_gone, max_time, handle_gone,
        failed, gave_up."""

    def renewing_handles(self, count: int) -> None: ...

    def transaction_checks(self, count: int) -> None:
        """Check-backs sent to producers."""
