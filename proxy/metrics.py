"""The proxy's Prometheus metrics (names are stable; docs/operations.md explains each one).

Each proxy instance owns one ``ProxyMetrics`` with its own registry, so several proxies in one
process (tests, benchmarks) do not mix their counts.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from popmq.broker.contract.errors import Code
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from popmq.clock import SYSTEM

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


@dataclass(frozen=True)
class MetricSpec:
    """One metric's definition: what a dashboard reads (name, help, labels, buckets)."""

    kind: type[Counter] | type[Histogram]
    name: str
    help: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] | None = None

    def build(self, registry: CollectorRegistry) -> Any:
        if self.buckets is None:
            return self.kind(self.name, self.help, self.labels, registry=registry)
        return Histogram(self.name, self.help, self.labels, registry=registry, buckets=self.buckets)


# What every client RPC records, once, at the servicer's one seam (RpcMeter below).
RPC_REQUESTS = MetricSpec(
    Counter, "popmq_proxy_rpc_requests", "Client RPCs by method and result code",
    ("method", "code"),
)  # fmt: skip
RPC_DURATION = MetricSpec(
    Histogram, "popmq_proxy_rpc_duration_seconds", "Client RPC latency by method",
    ("method",), _LATENCY_BUCKETS,
)  # fmt: skip
ROCKETMQ_RPC_LATENCY = MetricSpec(
    Histogram, "rocketmq_rpc_latency", "Client RPC latency in milliseconds (RocketMQ's metric)",
    ("cluster", "node_type", "node_id", "protocol_type", "request_code", "response_code"),
    RPC_LATENCY_MS_BUCKETS,
)  # fmt: skip
RPC_METRICS = (RPC_REQUESTS, RPC_DURATION, ROCKETMQ_RPC_LATENCY)
# Code(code).name is an enum lookup; the names by value are read once.
_CODE_NAMES: dict[int, str] = {code.value: code.name for code in Code}


class ProxyMetrics:
    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        cluster: str = "DefaultCluster",
        node_id: str | None = None,
    ) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.cluster = cluster
        self._node = (cluster, "proxy", node_id or socket.gethostname())
        self._rocketmq_rpc = ROCKETMQ_RPC_LATENCY.build(r)
        self.broker_up = Gauge(
            "popmq_proxy_broker_up",
            "1 while the proxy reaches the broker, 0 while it cannot (checked every few seconds)",
            ["broker"], registry=r,
        )  # fmt: skip
        self.rpc_requests = RPC_REQUESTS.build(r)
        self.rpc_latency = RPC_DURATION.build(r)
        self.long_polls = Counter(
            "popmq_proxy_long_polls", "Client receive calls that may long-poll (is_long_polling)",
            ["strategy"], registry=r,
        )  # fmt: skip
        self.pop_with_notify = Counter(
            "popmq_proxy_pop_with_notify",
            "Long polls that went past the first pop into notification tasks",
            registry=r,
        )
        self.first_pop_hits = Counter(
            "popmq_proxy_first_pop_hits",
            "Long polls answered by their first pop (is_short_polling_hit)",
            ["strategy"], registry=r,
        )  # fmt: skip
        self.empty_responses = Counter(
            "popmq_proxy_empty_responses", "Receive calls answered with no message",
            ["strategy"], registry=r,
        )  # fmt: skip
        self.unavailable_receives = Counter(
            "popmq_proxy_unavailable_receives",
            "Receive calls that found every broker they could ask unavailable (down, or its "
            "group without a leader) and waited for one instead of failing",
            ["strategy"], registry=r,
        )  # fmt: skip
        self.false_empty_responses = Counter(
            "popmq_proxy_false_empty_responses",
            "Empty answers while some broker held a visible message for the group",
            ["strategy"], registry=r,
        )  # fmt: skip
        self.messages_delivered = Counter(
            "popmq_proxy_messages_delivered",
            "Messages handed to clients by receive",
            registry=r,
        )
        self.broker_rpcs = Counter(
            "popmq_proxy_broker_rpcs", "Calls from the proxy to brokers by kind",
            ["kind"], registry=r,
        )  # fmt: skip
        self.held_notifications = Gauge(
            "popmq_proxy_held_notification_tasks",
            "Notification tasks currently waiting on brokers", registry=r,
        )  # fmt: skip
        self.receive_latency = Histogram(
            "popmq_proxy_receive_duration_seconds", "Time a receive call was held",
            ["strategy", "result"], buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.adaptive_mode = Gauge(
            "popmq_proxy_adaptive_mode",
            "Strategy the adaptive long poll is using now (1 for the active one)",
            ["mode"], registry=r,
        )  # fmt: skip
        self.pop_request_rate = Gauge(
            "popmq_proxy_pop_request_rate",
            "Pop requests per second over the adaptive window",
            registry=r,
        )
        self.broker_rpc_errors = Counter(
            "popmq_proxy_broker_rpc_errors", "Failed calls from the proxy to brokers",
            ["kind", "code"], registry=r,
        )  # fmt: skip
        self.released_messages = Counter(
            "popmq_proxy_released_messages",
            "Popped messages a long poll could not deliver (client gone), by what release did",
            ["outcome"], registry=r,
        )  # fmt: skip
        self.auto_renewals = Counter(
            "popmq_proxy_auto_renewals",
            "PushConsumer handle renewals by outcome (renewed, client_gone, max_time, "
            "handle_gone, failed, gave_up)",
            ["outcome"], registry=r,
        )  # fmt: skip
        self.renewing_handles = Gauge(
            "popmq_proxy_renewing_handles",
            "PushConsumer receipt handles this proxy is keeping invisible",
            registry=r,
        )  # fmt: skip
        self.admission_refusals = Counter(
            "popmq_proxy_admission_refusals",
            "Requests refused by admission control, by reason (long-poll bounds, clients and "
            "concurrent calls per access key: TOO_MANY_REQUESTS; batch, body or send size)",
            ["reason"], registry=r,
        )  # fmt: skip
        for reason in ADMISSION_REASONS:  # exported at 0 from the start
            self.admission_refusals.labels(reason)
        self.transaction_checks_sent = Counter(
            "popmq_proxy_transaction_checks",
            "Check-backs of undecided transactional messages sent to producers over their "
            "Telemetry streams (RecoverOrphanedTransactionCommand)", registry=r,
        )  # fmt: skip
        self.budget_refusals = Counter(
            "popmq_proxy_memory_budget_refusals",
            "Sends and receive answers refused with TOO_MANY_REQUESTS because the bytes in "
            "flight were at proxy.max_inflight_bytes",
            registry=r,
        )  # fmt: skip
        self.inflight_bytes = Gauge(
            "popmq_proxy_inflight_bytes",
            "Bytes of sends and receive answers in flight now (the memory budget's draw; at "
            "most about proxy.max_inflight_bytes)", registry=r,
        )  # fmt: skip
        self.stalled_streams = Counter(
            "popmq_proxy_stalled_streams",
            "Receive and pull streams ended because their client read nothing for "
            "proxy.write_stall_timeout_ms (their unsent messages released)",
            ["method"], registry=r,
        )  # fmt: skip
        self.late_answers = Counter(
            "popmq_proxy_late_receive_answers",
            "Receive calls whose answer was finished after the client's deadline (should be 0; "
            "grows when the proxy is overloaded)", registry=r,
        )  # fmt: skip
        self.loop_lag = Gauge(
            "popmq_proxy_event_loop_lag_seconds",
            "How late the proxy's event loop runs a timer (recent, decaying); admission sheds "
            "long polls above proxy.max_loop_lag_ms", registry=r,
        )  # fmt: skip
        self.active_long_polls = Gauge(
            "popmq_proxy_active_long_polls", "Receive calls held now (admission control)",
            registry=r,
        )  # fmt: skip
        self.adaptive_switches = Counter(
            "popmq_proxy_adaptive_switches", "Adaptive long-poll switches, by the mode entered",
            ["mode"], registry=r,
        )  # fmt: skip
        self.broker_links = _LinkCollector()
        r.register(self.broker_links)
        self.broker_request_links = _RequestLinkCollector()
        r.register(self.broker_request_links)

    def transaction_checks(self, count: int) -> None:
        if count:
            self.transaction_checks_sent.inc(count)

    def meter(self, method: str, now: Callable[[], float] = SYSTEM.monotonic) -> RpcMeter:
        """The one recorder of `method`'s RPC metrics (build it once, at start-up)."""
        return RpcMeter(self, method, now)

    def observe_rpc(self, method: str, code: str, seconds: float) -> None:
        """rocketmq_rpc_latency for one client RPC."""
        self.rocketmq_rpc_child(method, code).observe(seconds * 1000)

    def refused(self, method: str, code: str) -> None:
        """A call refused before it reached its method (access, an undecodable body): counted,
        with no latency (nothing was served)."""
        self.rpc_requests.labels(method, code).inc()

    def rocketmq_rpc_child(self, method: str, code: str) -> Any:
        return self._rocketmq_rpc.labels(*self._node, "grpc", method, code)

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
        return (
            metrics.rpc_requests.labels(self._method, name),
            metrics.rpc_latency.labels(self._method),
            metrics.rocketmq_rpc_child(self._method, name),
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
    """popmq_proxy_broker_request_link_failures read from the ports' request links at scrape
    time (the link counts them: the broker layer knows nothing of the proxy's metrics)."""

    _name = "popmq_proxy_broker_request_link_failures"  # what tests/deploy read off collectors
    _labelnames = ("broker",)

    def __init__(self) -> None:
        self.ports: Sequence[Any] = ()

    def collect(self) -> Iterator[Metric]:
        failures = CounterMetricFamily(
            self._name, "Requests to a broker failed because their request-link stream was lost",
            labels=["broker"],
        )  # fmt: skip
        for port in self.ports:
            link = getattr(port, "request_link", None)
            if link is not None:
                failures.add_metric([port.name], link.health.failures)
        yield failures
