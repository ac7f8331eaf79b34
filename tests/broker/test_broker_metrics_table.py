# ruff: noqa: E501 (help texts are compared whole)
"""The broker's metrics are one table (BROKER_METRICS) built at start-up; none was renamed.

FAMILIES is every family a broker exports before any scrape-time state, as main had them
before the table (name, type, label names, help): dashboards and alerts read these.
"""

from __future__ import annotations

from popmq.broker.metrics import BROKER_METRICS, BrokerMetrics
from support.metric_families import families

FAMILIES = [
    (
        "popmq_broker_acks",
        "counter",
        ("broker", "result"),
        "Ack entries, by result (failed: unknown, expired or forged receipt handles)",
    ),
    (
        "popmq_broker_auto_create_refused",
        "counter",
        ("broker", "kind", "reason"),
        "Topics or groups not auto-created, by kind and reason (disabled, total, rate)",
    ),
    (
        "popmq_broker_checkpoints_spilled",
        "counter",
        ("broker",),
        "Checkpoints written to the pop journal because they were not acked within pop.checkpoint_buffer_ms",
    ),
    (
        "popmq_broker_held_requests",
        "gauge",
        ("broker", "kind"),
        "Long polls waiting in the hold table, by kind",
    ),
    ("popmq_broker_held_requests_limit", "gauge", ("broker",), "broker.polling.max_held_total"),
    (
        "popmq_broker_invisible_time_changes",
        "counter",
        ("broker",),
        "Successful changeInvisibleTime calls (including nacks to 0)",
    ),
    (
        "popmq_broker_messages_recalled",
        "counter",
        ("broker",),
        "Delay messages recalled (RecallMessage) before their delivery time",
    ),
    (
        "popmq_broker_messages_stored",
        "counter",
        ("broker", "topic"),
        "Messages stored by producers' sends, by topic (delay messages when accepted)",
    ),
    (
        "popmq_broker_polling_full",
        "counter",
        ("broker", "kind"),
        "Long polls refused because the hold table was full",
    ),
    (
        "popmq_broker_pop_requests",
        "counter",
        ("broker", "result"),
        "Pop requests answered, by result",
    ),
    ("popmq_broker_popped_messages", "counter", ("broker",), "Messages handed out by pops"),
    (
        "popmq_broker_store_metadata_fallbacks",
        "counter",
        ("broker", "file", "action"),
        "Metadata files found missing or damaged at startup, by file and action (previous_copy, rebuilt, full_scan, reset)",
    ),
    (
        "popmq_broker_store_quarantined_bytes",
        "counter",
        ("broker", "file", "reason"),
        "Damaged, missing or torn bytes found at startup, by file and reason",
    ),
    (
        "popmq_broker_store_quarantined_frames",
        "counter",
        ("broker", "file", "reason"),
        "Records lost to damaged, missing or torn bytes found at startup, by file and reason (torn_tail, damaged, missing, unreadable); the bytes are kept in DATA/quarantine/",
    ),
    (
        "popmq_broker_timer_deliveries",
        "counter",
        ("broker",),
        "Messages the timer moved to their topic (delay messages and retry backoffs)",
    ),
    (
        "popmq_broker_transaction_checks",
        "counter",
        ("broker",),
        "Check-backs of undecided half messages handed to proxies",
    ),
    (
        "popmq_broker_transaction_half_messages",
        "counter",
        ("broker",),
        "Transactional messages stored as half messages (invisible until committed)",
    ),
    (
        "popmq_broker_transactions_ended",
        "counter",
        ("broker", "resolution", "source"),
        "Transactions decided, by resolution (COMMIT, ROLLBACK) and source (CLIENT, SERVER_CHECK, ADMIN); repeats of a decision are not counted",
    ),
    (
        "popmq_broker_transactions_parked",
        "counter",
        ("broker",),
        "Half messages parked for an operator after transaction.max_checks checks without a decision",
    ),
    (
        "rocketmq_commit_messages",
        "counter",
        ("cluster", "node_type", "node_id", "topic"),
        "Transactional messages committed (RocketMQ's metric)",
    ),
    (
        "rocketmq_messages_in",
        "counter",
        ("cluster", "node_type", "node_id", "topic", "message_type"),
        "Messages produced into the topic, by message type (normal, fifo, delay, transaction; RocketMQ's metric)",
    ),
    (
        "rocketmq_messages_out",
        "counter",
        ("cluster", "node_type", "node_id", "topic", "consumer_group"),
        "Messages delivered to consumers (RocketMQ's metric)",
    ),
    (
        "rocketmq_rollback_messages",
        "counter",
        ("cluster", "node_type", "node_id", "topic"),
        "Transactional messages rolled back (RocketMQ's metric)",
    ),
    (
        "rocketmq_throughput_in",
        "counter",
        ("cluster", "node_type", "node_id", "topic", "message_type"),
        "Body bytes produced into the topic, by message type (RocketMQ's metric)",
    ),
    (
        "rocketmq_throughput_out",
        "counter",
        ("cluster", "node_type", "node_id", "topic", "consumer_group"),
        "Body bytes delivered to consumers (RocketMQ's metric)",
    ),
]


def _families(metrics: BrokerMetrics) -> list[tuple[str, str, tuple[str, ...], str]]:
    return families(metrics.registry)


def test_every_family_keeps_its_name_type_labels_and_help() -> None:
    assert _families(BrokerMetrics("b1")) == sorted(FAMILIES)


def test_the_table_is_what_is_built() -> None:
    built = {name for name, *_ in _families(BrokerMetrics("b1"))}
    # rocketmq_message_size, a collector (per-key size histograms), describes nothing until
    # it has observed sizes: tests/broker/test_rocketmq_metrics.py checks it.
    assert built == {spec.name for spec in BROKER_METRICS}
