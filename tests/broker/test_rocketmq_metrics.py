"""The rocketmq_* series checked against RocketMQ 5's published metrics: every series of the
list below is exported with its type and labels, RocketMQ's bucket boundaries, and values that
follow what a real broker did (message types, bytes, ready/in-flight/lag, the DLQ by topic).

The list is RocketMQ's (its metrics documentation and broker code, 5.1+): names, types,
labels; a RocketMQ Grafana dashboard queries these and nothing else of the broker's."""

from __future__ import annotations

import time
from pathlib import Path

from popmq.broker.contract.types import PROP_TRANSACTION, AckEntry, Message, PopRequest
from popmq.broker.core import Broker
from popmq.broker.metrics import MESSAGE_SIZE_BUCKETS
from popmq.broker.testing import fast_broker_config, running_broker
from popmq.proxy.metrics import RPC_LATENCY_MS_BUCKETS, ProxyMetrics
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

NODE = ("cluster", "node_type", "node_id")
CONSUMER = (*NODE, "topic", "consumer_group")
# RocketMQ 5's broker series: name (without _total) -> (type, labels every sample carries).
ROCKETMQ_BROKER = {
    "rocketmq_messages_in": ("counter", (*NODE, "topic", "message_type")),
    "rocketmq_messages_out": ("counter", CONSUMER),
    "rocketmq_throughput_in": ("counter", (*NODE, "topic", "message_type")),
    "rocketmq_throughput_out": ("counter", CONSUMER),
    "rocketmq_message_size": ("histogram", (*NODE, "topic", "message_type")),
    "rocketmq_consumer_ready_messages": ("gauge", CONSUMER),
    "rocketmq_consumer_inflight_messages": ("gauge", CONSUMER),
    "rocketmq_consumer_lag_messages": ("gauge", CONSUMER),
    "rocketmq_consumer_queueing_latency": ("gauge", CONSUMER),
    "rocketmq_consumer_lag_latency": ("gauge", CONSUMER),
    "rocketmq_send_to_dlq_messages": ("counter", CONSUMER),
    "rocketmq_commit_messages": ("counter", (*NODE, "topic")),
    "rocketmq_rollback_messages": ("counter", (*NODE, "topic")),
    "rocketmq_half_messages": ("gauge", (*NODE, "topic")),
    "rocketmq_topic_number": ("gauge", NODE),
    "rocketmq_consumer_group_number": ("gauge", NODE),
    "rocketmq_storage_size": ("gauge", NODE),
}
ROCKETMQ_PROXY = {
    "rocketmq_rpc_latency": (
        "histogram", (*NODE, "protocol_type", "request_code", "response_code"),
    ),
}  # fmt: skip
# Bucket upper bounds: message sizes 1 KiB .. 4 MiB; RPC latency in ms (the documented
# 1, 3, 5, 10, 100, 1000, 3000 and the 7 and 2000 of RocketMQ's remoting code).
SIZE_BOUNDS = [1024, 4096, 524288, 1048576, 2097152, 4194304]
RPC_BOUNDS = [1, 3, 5, 7, 10, 100, 1000, 2000, 3000]


def _families(registry: CollectorRegistry) -> dict[str, tuple[str, list[Sample]]]:
    text = generate_latest(registry).decode()
    return {f.name: (f.type, f.samples) for f in text_string_to_metric_families(text)}


def _check_list(families: dict[str, tuple[str, list[Sample]]],
                wanted: dict[str, tuple[str, tuple[str, ...]]]) -> None:  # fmt: skip
    for name, (kind, labels) in wanted.items():
        assert name in families, f"{name} is not exported"
        got_kind, samples = families[name]
        assert got_kind == kind, f"{name}: {got_kind}, RocketMQ's is a {kind}"
        assert samples, f"{name} has no sample"
        for sample in samples:
            missing = set(labels) - set(sample.labels)
            assert not missing, f"{sample.name} lacks {sorted(missing)}"


def _sum(samples: list[Sample], name: str, **labels: str) -> float:
    return sum(s.value for s in samples
               if s.name == name and labels.items() <= s.labels.items())  # fmt: skip


async def _exercise(broker: Broker) -> None:
    await broker.create_topic("t", 2, "MIXED")
    await broker.create_topic("tx", 1, "TRANSACTION")
    await broker.create_topic("f", 1, "FIFO")
    await broker.send([Message("t", b"x" * 100)] * 3)  # normal, in the first bucket
    await broker.send([Message("t", b"y" * 5000)])  # normal, 4 KiB < size <= 512 KiB
    later = int(time.time() * 1000) + 600_000
    await broker.send([Message("t", b"d", delivery_timestamp_ms=later)])
    await broker.send([Message("f", b"ff", message_group="g1")])
    halves = await broker.send([Message("tx", b"half", properties={PROP_TRANSACTION: "1"})] * 3)
    for half, commit in zip(halves, (True, False), strict=False):  # the third stays undecided
        await broker.end_transaction("tx", half.message_id, half.transaction_id, commit)
    # Group g pops 3 of the 4 visible messages of t, acks 1, sends 1 to its DLQ.
    popped = []
    for queue_id in (0, 1):
        result = await broker.pop(PopRequest("g", "t", queue_id=queue_id, max_messages=3,
                                             invisible_time_ms=600_000))  # fmt: skip
        popped += result.messages
    assert len(popped) == 4
    await broker.ack("g", "t", [AckEntry(popped[0].receipt_handle)])
    await broker.forward_to_dlq("g", "t", popped[1].receipt_handle)


async def test_broker_series_match_rocketmq_names_types_labels_and_values(
    tmp_path: Path,
) -> None:
    async with running_broker(fast_broker_config(tmp_path)) as broker:
        await _exercise(broker)
        # A message sent after the pops is ready (not delivered) for g.
        await broker.send([Message("t", b"late")])
        families = _families(broker.metrics.registry)
    _check_list(families, ROCKETMQ_BROKER)
    node = {"cluster": "DefaultCluster", "node_type": "broker", "node_id": broker.name}

    _, messages_in = families["rocketmq_messages_in"]
    by_type = {t: _sum(messages_in, "rocketmq_messages_in_total", **node, message_type=t)
               for t in ("normal", "delay", "fifo", "transaction")}  # fmt: skip
    assert by_type == {"normal": 5, "delay": 1, "fifo": 1, "transaction": 3}
    _, bytes_in = families["rocketmq_throughput_in"]
    assert _sum(bytes_in, "rocketmq_throughput_in_total", topic="t",
                message_type="normal") == 3 * 100 + 5000 + 4  # fmt: skip

    _, sizes = families["rocketmq_message_size"]
    buckets = [s for s in sizes if s.name == "rocketmq_message_size_bucket"
               and s.labels["topic"] == "t" and s.labels["message_type"] == "normal"]  # fmt: skip
    bounds = [float(s.labels["le"]) for s in buckets]
    assert bounds == [*map(float, SIZE_BOUNDS), float("inf")]
    counts = {float(s.labels["le"]): s.value for s in buckets}
    assert counts[1024] == 4 and counts[4096] == 4 and counts[524288] == 5
    assert _sum(sizes, "rocketmq_message_size_count", topic="t", message_type="normal") == 5

    _, out = families["rocketmq_messages_out"]
    assert _sum(out, "rocketmq_messages_out_total", topic="t", consumer_group="g") == 4
    _, bytes_out = families["rocketmq_throughput_out"]
    assert _sum(bytes_out, "rocketmq_throughput_out_total", topic="t",
                consumer_group="g") == 3 * 100 + 5000  # fmt: skip

    group = {"topic": "t", "consumer_group": "g", "is_retry": "false"}
    _, ready = families["rocketmq_consumer_ready_messages"]
    assert _sum(ready, "rocketmq_consumer_ready_messages", **group) == 1  # "late"
    _, inflight = families["rocketmq_consumer_inflight_messages"]
    assert _sum(inflight, "rocketmq_consumer_inflight_messages", **group) == 2
    _, lag = families["rocketmq_consumer_lag_messages"]
    assert _sum(lag, "rocketmq_consumer_lag_messages", **group) == 3  # 2 in flight, 1 ready
    _, queueing = families["rocketmq_consumer_queueing_latency"]
    assert 0 <= _sum(queueing, "rocketmq_consumer_queueing_latency", **group) < 60_000
    assert {s.labels["is_retry"] for s in lag} == {"false", "true"}

    _, dlq = families["rocketmq_send_to_dlq_messages"]
    assert _sum(dlq, "rocketmq_send_to_dlq_messages_total", topic="t", consumer_group="g") == 1
    _, half = families["rocketmq_half_messages"]
    assert _sum(half, "rocketmq_half_messages", topic="tx") == 1
    for name, decided in (("commit", "rocketmq_commit_messages"),
                          ("rollback", "rocketmq_rollback_messages")):  # fmt: skip
        assert _sum(families[decided][1], f"{decided}_total", topic="tx") == 1, name
    _, topics = families["rocketmq_topic_number"]
    assert _sum(topics, "rocketmq_topic_number") == 3  # t, tx, f (no retry or DLQ topics)


def test_rpc_latency_has_rocketmqs_labels_and_buckets() -> None:
    assert list(RPC_LATENCY_MS_BUCKETS) == RPC_BOUNDS
    assert list(MESSAGE_SIZE_BUCKETS) == SIZE_BOUNDS
    metrics = ProxyMetrics(node_id="proxy-0")
    metrics.observe_rpc("SendMessage", "OK", 0.004)
    families = _families(metrics.registry)
    _check_list(families, ROCKETMQ_PROXY)
    _, samples = families["rocketmq_rpc_latency"]
    buckets = {float(s.labels["le"]): s.value for s in samples
               if s.name == "rocketmq_rpc_latency_bucket"}  # fmt: skip
    assert sorted(buckets) == [*map(float, RPC_BOUNDS), float("inf")]
    assert buckets[3] == 0 and buckets[5] == 1  # 4 ms, in milliseconds
    (count,) = [s for s in samples if s.name == "rocketmq_rpc_latency_count"]
    assert count.labels["protocol_type"] == "grpc" and count.labels["node_type"] == "proxy"
