"""The proxy's Prometheus metrics (names are stable; docs/operations.md explains each one).

Every metric is declared once, as data (PROXY_METRICS), and built from that table at start-up.
Two seams record them: the servicer's one wrapper per RPC method (RpcMeter: RPC_METRICS) and
ProxyEvents (proxy/events.py), the hook the protocol-free core calls with domain facts, which
ProxyMetrics implements. (The access guard's two, ACCESS metrics below, are declared here too and
built and recorded by the guard, which exists only with an ACL.)

Each proxy instance owns one ``ProxyMetrics`` with its own registry, so several proxies in one
process (tests, benchmarks) do not mix their counts.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from popmq.broker.contract.errors import Code
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from popmq.clock import SYSTEM
from popmq.metric_specs import MetricSpec, build_all, spec

_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30,
)  # fmt: skip


ADMISSION_REASONS = (
    "long_polls_total", "long_polls_per_client", "long_polls_per_group",
    "overloaded", "batch_size", "body_size", "send_messages",
    "clients_per_access_key", "streams_per_access_key",
)  # fmt: skip
# rocketmq_rpc_latency is in milliseconds with RocketMQ's own buckets (its remoting layer's
# set; the documented 1, 3, 5, 10, 100 ms, 1 s, 3 s are all among them).
RPC_LATENCY_MS_BUCKETS = (1, 3, 5, 7, 10, 100, 1000, 2000, 3000)


# Every metric of a proxy, in the order /metrics lists them. docs/operations.md explains each;
# dashboards and alerts (helm/, deploy/) read these names: never rename one.
ROCKETMQ_RPC_LATENCY = spec(
    Histogram, "rocketmq_rpc_latency", "Client RPC latency in milliseconds (RocketMQ's metric)",
    "cluster", "node_type", "node_id", "protocol_type", "request_code", "response_code",
    buckets=RPC_LATENCY_MS_BUCKETS,
)  # fmt: skip
BROKER_UP = spec(
    Gauge, "popmq_proxy_broker_up",
    "1 while the proxy reaches the broker, 0 while it cannot (checked every few seconds)",
    "broker",
)  # fmt: skip
RPC_REQUESTS = spec(
    Counter, "popmq_proxy_rpc_requests", "Client RPCs by method and result code", "method", "code"
)
RPC_DURATION = spec(
    Histogram, "popmq_proxy_rpc_duration_seconds", "Client RPC latency by method", "method",
    buckets=_LATENCY_BUCKETS,
)  # fmt: skip
LONG_POLLS = spec(
    Counter, "popmq_proxy_long_polls", "Client receive calls that may long-poll (is_long_polling)",
    "strategy",
)  # fmt: skip
POP_WITH_NOTIFY = spec(
    Counter, "popmq_proxy_pop_with_notify",
    "Long polls that went past the first pop into notification tasks",
)  # fmt: skip
FIRST_POP_HITS = spec(
    Counter, "popmq_proxy_first_pop_hits",
    "Long polls answered by their first pop (is_short_polling_hit)", "strategy",
)  # fmt: skip
FILL_POPS = spec(
    Counter, "popmq_proxy_fill_pops",
    "Pops without hold on further brokers by receives that found fewer messages than their "
    "batch, by result (found, empty, failed)",
    "strategy", "result",
)  # fmt: skip
EMPTY_RESPONSES = spec(
    Counter, "popmq_proxy_empty_responses", "Receive calls answered with no message", "strategy"
)
UNAVAILABLE_RECEIVES = spec(
    Counter, "popmq_proxy_unavailable_receives",
    "Receive calls that found every broker they could ask unavailable (down, or its "
    "group without a leader) and waited for one instead of failing",
    "strategy",
)  # fmt: skip
FALSE_EMPTY_RESPONSES = spec(
    Counter, "popmq_proxy_false_empty_responses",
    "Empty answers while some broker held a visible message for the group", "strategy",
)  # fmt: skip
MESSAGES_DELIVERED = spec(
    Counter, "popmq_proxy_messages_delivered", "Messages handed to clients by receive"
)
BROKER_RPCS = spec(
    Counter, "popmq_proxy_broker_rpcs", "Calls from the proxy to brokers by kind", "kind"
)
HELD_NOTIFICATIONS = spec(
    Gauge, "popmq_proxy_held_notification_tasks", "Notification tasks currently waiting on brokers"
)
RECEIVE_DURATION = spec(
    Histogram, "popmq_proxy_receive_duration_seconds", "Time a receive call was held",
    "strategy", "result", buckets=_LATENCY_BUCKETS,
)  # fmt: skip
ADAPTIVE_MODE = spec(
    Gauge, "popmq_proxy_adaptive_mode",
    "Strategy the adaptive long poll is using now (1 for the active one)", "mode",
)  # fmt: skip
POP_REQUEST_RATE = spec(
    Gauge, "popmq_proxy_pop_request_rate", "Pop requests per second over the adaptive window"
)
BROKER_RPC_ERRORS = spec(
    Counter, "popmq_proxy_broker_rpc_errors", "Failed calls from the proxy to brokers",
    "kind", "code",
)  # fmt: skip
RELEASED_MESSAGES = spec(
    Counter, "popmq_proxy_released_messages",
    "Popped messages a long poll could not deliver (client gone), by what release did",
    "outcome",
)  # fmt: skip
AUTO_RENEWALS = spec(
    Counter, "popmq_proxy_auto_renewals",
    "PushConsumer handle renewals by outcome (renewed, client_gone, max_time, "
    "handle_gone, failed, gave_up)",
    "outcome",
)  # fmt: skip
RENEWING_HANDLES = spec(
    Gauge, "popmq_proxy_renewing_handles",
    "PushConsumer receipt handles this proxy is keeping invisible",
)  # fmt: skip
ADMISSION_REFUSALS = spec(
    Counter, "popmq_proxy_admission_refusals",
    "Requests refused by admission control, by reason (long-poll bounds, clients and "
    "concurrent calls per access key: TOO_MANY_REQUESTS; batch, body or send size)",
    "reason", exported=tuple((reason,) for reason in ADMISSION_REASONS),
)  # fmt: skip
TRANSACTION_CHECKS = spec(
    Counter, "popmq_proxy_transaction_checks",
    "Check-backs of undecided transactional messages sent to producers over their "
    "Telemetry streams (RecoverOrphanedTransactionCommand)",
)  # fmt: skip
BUDGET_REFUSALS = spec(
    Counter, "popmq_proxy_memory_budget_refusals",
    "Sends and receive answers refused with TOO_MANY_REQUESTS because the bytes in "
    "flight were at proxy.max_inflight_bytes",
)  # fmt: skip
INFLIGHT_BYTES = spec(
    Gauge, "popmq_proxy_inflight_bytes",
    "Bytes of sends and receive answers in flight now (the memory budget's draw; at "
    "most about proxy.max_inflight_bytes)",
)  # fmt: skip
STALLED_STREAMS = spec(
    Counter, "popmq_proxy_stalled_streams",
    "Receive and pull streams ended because their client read nothing for "
    "proxy.write_stall_timeout_ms (their unsent messages released)",
    "method",
)  # fmt: skip
LATE_ANSWERS = spec(
    Counter, "popmq_proxy_late_receive_answers",
    "Receive calls whose answer was finished after the client's deadline (should be 0; "
    "grows when the proxy is overloaded)",
)  # fmt: skip
LOOP_LAG = spec(
    Gauge, "popmq_proxy_event_loop_lag_seconds",
    "How late the proxy's event loop runs a timer (recent, decaying); admission sheds "
    "long polls above proxy.max_loop_lag_ms",
)  # fmt: skip
ACTIVE_LONG_POLLS = spec(
    Gauge, "popmq_proxy_active_long_polls", "Receive calls held now (admission control)"
)
ADAPTIVE_SWITCHES = spec(
    Counter, "popmq_proxy_adaptive_switches", "Adaptive long-poll switches, by the mode entered",
    "mode",
)  # fmt: skip
PROXY_METRICS = (
    ROCKETMQ_RPC_LATENCY, BROKER_UP, RPC_REQUESTS, RPC_DURATION, LONG_POLLS, POP_WITH_NOTIFY,
    FIRST_POP_HITS, FILL_POPS, EMPTY_RESPONSES, UNAVAILABLE_RECEIVES, FALSE_EMPTY_RESPONSES,
    MESSAGES_DELIVERED, BROKER_RPCS, HELD_NOTIFICATIONS, RECEIVE_DURATION, ADAPTIVE_MODE,
    POP_REQUEST_RATE, BROKER_RPC_ERRORS, RELEASED_MESSAGES, AUTO_RENEWALS, RENEWING_HANDLES,
    ADMISSION_REFUSALS, TRANSACTION_CHECKS, BUDGET_REFUSALS, INFLIGHT_BYTES, STALLED_STREAMS,
    LATE_ANSWERS, LOOP_LAG, ACTIVE_LONG_POLLS, ADAPTIVE_SWITCHES,
)  # fmt: skip
# ACCESS metrics: the access guard's, built with it (a proxy without an ACL exports neither).
ACL_RELOAD_FAILURES = spec(
    Counter, "popmq_proxy_acl_reload_failures",
    "Changes to the ACL file that did not parse (the previous ACL stayed in force)",
)  # fmt: skip
ACCESS_REFUSALS = spec(
    Counter, "popmq_proxy_access_refusals",
    "Calls refused by the access guard, by reason (unknown_key, bad_signature, clock_skew, "
    "malformed, missing, forbidden); callers get one message for unknown_key and "
    "bad_signature",
    "reason",
)  # fmt: skip
# What every client RPC records, once, at the servicer's one seam (RpcMeter below).
RPC_METRICS = (RPC_REQUESTS, RPC_DURATION, ROCKETMQ_RPC_LATENCY)
# Code(code).name is an enum lookup; the names by value are read once.
_CODE_NAMES: dict[int, str] = {code.value: code.name for code in Code}


class _Tally(Collector):
    """Counts and observations the receive path records as plain numbers, folded into their
    prometheus_client metrics when the registry is collected (a scrape, ``exposition``,
    ``get_sample_value``). Registered before the metrics it folds into, so a scrape reads
    the same figures as if each had been recorded at once.

    prometheus_client takes a lock per update (a histogram's observe: two, and a walk of
    its buckets in Python): an idle receive made ten of them, about 12 us (docs/
    benchmarks.md, "Idle polls, wave 10"). A tally is written by the proxy's event loop
    only (each field has one writer); a scrape, from the exposition server's thread too,
    adds what each gained since the last fold."""

    def __init__(self) -> None:
        self._parts: list[_Counted | _Observed] = []
        self._lock = threading.Lock()  # two scrapes at once fold once

    def counter(self, metric: Any) -> _Counted:
        part = _Counted(metric)
        self._parts.append(part)
        return part

    def histogram(self, metric: Any) -> _Observed:
        part = _Observed(metric)
        self._parts.append(part)
        return part

    def describe(self) -> list[Metric]:
        return []  # exports nothing of its own

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            for part in list(self._parts):
                part.fold()
        return iter(())


class _Counted:
    """A counter child's increments, kept as an int until folded."""

    __slots__ = ("_folded", "_metric", "count")

    def __init__(self, metric: Any) -> None:
        self._metric = metric
        self.count = 0
        self._folded = 0

    def inc(self, amount: int = 1) -> None:
        self.count += amount

    def fold(self) -> None:
        count = self.count
        if count != self._folded:
            self._metric.inc(count - self._folded)
            self._folded = count


class _Observed:
    """A histogram child's observations, kept as bucket counts and a sum until folded into
    the child's own buckets and sum (prometheus_client's ``_buckets`` and ``_sum``: the
    values its ``observe`` updates)."""

    __slots__ = ("_bounds", "_folded", "_folded_sum", "_metric", "counts", "sum")

    def __init__(self, metric: Any) -> None:
        self._metric = metric
        self._bounds = tuple(metric._upper_bounds)  # ascending, the last +Inf
        self.counts = [0] * len(self._bounds)
        self.sum = 0.0
        self._folded = [0] * len(self._bounds)
        self._folded_sum = 0.0

    def observe(self, amount: float) -> None:
        # The first bucket whose bound is >= amount, as Histogram.observe picks it.
        self.counts[bisect_left(self._bounds, amount)] += 1
        self.sum += amount

    def fold(self) -> None:
        buckets = self._metric._buckets
        folded = self._folded
        for index, count in enumerate(self.counts):
            if count != folded[index]:
                buckets[index].inc(count - folded[index])
                folded[index] = count
        total = self.sum
        if total != self._folded_sum:
            self._metric._sum.inc(total - self._folded_sum)
            self._folded_sum = total


class _Children(dict[Any, Any]):
    """One metric's label children by label value(s), made at first use as labels() would
    (/metrics shows no series for values never seen). labels() takes a lock; a hit here is a
    dict lookup."""

    __slots__ = ("_metric", "_tally")

    def __init__(self, metric: Any, tally: Callable[[Any], Any] | None = None) -> None:
        super().__init__()
        self._metric = metric
        self._tally = tally  # the child's updates kept as plain numbers (_Tally), or None

    def __missing__(self, key: str | tuple[str, ...]) -> Any:
        child = self._metric.labels(*key) if isinstance(key, tuple) else (
            self._metric.labels(key)
        )  # fmt: skip
        if self._tally is not None:
            child = self._tally(child)
        self[key] = child
        return child


class ProxyMetrics:
    """PROXY_METRICS of one proxy, built from the table, and the ProxyEvents that record them
    (proxy/events.py: the core reports domain facts; only this class knows Prometheus)."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        cluster: str = "DefaultCluster",
        node_id: str | None = None,
    ) -> None:
        self.registry = registry or CollectorRegistry()
        self.cluster = cluster
        self._node = (cluster, "proxy", node_id or socket.gethostname())
        # Folds the receive path's tallies in before the metrics themselves are collected.
        self.tally = _Tally()
        self.registry.register(self.tally)
        self.instruments: dict[str, Any] = build_all(PROXY_METRICS, self.registry)
        # What every receive records: tallied (_Tally), the rest recorded as it happens.
        self._long_polls = _Children(self[LONG_POLLS], self.tally.counter)
        self._first_pop_hits = self._children(FIRST_POP_HITS)
        self._fill_pops = self._children(FILL_POPS)
        self._empty = _Children(self[EMPTY_RESPONSES], self.tally.counter)
        self._unavailable = self._children(UNAVAILABLE_RECEIVES)
        self._false_empty = self._children(FALSE_EMPTY_RESPONSES)
        self._receive_duration = _Children(self[RECEIVE_DURATION], self.tally.histogram)
        self._delivered = self[MESSAGES_DELIVERED]
        self._pop_with_notify = self.tally.counter(self[POP_WITH_NOTIFY])
        self._released = self._children(RELEASED_MESSAGES)
        self._broker_rpcs = self._children(BROKER_RPCS)
        self._broker_rpc_errors = self._children(BROKER_RPC_ERRORS)
        self._held_notifications = self[HELD_NOTIFICATIONS]
        self._refusals = self._children(ADMISSION_REFUSALS)
        self._renewals = self._children(AUTO_RENEWALS)
        self._stalled = self._children(STALLED_STREAMS)
        self._rpc_requests = self._children(RPC_REQUESTS)
        self.broker_links = _LinkCollector()
        self.registry.register(self.broker_links)
        self.broker_request_links = _RequestLinkCollector()
        self.registry.register(self.broker_request_links)

    def __getitem__(self, declared: MetricSpec) -> Any:
        """The prometheus_client metric built for ``declared``."""
        return self.instruments[declared.name]

    def _children(self, declared: MetricSpec) -> _Children:
        return _Children(self[declared])

    def exposition(self) -> str:
        """The metrics in Prometheus' text format."""
        return generate_latest(self.registry).decode()

    # -- ProxyEvents (proxy/events.py) ----------------------------------------------------------
    def receive_started(self, strategy: str) -> None:
        self._long_polls[strategy].inc()

    def receive_ended(self, strategy: str, result: str, seconds: float, delivered: int) -> None:
        self._receive_duration[strategy, result].observe(seconds)
        if delivered:
            self._delivered.inc(delivered)
        elif result == "empty":
            self._empty[strategy].inc()

    def receive_waited_unavailable(self, strategy: str) -> None:
        self._unavailable[strategy].inc()

    def first_pop_hit(self, strategy: str) -> None:
        self._first_pop_hits[strategy].inc()

    def fill_pop(self, strategy: str, result: str) -> None:
        self._fill_pops[strategy, result].inc()

    def went_past_first_pop(self) -> None:
        self._pop_with_notify.inc()

    def false_empty(self, strategy: str, count: int = 1) -> None:
        self._false_empty[strategy].inc(count)

    def released(self, outcome: str, count: int = 1) -> None:
        self._released[outcome].inc(count)

    def broker_call(self, kind: str) -> None:
        self._broker_rpcs[kind].inc()

    def broker_call_failed(self, kind: str, code: str) -> None:
        self._broker_rpc_errors[kind, code].inc()

    def notification_held(self, change: int) -> None:
        self._held_notifications.inc(change)

    def broker_up(self, broker: str, up: bool | None) -> None:
        gauge = self[BROKER_UP]
        if up is not None:
            gauge.labels(broker).set(1 if up else 0)
        else:  # a group no longer served: its series goes
            with contextlib.suppress(KeyError):
                gauge.remove(broker)

    def adaptive_mode(self, mode: str, modes: tuple[str, ...]) -> None:
        gauge = self[ADAPTIVE_MODE]
        for each in modes:
            gauge.labels(each).set(1 if each == mode else 0)

    def adaptive_switched(self, mode: str) -> None:
        self[ADAPTIVE_SWITCHES].labels(mode).inc()

    def watch_pop_rate(self, per_second: Callable[[], float]) -> None:
        self[POP_REQUEST_RATE].set_function(per_second)

    def refused(self, reason: str) -> None:
        self._refusals[reason].inc()

    def watch_active_long_polls(self, held: Callable[[], float]) -> None:
        self[ACTIVE_LONG_POLLS].set_function(held)

    def loop_lag(self, seconds: float) -> None:
        self[LOOP_LAG].set(seconds)

    def budget_refused(self) -> None:
        self[BUDGET_REFUSALS].inc()

    def watch_inflight_bytes(self, held: Callable[[], float]) -> None:
        self[INFLIGHT_BYTES].set_function(held)

    def stream_stalled(self, method: str) -> None:
        self._stalled[method].inc()

    def late_answer(self) -> None:
        self[LATE_ANSWERS].inc()

    def rpc_refused(self, method: str, code: str) -> None:
        """Counted, with no latency (nothing was served)."""
        self._rpc_requests[method, code].inc()

    def renewal(self, outcome: str) -> None:
        self._renewals[outcome].inc()

    def renewing_handles(self, count: int) -> None:
        self[RENEWING_HANDLES].set(count)

    def transaction_checks(self, count: int) -> None:
        if count:
            self[TRANSACTION_CHECKS].inc(count)

    # -- the RPC seam (proxy/grpc/servicer.py) -------------------------------------------------
    def meter(self, method: str, now: Callable[[], float] = SYSTEM.monotonic) -> RpcMeter:
        """The one recorder of `method`'s RPC metrics (build it once, at start-up)."""
        return RpcMeter(self, method, now)

    def observe_rpc(self, method: str, code: str, seconds: float) -> None:
        """rocketmq_rpc_latency for one client RPC."""
        self.rocketmq_rpc_child(method, code).observe(seconds * 1000)

    def rocketmq_rpc_child(self, method: str, code: str) -> Any:
        return self[ROCKETMQ_RPC_LATENCY].labels(*self._node, "grpc", method, code)

    def watch_links(self, ports: Sequence[Any]) -> None:
        """Report each broker link's losses and watches (``popmq proxy`` in front of remote
        brokers; in-process ports have no link to lose), and their request links' failures."""
        self.broker_links.ports = ports
        self.broker_request_links.ports = ports


class RpcMeter:
    """RPC_METRICS for one method. The label children are resolved once per method and code
    (``labels()`` is a lookup under a lock): a call's record is three updates and a clock read.

    ``now`` is the clock the call's start was read from (the servicer's Clock)."""

    __slots__ = ("_by_code", "_method", "_metrics", "now")

    def __init__(self, metrics: ProxyMetrics, method: str, now: Callable[[], float]) -> None:
        self._metrics = metrics
        self._method = method
        # Children are made at a method's first call with each code, as labels() would:
        # /metrics shows no series for a method or code never seen.
        self._by_code: dict[int | str, tuple[Any, Any, Any]] = {}
        self.now = now

    def record(self, code: int | str, started: float) -> None:
        children = self._by_code.get(code)
        if children is None:
            children = self._by_code[code] = self._children(code)
        counter, timer, rocketmq = children
        elapsed = self.now() - started
        counter.inc()
        timer.observe(elapsed)
        rocketmq.observe(elapsed * 1000)

    def _children(self, code: int | str) -> tuple[Any, Any, Any]:
        name = code if isinstance(code, str) else _CODE_NAMES.get(code) or str(code)
        metrics = self._metrics
        tally = metrics.tally  # plain numbers, folded in at collection (_Tally)
        return (
            tally.counter(metrics[RPC_REQUESTS].labels(self._method, name)),
            tally.histogram(metrics[RPC_DURATION].labels(self._method)),
            tally.histogram(metrics.rocketmq_rpc_child(self._method, name)),
        )


class _LinkCollector(Collector):
    """popmq_proxy_broker_link_* read from the ports' links at scrape time."""

    _name = "popmq_proxy_broker_link_losses"  # what tests/deploy read off collectors
    _labelnames = ("broker",)

    def __init__(self) -> None:
        self.ports: Sequence[Any] = ()

    def collect(self) -> Iterator[Metric]:
        losses = CounterMetricFamily(
            "popmq_proxy_broker_link_losses", "Watch streams to a broker lost (then reopened)",
            labels=["broker"],
        )  # fmt: skip
        watches = GaugeMetricFamily(
            "popmq_proxy_broker_link_watches", "Visibility watches held on a broker's link",
            labels=["broker"],
        )  # fmt: skip
        for port in self.ports:
            link = getattr(port, "watch_backend", None)
            if link is not None and hasattr(link, "losses"):
                losses.add_metric([port.name], link.losses)
                watches.add_metric([port.name], link.watches)
        yield losses
        yield watches


class _RequestLinkCollector(Collector):
    """popmq_proxy_broker_request_link_failures (and _late_pop_messages) read from the ports'
    request links at scrape time (the link and the port count them: the broker layer knows
    nothing of the proxy's metrics)."""

    _name = "popmq_proxy_broker_request_link_failures"  # what tests/deploy read off collectors
    _labelnames = ("broker",)

    def __init__(self) -> None:
        self.ports: Sequence[Any] = ()

    def collect(self) -> Iterator[Metric]:
        failures = CounterMetricFamily(
            self._name, "Requests to a broker failed because their request-link stream was lost",
            labels=["broker"],
        )  # fmt: skip
        late = CounterMetricFamily(
            "popmq_proxy_broker_late_pop_messages",
            "Messages of pops answered after the proxy gave them up (deadline, client gone), "
            "handed back to the broker (a failed hand-back is logged: those come back after "
            "their invisible time)",
            labels=["broker"],
        )  # fmt: skip
        for port in self.ports:
            link = getattr(port, "request_link", None)
            if link is not None:
                failures.add_metric([port.name], link.health.failures)
                late.add_metric([port.name], getattr(port, "late_popped", 0))
        yield failures
        yield late
