# ruff: noqa: E501 (help texts are compared whole)
"""The proxy's metrics are one table, recorded through ProxyEvents; none was renamed.

FAMILIES is every family a proxy exports, as main had them before the table (name, type, label
names, help): dashboards and alerts (helm/, deploy/) and docs/operations.md read these.
"""

from __future__ import annotations

from typing import Any

from popmq.proxy.metrics import (
    ACCESS_REFUSALS,
    ACL_RELOAD_FAILURES,
    BROKER_UP,
    PROXY_METRICS,
    RPC_METRICS,
    ProxyMetrics,
)
from support.metric_families import families

FAMILIES = [
    ("popmq_proxy_active_long_polls", "gauge", (), "Receive calls held now (admission control)"),
    (
        "popmq_proxy_adaptive_mode",
        "gauge",
        ("mode",),
        "Strategy the adaptive long poll is using now (1 for the active one)",
    ),
    (
        "popmq_proxy_adaptive_switches",
        "counter",
        ("mode",),
        "Adaptive long-poll switches, by the mode entered",
    ),
    (
        "popmq_proxy_admission_refusals",
        "counter",
        ("reason",),
        "Requests refused by admission control, by reason (long-poll bounds, clients and concurrent calls per access key: TOO_MANY_REQUESTS; batch, body or send size)",
    ),
    (
        "popmq_proxy_auto_renewals",
        "counter",
        ("outcome",),
        "PushConsumer handle renewals by outcome (renewed, client_gone, max_time, handle_gone, failed, gave_up)",
    ),
    (
        "popmq_proxy_broker_link_losses",
        "counter",
        ("broker",),
        "Watch streams to a broker lost (then reopened)",
    ),
    (
        "popmq_proxy_broker_late_pop_messages",
        "counter",
        ("broker",),
        "Messages of pops answered after the proxy gave them up (deadline, client gone), handed back to the broker (a failed hand-back is logged: those come back after their invisible time)",
    ),
    (
        "popmq_proxy_broker_link_watches",
        "gauge",
        ("broker",),
        "Visibility watches held on a broker's link",
    ),
    (
        "popmq_proxy_broker_request_link_failures",
        "counter",
        ("broker",),
        "Requests to a broker failed because their request-link stream was lost",
    ),
    (
        "popmq_proxy_broker_rpc_errors",
        "counter",
        ("kind", "code"),
        "Failed calls from the proxy to brokers",
    ),
    ("popmq_proxy_broker_rpcs", "counter", ("kind",), "Calls from the proxy to brokers by kind"),
    (
        "popmq_proxy_broker_up",
        "gauge",
        ("broker",),
        "1 while the proxy reaches the broker, 0 while it cannot (checked every few seconds)",
    ),
    (
        "popmq_proxy_empty_responses",
        "counter",
        ("strategy",),
        "Receive calls answered with no message",
    ),
    (
        "popmq_proxy_event_loop_lag_seconds",
        "gauge",
        (),
        "How late the proxy's event loop runs a timer (recent, decaying); admission sheds long polls above proxy.max_loop_lag_ms",
    ),
    (
        "popmq_proxy_false_empty_responses",
        "counter",
        ("strategy",),
        "Empty answers while some broker held a visible message for the group",
    ),
    (
        "popmq_proxy_first_pop_hits",
        "counter",
        ("strategy",),
        "Long polls answered by their first pop (is_short_polling_hit)",
    ),
    (
        "popmq_proxy_fill_pops",
        "counter",
        ("strategy", "result"),
        "Pops without hold on further brokers by receives that found fewer messages than their batch, by result (found, empty, failed)",
    ),
    (
        "popmq_proxy_held_notification_tasks",
        "gauge",
        (),
        "Notification tasks currently waiting on brokers",
    ),
    (
        "popmq_proxy_inflight_bytes",
        "gauge",
        (),
        "Bytes of sends and receive answers in flight now (the memory budget's draw; at most about proxy.max_inflight_bytes)",
    ),
    (
        "popmq_proxy_late_receive_answers",
        "counter",
        (),
        "Receive calls whose answer was finished after the client's deadline (should be 0; grows when the proxy is overloaded)",
    ),
    (
        "popmq_proxy_long_polls",
        "counter",
        ("strategy",),
        "Client receive calls that may long-poll (is_long_polling)",
    ),
    (
        "popmq_proxy_memory_budget_refusals",
        "counter",
        (),
        "Sends and receive answers refused with TOO_MANY_REQUESTS because the bytes in flight were at proxy.max_inflight_bytes",
    ),
    ("popmq_proxy_messages_delivered", "counter", (), "Messages handed to clients by receive"),
    (
        "popmq_proxy_pop_request_rate",
        "gauge",
        (),
        "Pop requests per second over the adaptive window",
    ),
    (
        "popmq_proxy_pop_with_notify",
        "counter",
        (),
        "Long polls that went past the first pop into notification tasks",
    ),
    (
        "popmq_proxy_receive_duration_seconds",
        "histogram",
        ("strategy", "result"),
        "Time a receive call was held",
    ),
    (
        "popmq_proxy_released_messages",
        "counter",
        ("outcome",),
        "Popped messages a long poll could not deliver (client gone), by what release did",
    ),
    (
        "popmq_proxy_renewing_handles",
        "gauge",
        (),
        "PushConsumer receipt handles this proxy is keeping invisible",
    ),
    ("popmq_proxy_rpc_duration_seconds", "histogram", ("method",), "Client RPC latency by method"),
    (
        "popmq_proxy_rpc_requests",
        "counter",
        ("method", "code"),
        "Client RPCs by method and result code",
    ),
    (
        "popmq_proxy_stalled_streams",
        "counter",
        ("method",),
        "Receive and pull streams ended because their client read nothing for proxy.write_stall_timeout_ms (their unsent messages released)",
    ),
    (
        "popmq_proxy_transaction_checks",
        "counter",
        (),
        "Check-backs of undecided transactional messages sent to producers over their Telemetry streams (RecoverOrphanedTransactionCommand)",
    ),
    (
        "popmq_proxy_unavailable_receives",
        "counter",
        ("strategy",),
        "Receive calls that found every broker they could ask unavailable (down, or its group without a leader) and waited for one instead of failing",
    ),
    (
        "rocketmq_rpc_latency",
        "histogram",
        ("cluster", "node_type", "node_id", "protocol_type", "request_code", "response_code"),
        "Client RPC latency in milliseconds (RocketMQ's metric)",
    ),
]


def _families(metrics: ProxyMetrics) -> list[tuple[str, str, tuple[str, ...], str]]:
    return families(metrics.registry)


def test_every_family_keeps_its_name_type_labels_and_help() -> None:
    assert _families(ProxyMetrics()) == sorted(FAMILIES)


def test_the_table_is_what_is_built() -> None:
    metrics = ProxyMetrics()
    built = {name for name, *_ in _families(metrics)}
    table = {spec.name for spec in PROXY_METRICS}
    assert len(table) == len(PROXY_METRICS)  # no name declared twice
    # The table, plus the two collectors read off the broker links at scrape time.
    links = {"popmq_proxy_broker_link_losses", "popmq_proxy_broker_link_watches",
             "popmq_proxy_broker_request_link_failures",
             "popmq_proxy_broker_late_pop_messages"}  # fmt: skip
    assert built == table | links
    assert set(RPC_METRICS) <= set(PROXY_METRICS)


def _value(metrics: ProxyMetrics, name: str, **labels: str) -> Any:
    return metrics.registry.get_sample_value(name, labels)


def test_receive_facts_become_their_metrics() -> None:
    metrics = ProxyMetrics()
    metrics.receive_started("notify")
    metrics.receive_ended("notify", "found", 0.002, 3)
    metrics.receive_started("notify")
    metrics.receive_ended("notify", "empty", 0.5, 0)
    metrics.receive_ended("notify", "cancelled", 0.1, 0)
    assert _value(metrics, "popmq_proxy_long_polls_total", strategy="notify") == 2
    assert _value(metrics, "popmq_proxy_messages_delivered_total") == 3
    assert _value(metrics, "popmq_proxy_empty_responses_total", strategy="notify") == 1
    for result in ("found", "empty", "cancelled"):
        count = _value(metrics, "popmq_proxy_receive_duration_seconds_count",
                       strategy="notify", result=result)  # fmt: skip
        assert count == 1
    metrics.broker_call("pop")
    metrics.broker_call("pop")
    metrics.broker_call_failed("pop", "BROKER_DOWN")
    assert _value(metrics, "popmq_proxy_broker_rpcs_total", kind="pop") == 2
    assert _value(metrics, "popmq_proxy_broker_rpc_errors_total", kind="pop",
                  code="BROKER_DOWN") == 1  # fmt: skip
    metrics.released("handed_back", 4)
    assert _value(metrics, "popmq_proxy_released_messages_total", outcome="handed_back") == 4


def test_admission_reasons_are_exported_at_zero_and_a_removed_group_goes() -> None:
    metrics = ProxyMetrics()
    reasons = _value(metrics, "popmq_proxy_admission_refusals_total", reason="overloaded")
    assert reasons == 0
    metrics.broker_up("g1", True)
    metrics.broker_up("g2", False)
    assert _value(metrics, BROKER_UP.name, broker="g1") == 1
    assert _value(metrics, BROKER_UP.name, broker="g2") == 0
    metrics.broker_up("g1", None)
    metrics.broker_up("never-seen", None)  # nothing to remove: no error
    assert _value(metrics, BROKER_UP.name, broker="g1") is None


def test_the_access_guards_metrics_keep_theirs() -> None:
    """Built with the guard (only with an ACL): declared in the same module, unchanged."""
    assert (ACL_RELOAD_FAILURES.name, ACL_RELOAD_FAILURES.labels) == (
        "popmq_proxy_acl_reload_failures",
        (),
    )
    assert ACL_RELOAD_FAILURES.help == (
        "Changes to the ACL file that did not parse (the previous ACL stayed in force)"
    )
    assert (ACCESS_REFUSALS.name, ACCESS_REFUSALS.labels) == (
        "popmq_proxy_access_refusals",
        ("reason",),
    )
    assert ACCESS_REFUSALS.help == (
        "Calls refused by the access guard, by reason (unknown_key, bad_signature, clock_skew, "
        "malformed, missing, forbidden); callers get one message for unknown_key and bad_signature"
    )
