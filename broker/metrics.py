"""A broker's Prometheus metrics (names are stable; docs/operations.md explains each one).

Each Broker owns one ``BrokerMetrics`` with its own registry, so several brokers in one process
(``popmq serve``, tests) do not mix their counts; every series carries a ``broker`` label so the
registries of embedded brokers can be served together (``merged_registry``).

Two kinds of numbers:
- counters and gauges the broker moves as it works (one ``inc`` per batch, never per message);
- state read at scrape time (``BrokerStateCollector``): backlog and in-flight per (group,
  topic), DLQ sizes, pending timer entries, revive/DLQ totals and commitlog size. That state
  lives on the broker's event loop while the HTTP server scrapes from its own thread, so the
  collector computes it on the loop (``call_soon_threadsafe``) and waits a bounded time.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import (
    DLQ_PREFIX,
    PROP_TRANSACTION,
    RETRY_PREFIX,
    SYSTEM_PREFIX,
    GroupQueueStats,
    Message,
    PoppedMessage,
    PopStatus,
)
from popmq.broker.names import parse_retry_topic
from popmq.broker.store.damage import DamageEvent, MetadataFallback
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from popmq.metric_specs import build_all, spec

if TYPE_CHECKING:
    from popmq.broker.core import Broker

log = logging.getLogger(__name__)

HOLD_KINDS = ("pop", "pull", "notify")
# RocketMQ 5's common labels of every rocketmq_* series.
ROCKETMQ_LABELS = ("cluster", "node_type", "node_id")
# rocketmq_message_size's buckets in bytes, as RocketMQ's broker sets them: 1 KiB, 4 KiB,
# 512 KiB, 1 MiB, 2 MiB, 4 MiB (and +Inf).
MESSAGE_SIZE_BUCKETS = (1024, 4096, 512 * 1024, 1 << 20, 2 << 20, 4 << 20)
# The consumer-state gauges' labels: RocketMQ's broker splits each (topic, group) into its
# topic proper (is_retry="false") and its retry topic (is_retry="true").
CONSUMER_LABELS = (*ROCKETMQ_LABELS, "topic", "consumer_group", "is_retry", "is_system")
_OK = int(Code.OK)
# How long a scrape waits for the broker's loop; a loop blocked longer loses these series for
# that scrape instead of hanging the scrape.
SCRAPE_TIMEOUT_S = 5.0
# At most this many (group, topic) series per scrape, so a broker with very many groups keeps
# its scrape cheap (each pair costs one look at each of its queues).
MAX_GROUP_SERIES = 2_000


_IN = (*ROCKETMQ_LABELS, "topic", "message_type")
_OUT = (*ROCKETMQ_LABELS, "topic", "consumer_group")
_STORE_FAULT = ("broker", "file", "reason")
# The metrics the broker moves as it works, declared once (BrokerMetrics builds them; its hooks
# below record them). rocketmq_message_size and the state read at scrape time are collectors.
# Dashboards and alerts (helm/, deploy/) and docs/operations.md read these names.
MESSAGES_IN = spec(
    Counter, "rocketmq_messages_in", "Messages produced into the topic, by message type "
    "(normal, fifo, delay, transaction; RocketMQ's metric)", *_IN,
)  # fmt: skip
THROUGHPUT_IN = spec(
    Counter, "rocketmq_throughput_in", "Body bytes produced into the topic, by message type "
    "(RocketMQ's metric)", *_IN,
)  # fmt: skip
MESSAGES_OUT = spec(
    Counter, "rocketmq_messages_out", "Messages delivered to consumers (RocketMQ's metric)", *_OUT
)
THROUGHPUT_OUT = spec(
    Counter, "rocketmq_throughput_out", "Body bytes delivered to consumers (RocketMQ's metric)",
    *_OUT,
)  # fmt: skip
COMMITS = spec(
    Counter, "rocketmq_commit_messages", "Transactional messages committed (RocketMQ's metric)",
    *ROCKETMQ_LABELS, "topic",
)  # fmt: skip
ROLLBACKS = spec(
    Counter, "rocketmq_rollback_messages", "Transactional messages rolled back (RocketMQ's metric)",
    *ROCKETMQ_LABELS, "topic",
)  # fmt: skip
STORED = spec(
    Counter, "popmq_broker_messages_stored",
    "Messages stored by producers' sends, by topic (delay messages when accepted)",
    "broker", "topic",
)  # fmt: skip
POP_REQUESTS = spec(
    Counter, "popmq_broker_pop_requests", "Pop requests answered, by result", "broker", "result"
)
POPPED = spec(Counter, "popmq_broker_popped_messages", "Messages handed out by pops", "broker")
ACKS = spec(
    Counter, "popmq_broker_acks", "Ack entries, by result (failed: unknown, expired or forged "
    "receipt handles)", "broker", "result",
)  # fmt: skip
INVISIBLE_CHANGES = spec(
    Counter, "popmq_broker_invisible_time_changes",
    "Successful changeInvisibleTime calls (including nacks to 0)", "broker",
)  # fmt: skip
TIMER_DELIVERIES = spec(
    Counter, "popmq_broker_timer_deliveries",
    "Messages the timer moved to their topic (delay messages and retry backoffs)", "broker",
)  # fmt: skip
RECALLED = spec(
    Counter, "popmq_broker_messages_recalled",
    "Delay messages recalled (RecallMessage) before their delivery time", "broker",
)  # fmt: skip
HALF_MESSAGES = spec(
    Counter, "popmq_broker_transaction_half_messages",
    "Transactional messages stored as half messages (invisible until committed)", "broker",
)  # fmt: skip
TRANSACTIONS_ENDED = spec(
    Counter, "popmq_broker_transactions_ended",
    "Transactions decided, by resolution (COMMIT, ROLLBACK) and source (CLIENT, "
    "SERVER_CHECK, ADMIN); repeats of a decision are not counted",
    "broker", "resolution", "source",
)  # fmt: skip
TRANSACTION_CHECKS = spec(
    Counter, "popmq_broker_transaction_checks",
    "Check-backs of undecided half messages handed to proxies", "broker",
)  # fmt: skip
TRANSACTIONS_PARKED = spec(
    Counter, "popmq_broker_transactions_parked",
    "Half messages parked for an operator after transaction.max_checks checks without "
    "a decision", "broker",
)  # fmt: skip
CHECKPOINTS_SPILLED = spec(
    Counter, "popmq_broker_checkpoints_spilled",
    "Checkpoints written to the pop journal because they were not acked within "
    "pop.checkpoint_buffer_ms", "broker",
)  # fmt: skip
HELD_REQUESTS = spec(
    Gauge, "popmq_broker_held_requests", "Long polls waiting in the hold table, by kind",
    "broker", "kind",
)  # fmt: skip
POLLING_FULL = spec(
    Counter, "popmq_broker_polling_full", "Long polls refused because the hold table was full",
    "broker", "kind",
)  # fmt: skip
QUARANTINED_FRAMES = spec(
    Counter, "popmq_broker_store_quarantined_frames",
    "Records lost to damaged, missing or torn bytes found at startup, by file and "
    "reason (torn_tail, damaged, missing, unreadable); the bytes are kept in "
    "DATA/quarantine/", *_STORE_FAULT,
)  # fmt: skip
QUARANTINED_BYTES = spec(
    Counter, "popmq_broker_store_quarantined_bytes",
    "Damaged, missing or torn bytes found at startup, by file and reason", *_STORE_FAULT,
)  # fmt: skip
METADATA_FALLBACKS = spec(
    Counter, "popmq_broker_store_metadata_fallbacks",
    "Metadata files found missing or damaged at startup, by file and action "
    "(previous_copy, rebuilt, full_scan, reset)", "broker", "file", "action",
)  # fmt: skip
HELD_LIMIT = spec(
    Gauge, "popmq_broker_held_requests_limit", "broker.polling.max_held_total", "broker"
)
AUTO_CREATE_REFUSED = spec(
    Counter, "popmq_broker_auto_create_refused",
    "Topics or groups not auto-created, by kind and reason (disabled, total, rate)",
    "broker", "kind", "reason",
)  # fmt: skip
# In the order /metrics lists them (rocketmq_message_size, a collector, comes third).
BROKER_METRICS = (
    MESSAGES_IN, THROUGHPUT_IN, MESSAGES_OUT, THROUGHPUT_OUT, COMMITS, ROLLBACKS, STORED,
    POP_REQUESTS, POPPED, ACKS, INVISIBLE_CHANGES, TIMER_DELIVERIES, RECALLED, HALF_MESSAGES,
    TRANSACTIONS_ENDED, TRANSACTION_CHECKS, TRANSACTIONS_PARKED, CHECKPOINTS_SPILLED,
    HELD_REQUESTS, POLLING_FULL, QUARANTINED_FRAMES, QUARANTINED_BYTES, METADATA_FALLBACKS,
    HELD_LIMIT, AUTO_CREATE_REFUSED,
)  # fmt: skip


class BrokerMetrics:
    """BROKER_METRICS of one broker, built from the table, and the hooks the broker calls with
    what happened (``stored``, ``popped``, ``acked``, ...): nothing else touches a metric."""

    def __init__(
        self,
        broker: str,
        registry: CollectorRegistry | None = None,
        cluster: str = "DefaultCluster",
    ) -> None:
        self.broker = broker
        self.cluster = cluster
        self.registry = r = registry or CollectorRegistry()
        # RocketMQ 5's names and labels, for its operators' dashboards (docs/operations.md).
        node = [cluster, "broker", broker]
        self.instruments: dict[str, Any] = build_all(BROKER_METRICS, r)
        m = self.instruments
        self._in, self._bytes_in = m[MESSAGES_IN.name], m[THROUGHPUT_IN.name]
        self._sizes = _SizeHistograms(
            "rocketmq_message_size", "Body sizes of the messages produced, in bytes "
            "(RocketMQ's metric and buckets)", list(_IN), MESSAGE_SIZE_BUCKETS,
        )  # fmt: skip
        self._sizes.node = tuple(node)
        r.register(self._sizes)
        self._in_by_key: dict[tuple[str, str], tuple[Any, Any]] = {}
        self._out, self._bytes_out = m[MESSAGES_OUT.name], m[THROUGHPUT_OUT.name]
        self._out_by_key: dict[tuple[str, str], tuple[Any, Any]] = {}
        self._commits, self._rollbacks = m[COMMITS.name], m[ROLLBACKS.name]
        self._node = node
        self._stored = m[STORED.name]
        self._stored_by_topic: dict[str, Any] = {}
        pops = m[POP_REQUESTS.name]
        self._pops = {
            status: pops.labels(broker, result) for status, result in _POP_RESULTS.items()
        }
        self._popped = m[POPPED.name].labels(broker)
        acks = m[ACKS.name]
        self._acks_ok, self._acks_failed = acks.labels(broker, "ok"), acks.labels(broker, "failed")
        self._invisible = m[INVISIBLE_CHANGES.name].labels(broker)
        self._timer = m[TIMER_DELIVERIES.name].labels(broker)
        self._recalled = m[RECALLED.name].labels(broker)
        self._tx_prepared = m[HALF_MESSAGES.name].labels(broker)
        self._tx_ended = m[TRANSACTIONS_ENDED.name]
        self._tx_checks = m[TRANSACTION_CHECKS.name].labels(broker)
        self._tx_parked = m[TRANSACTIONS_PARKED.name].labels(broker)
        self._spilled = m[CHECKPOINTS_SPILLED.name]
        self._spilled_child = self._spilled.labels(broker)
        held = m[HELD_REQUESTS.name]
        self.held = {kind: held.labels(broker, kind) for kind in HOLD_KINDS}
        full = m[POLLING_FULL.name]
        self.polling_full = {kind: full.labels(broker, kind) for kind in HOLD_KINDS}
        self._quarantined_frames = m[QUARANTINED_FRAMES.name]
        self._quarantined_bytes = m[QUARANTINED_BYTES.name]
        self._metadata_fallbacks = m[METADATA_FALLBACKS.name]
        self.held_limit = m[HELD_LIMIT.name].labels(broker)
        self._auto_create_refused = m[AUTO_CREATE_REFUSED.name]
        # Every series exported from the start (at 0), so rate() sees the first refusal.
        self._auto_create_refused_by = {
            (kind, reason): self._auto_create_refused.labels(broker, kind, reason)
            for kind in ("topic", "group")
            for reason in ("disabled", "total", "rate")
        }

    # -- hooks (cheap: one inc per call or batch) --------------------------------------------
    def stored(self, topic: str, count: int) -> None:
        child = self._stored_by_topic.get(topic)
        if child is None:
            child = self._stored_by_topic[topic] = self._stored.labels(self.broker, topic)
        child.inc(count)

    def received(self, arrivals: dict[tuple[str, str], list[int]]) -> None:
        """A send's messages by (topic, message type): their body sizes. RocketMQ counts a
        message in when the broker accepts it (delay and half messages included)."""
        for key, sizes in arrivals.items():
            children = self._in_by_key.get(key)
            if children is None:
                values = (*self._node, *key)
                children = self._in_by_key[key] = (
                    self._in.labels(*values), self._bytes_in.labels(*values)
                )  # fmt: skip
            children[0].inc(len(sizes))
            children[1].inc(sum(sizes))
            self._sizes.observe(key, sizes)

    def popped(self, status: PopStatus, messages: list[PoppedMessage], group: str = "",
               topic: str = "") -> None:  # fmt: skip
        self._pops[status].inc()
        if messages:
            self._popped.inc(len(messages))
            key = (topic, group)
            out = self._out_by_key.get(key)
            if out is None:
                values = (*self._node, topic, group)
                out = self._out_by_key[key] = (
                    self._out.labels(*values), self._bytes_out.labels(*values)
                )  # fmt: skip
            out[0].inc(len(messages))
            out[1].inc(sum(len(popped.message.body) for popped in messages))

    def acked(self, codes: Iterable[int]) -> None:
        ok = failed = 0
        for code in codes:
            if code == _OK:
                ok += 1
            else:
                failed += 1
        if ok:
            self._acks_ok.inc(ok)
        if failed:
            self._acks_failed.inc(failed)

    def invisible_changed(self) -> None:
        self._invisible.inc()

    def timer_delivered(self, count: int) -> None:
        if count:
            self._timer.inc(count)

    def recalled(self) -> None:
        self._recalled.inc()

    def transactions_prepared(self, count: int) -> None:
        self._tx_prepared.inc(count)

    def transaction_ended(self, commit: bool, source: str, topic: str = "") -> None:
        resolution = "COMMIT" if commit else "ROLLBACK"
        self._tx_ended.labels(self.broker, resolution, source or "CLIENT").inc()
        (self._commits if commit else self._rollbacks).labels(*self._node, topic).inc()

    def transaction_checks(self, checks: int, parked: int) -> None:
        if checks:
            self._tx_checks.inc(checks)
        if parked:
            self._tx_parked.inc(parked)

    def auto_create_refused(self, kind: str, reason: str) -> None:
        self._auto_create_refused_by[kind, reason].inc()

    def spilled(self, count: int) -> None:
        if count:
            self._spilled_child.inc(count)

    def store_faults(self, damage: Iterable[DamageEvent],
                     metadata: Iterable[MetadataFallback]) -> None:  # fmt: skip
        """Count what recovery found damaged on disk (once per start)."""
        for event in damage:
            values = (self.broker, event.file, event.reason)
            self._quarantined_frames.labels(*values).inc(event.frames_lost)
            self._quarantined_bytes.labels(*values).inc(event.size)
        for fallback in metadata:
            self._metadata_fallbacks.labels(self.broker, fallback.file, fallback.action).inc()

    def watch(self, snapshot: Callable[[], BrokerSnapshot | None]) -> BrokerStateCollector:
        """Serve the broker's state, read by ``snapshot`` on the broker's loop (set the
        returned collector's ``loop`` when it runs), at each scrape."""
        collector = BrokerStateCollector(self.broker, snapshot, self.cluster)
        self.registry.register(collector)
        return collector


def message_type(message: Message) -> str:
    """RocketMQ's message_type label value, in its order: a half message is transaction, a
    message with a delivery time delay, one with a message group fifo, the rest normal."""
    if PROP_TRANSACTION in message.properties:
        return "transaction"
    if message.delivery_timestamp_ms:
        return "delay"
    return "fifo" if message.message_group else "normal"


class _SizeHistograms(Collector):
    """A histogram fed a batch at a time (one bisect per message, no lock per observation):
    the send path's cost stays near a counter's."""

    def __init__(self, name: str, doc: str, labels: list[str],
                 buckets: tuple[int, ...]) -> None:  # fmt: skip
        self._name, self._doc, self._labels, self._buckets = name, doc, labels, buckets
        self.node: tuple[str, ...] = ()
        self._rows: dict[tuple[str, ...], list[int]] = {}  # bucket counts (+Inf last), sum

    def observe(self, key: tuple[str, ...], sizes: list[int]) -> None:
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = [0] * (len(self._buckets) + 2)
        buckets = self._buckets
        for size in sizes:
            row[bisect.bisect_left(buckets, size)] += 1
        row[-1] += sum(sizes)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self._name, self._doc, labels=self._labels)
        for key, row in list(self._rows.items()):
            row = list(row)  # the loop may add to it meanwhile
            cumulative, running = [], 0
            for bound, count in zip((*self._buckets, "+Inf"), row[:-1], strict=True):
                running += count
                cumulative.append((floatToGoString(bound), running))
            family.add_metric([*self.node, *key], cumulative, sum_value=row[-1])
        yield family


_POP_RESULTS = {
    PopStatus.FOUND: "found",
    PopStatus.NO_MESSAGE: "empty",
    PopStatus.POLLING_FULL: "polling_full",
}


@dataclass(slots=True)
class GroupRow:
    group: str
    topic: str
    backlog: int  # not yet consumed in the topic's queues
    retry_backlog: int  # not yet consumed in the group's retry topic for it
    inflight: int  # popped, not yet acked (both)


@dataclass(slots=True)
class ConsumerRow:
    """RocketMQ's view of one (group, topic): the topic proper or its retry topic."""

    group: str
    topic: str
    is_retry: bool
    lag: int = 0  # not acked (ready + in flight + acked out of order)
    inflight: int = 0  # popped, not yet acked
    ready: int = 0  # visible and not popped yet
    lag_latency_ms: int = 0  # now - store time of the oldest message not acked
    queueing_latency_ms: int = 0  # now - store time of the oldest ready message


@dataclass(slots=True)
class BrokerSnapshot:
    revived: int
    dead_lettered: int
    timer_pending: int
    inflight_gone: int
    data_dir: Path
    transactions_pending: int = 0
    # Per background loop ("timer", "revive"): failed attempts, and entries parked.
    loop_failures: dict[str, int] = field(default_factory=dict)
    loop_parked: dict[str, int] = field(default_factory=dict)
    corrupt_reads: int = 0
    write_failures: int = 0
    groups: list[GroupRow] = field(default_factory=list)
    groups_dropped: int = 0  # pairs past MAX_GROUP_SERIES
    dlq_stored: dict[str, int] = field(default_factory=dict)  # group -> messages in its DLQ
    open_files: int = 0
    open_files_limit: int = 0
    open_file_evictions: int = 0
    flush_failures: int = 0
    handle_key_reload_failures: int = 0
    # (group, first topic) -> messages sent to the group's DLQ since the broker started
    dlq_sent: dict[tuple[str, str], int] = field(default_factory=dict)
    consumers: list[ConsumerRow] = field(default_factory=list)
    topics: int = 0  # user topics (no retry, DLQ or system ones)
    groups_known: int = 0
    half_messages: dict[str, int] = field(default_factory=dict)  # topic -> undecided


def take_snapshot(broker: Broker, now_ms: Callable[[], int]) -> BrokerSnapshot | None:
    """The broker's state for one scrape (on its loop); None while it is stopped."""
    if not broker.started:
        return None
    revive = broker.revive_service
    snap = BrokerSnapshot(
        revived=revive.revived,
        dead_lettered=revive.dead_lettered,
        timer_pending=broker.timer.pending,
        inflight_gone=broker.engine.gone_inflight,
        transactions_pending=broker.transactions.pending,
        data_dir=broker.store.data_dir,
        loop_failures={
            "timer": broker.timer.failures.failed_attempts,
            "revive": revive.failures.failed_attempts,
        },
        loop_parked={"timer": broker.timer.failures.parked, "revive": revive.failures.parked},
        corrupt_reads=broker.store.corrupt_records_read,
        open_files=broker.store.open_files.open_count,
        open_files_limit=broker.store.open_files.capacity,
        open_file_evictions=broker.store.open_files.evictions,
        flush_failures=broker.store.flush_failures,
        write_failures=broker.store.write_failures,
        handle_key_reload_failures=broker.engine.keyring.reload_failures,
    )
    pairs = sorted(_group_topics(broker))
    snap.groups_dropped = max(len(pairs) - MAX_GROUP_SERIES, 0)
    for group, topic in pairs[:MAX_GROUP_SERIES]:
        try:
            stats = broker.group_stats_now(group, topic)
        except RefusedError:  # the topic was deleted
            continue
        row = GroupRow(group, topic, 0, 0, 0)
        rows = (ConsumerRow(group, topic, False), ConsumerRow(group, topic, True))
        now = now_ms()
        for queue in stats:
            if queue.topic == topic:
                row.backlog += queue.backlog
            else:
                row.retry_backlog += queue.backlog
            row.inflight += queue.inflight
            _add_queue(broker, rows[queue.topic != topic], queue, now)
        snap.groups.append(row)
        snap.consumers += rows
    for meta in broker.store.list_topics():
        if meta.name.startswith(DLQ_PREFIX):
            stored = sum(
                broker.store.max_offset(meta.name, q) - broker.store.min_offset(meta.name, q)
                for q in range(meta.queue_count)
            )
            snap.dlq_stored[meta.name[len(DLQ_PREFIX) :]] = stored
        elif not meta.name.startswith((RETRY_PREFIX, SYSTEM_PREFIX)):
            snap.topics += 1
    snap.dlq_sent = dict(revive.dead_lettered_by)
    snap.groups_known = len({group for group, _ in pairs})
    for half in broker.transactions.halves():
        snap.half_messages[half.topic] = snap.half_messages.get(half.topic, 0) + 1
    return snap


def _add_queue(broker: Broker, row: ConsumerRow, queue: GroupQueueStats, now_ms: int) -> None:
    """Add one queue to ``row`` as RocketMQ's lag calculator counts it: ready messages are
    those past the group's pop cursor (and those released back below it), in flight those
    popped and not acked, lag everything from the consumer offset on."""
    row.lag += queue.backlog
    row.inflight += queue.inflight
    if not queue.backlog:
        return
    stored = _store_time_ms(broker, queue.topic, queue.queue_id, queue.consumer_offset)
    if stored:
        row.lag_latency_ms = max(row.lag_latency_ms, now_ms - stored)
    state = broker.ledger.existing_queue(row.group, queue.topic, queue.queue_id)
    if state is None:  # nothing popped since start: all of the backlog is ready
        ready, first = queue.backlog, queue.consumer_offset
    else:
        cursor = state.pop_offset
        skipped = sum(1 for offset in (*state.inflight, *state.done_ahead) if offset >= cursor)
        ready = max(queue.max_offset - cursor - skipped, 0) + len(state.released)
        first = state.released[0] if state.released else cursor
    row.ready += ready
    if ready:
        stored = _store_time_ms(broker, queue.topic, queue.queue_id, first)
        if stored:
            row.queueing_latency_ms = max(row.queueing_latency_ms, now_ms - stored)


def _store_time_ms(broker: Broker, topic: str, queue_id: int, offset: int) -> int:
    """Store time of the message at `offset` (or the oldest kept one); 0 when unreadable."""
    store = broker.store
    try:
        offset = max(offset, store.min_offset(topic, queue_id))
        read = store.read(topic, queue_id, offset, 1)
    except Exception:  # purged or deleted meanwhile: no figure this scrape
        return 0
    return read.messages[0].store_timestamp_ms if read.messages else 0


def _group_topics(broker: Broker) -> set[tuple[str, str]]:
    """(group, topic) pairs the broker knows a consumer position for: queues it popped since
    start (or recovered with messages in flight) and committed consumer offsets, so a group
    whose consumers are all down after a restart still shows its backlog."""
    keys = list(broker.ledger.queues)
    keys += broker.store.consumer_offset_keys()
    pairs: set[tuple[str, str]] = set()
    for group, topic, _ in keys:
        if group.startswith(SYSTEM_PREFIX):  # the timer's own progress
            continue
        if topic.startswith(RETRY_PREFIX):
            parsed = parse_retry_topic(topic)
            if parsed is not None:  # V2: %RETRY%group+topic
                if parsed[0] != group:
                    continue
                topic = parsed[1]
            else:  # V1 (before the upgrade): %RETRY%group_topic
                prefix = f"{RETRY_PREFIX}{group}_"
                if not topic.startswith(prefix):
                    continue
                topic = topic[len(prefix) :]
        pairs.add((group, topic))
    return pairs


def commitlog_usage(data_dir: Path) -> tuple[int, int]:
    """(bytes, segments) of the commitlog on disk; segment files are named by 20 digits."""
    total = segments = 0
    try:
        entries = list((data_dir / "commitlog").iterdir())
    except OSError:
        return 0, 0
    for entry in entries:
        if len(entry.name) == 20 and entry.name.isdigit():
            try:
                total += entry.stat().st_size
            except OSError:  # deleted by retention meanwhile
                continue
            segments += 1
    return total, segments


class BrokerStateCollector(Collector):
    def __init__(
        self,
        broker: str,
        snapshot: Callable[[], BrokerSnapshot | None],
        cluster: str = "DefaultCluster",
    ) -> None:
        self._broker = broker
        self._node = [cluster, "broker", broker]
        self._snapshot = snapshot
        self.loop: asyncio.AbstractEventLoop | None = None  # set when the broker starts

    def describe(self) -> list[Metric]:
        return []  # computed at scrape time; nothing to check against other collectors

    def collect(self) -> Iterator[Metric]:
        snap = self._take()
        if snap is None:
            return
        b = [self._broker]
        yield _counter("popmq_broker_revived_messages",
                       "Un-acked messages sent to a retry topic (or released in place for FIFO) "
                       "after their invisible time", b, snap.revived)  # fmt: skip
        yield _counter("popmq_broker_dead_lettered_messages",
                       "Messages moved to a dead-letter queue (max attempts reached, or asked "
                       "by the client)", b, snap.dead_lettered)  # fmt: skip
        yield _counter("popmq_broker_inflight_gone_messages",
                       "Popped, un-acked messages whose body retention deleted before they "
                       "came due: finished without a delivery (each batch is logged)", b,
                       snap.inflight_gone)  # fmt: skip
        yield _gauge(
            "popmq_broker_timer_pending_messages",
            "Delay messages and retries waiting in the timer",
            b,
            snap.timer_pending,
        )
        yield _gauge(
            "popmq_broker_transaction_pending_half_messages",
            "Transactional half messages without a decision (parked ones included)",
            b,
            snap.transactions_pending,
        )
        failures = CounterMetricFamily(
            "popmq_broker_loop_failures",
            "Failed attempts of an entry in a background loop (timer delivery, revive); each "
            "is retried with backoff and parked after the last",
            labels=["broker", "loop"],
        )
        parked = CounterMetricFamily(
            "popmq_broker_parked_entries",
            "Entries a background loop could not process and parked: timer entries go to "
            "%SYS%TIMER_PARKED, revived messages to their group's DLQ",
            labels=["broker", "loop"],
        )
        for loop in sorted(snap.loop_failures):
            failures.add_metric([self._broker, loop], snap.loop_failures[loop])
            parked.add_metric([self._broker, loop], snap.loop_parked.get(loop, 0))
        yield failures
        yield parked
        size, segments = commitlog_usage(snap.data_dir)
        yield _gauge("popmq_broker_commitlog_bytes", "Bytes of commitlog on disk", b, size)
        yield _gauge("popmq_broker_commitlog_segments", "Commitlog segment files", b, segments)
        yield _counter("popmq_broker_store_corrupt_reads",
                       "Damaged records found by reads (damage older than recovery's walk), "
                       "each skipped, copied to DATA/quarantine/ and counted once; run popmq "
                       "broker verify", b, snap.corrupt_reads)  # fmt: skip
        yield _gauge("popmq_broker_store_open_files",
                     "Index and segment descriptors the store holds open (its file budget)",
                     b, snap.open_files)  # fmt: skip
        yield _gauge("popmq_broker_store_open_files_limit", "broker.store.max_open_files",
                     b, snap.open_files_limit)  # fmt: skip
        yield _counter("popmq_broker_store_file_evictions",
                       "Idle store files closed to stay within the file budget",
                       b, snap.open_file_evictions)  # fmt: skip
        yield _counter("popmq_broker_store_flush_failures",
                       "Periodic flushes (fsync, checkpoint) that failed; while the last one "
                       "failed, sends wait for their own fsync",
                       b, snap.flush_failures)  # fmt: skip
        yield _counter("popmq_broker_store_write_failures",
                       "Sends refused because the store could not write (disk full, read-only "
                       "or failing volume)", b, snap.write_failures)  # fmt: skip
        yield _counter("popmq_broker_handle_key_reload_failures",
                       "Changed receipt-handle key files that could not be loaded (the broker "
                       "keeps its current keys; fix the file)",
                       b, snap.handle_key_reload_failures)  # fmt: skip
        labels = ["broker", "group", "topic"]
        backlog = GaugeMetricFamily(
            "popmq_broker_group_backlog_messages",
            "Messages of the topic the group has not acked yet (max offset - consumer offset; "
            "includes in-flight ones)",
            labels=labels,
        )
        retry = GaugeMetricFamily(
            "popmq_broker_group_retry_backlog_messages",
            "Messages waiting in the group's retry topic for this topic", labels=labels
        )  # fmt: skip
        inflight = GaugeMetricFamily(
            "popmq_broker_group_inflight_messages",
            "Messages popped by the group and not yet acked", labels=labels,
        )  # fmt: skip
        for row in snap.groups:
            values = [self._broker, row.group, row.topic]
            backlog.add_metric(values, row.backlog)
            retry.add_metric(values, row.retry_backlog)
            inflight.add_metric(values, row.inflight)
        yield from (backlog, retry, inflight)
        yield _gauge("popmq_broker_group_series_dropped",
                     f"(group, topic) pairs left out of this scrape (over {MAX_GROUP_SERIES})",
                     b, snap.groups_dropped)  # fmt: skip
        dlq = GaugeMetricFamily(
            "popmq_broker_dlq_stored_messages",
            "Messages stored in the group's dead-letter queue (%DLQ%group), until retention",
            labels=["broker", "group"],
        )
        for group, count in sorted(snap.dlq_stored.items()):
            dlq.add_metric([self._broker, group], count)
        yield dlq
        yield from self._rocketmq(snap, size)

    def _rocketmq(self, snap: BrokerSnapshot, storage_bytes: int) -> Iterator[Metric]:
        """The same state under RocketMQ 5's names and labels."""
        labels = list(CONSUMER_LABELS)
        families = {
            "lag": GaugeMetricFamily(
                "rocketmq_consumer_lag_messages",
                "Messages the group has not acked (is_retry: of the topic or its retry topic)",
                labels=labels,
            ),
            "inflight": GaugeMetricFamily(
                "rocketmq_consumer_inflight_messages",
                "Messages delivered to the group and not yet acked", labels=labels,
            ),
            "ready": GaugeMetricFamily(
                "rocketmq_consumer_ready_messages",
                "Messages visible to the group and not delivered yet", labels=labels,
            ),
            "lag_latency_ms": GaugeMetricFamily(
                "rocketmq_consumer_lag_latency",
                "Milliseconds since the oldest message the group has not acked was stored",
                labels=labels,
            ),
            "queueing_latency_ms": GaugeMetricFamily(
                "rocketmq_consumer_queueing_latency",
                "Milliseconds since the oldest message ready for the group (not delivered) "
                "was stored", labels=labels,
            ),
        }  # fmt: skip
        for row in snap.consumers:
            values = [*self._node, row.topic, row.group, _bool(row.is_retry), "false"]
            for attribute, family in families.items():
                family.add_metric(values, getattr(row, attribute))
        yield from families.values()
        dlq = CounterMetricFamily(
            "rocketmq_send_to_dlq_messages",
            "Messages sent to the group's dead-letter queue since the broker started, by the "
            "topic they were first sent to", labels=[*ROCKETMQ_LABELS, "topic", "consumer_group"],
        )  # fmt: skip
        for (group, topic), total in sorted(snap.dlq_sent.items()):
            dlq.add_metric([*self._node, topic, group], total)
        yield dlq
        half = GaugeMetricFamily(
            "rocketmq_half_messages", "Transactional half messages without a decision",
            labels=[*ROCKETMQ_LABELS, "topic"],
        )  # fmt: skip
        for topic, count in sorted(snap.half_messages.items()):
            half.add_metric([*self._node, topic], count)
        yield half
        for name, doc, value in (
            ("rocketmq_topic_number", "Topics on the broker (no retry or DLQ topics)", snap.topics),
            ("rocketmq_consumer_group_number", "Consumer groups with a position on the broker",
             snap.groups_known),
        ):  # fmt: skip
            family = GaugeMetricFamily(name, doc, labels=list(ROCKETMQ_LABELS))
            family.add_metric(self._node, value)
            yield family
        storage = GaugeMetricFamily(
            "rocketmq_storage_size", "Bytes of message storage on disk (commitlog)",
            labels=list(ROCKETMQ_LABELS),
        )  # fmt: skip
        storage.add_metric(self._node, storage_bytes)
        yield storage

    def _take(self) -> BrokerSnapshot | None:
        loop = self.loop
        if loop is None or loop.is_closed():
            return None
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:  # scraped from the loop itself (tests, admin): read directly
            return self._snapshot()
        if not loop.is_running():
            return None
        future: concurrent.futures.Future[BrokerSnapshot | None] = concurrent.futures.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(self._snapshot())
            except BaseException as exc:  # reported to the scraping thread
                future.set_exception(exc)

        try:
            loop.call_soon_threadsafe(run)
            return future.result(timeout=SCRAPE_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            log.warning("broker %s: loop busy for %.0f s; state metrics skipped this scrape",
                        self._broker, SCRAPE_TIMEOUT_S)  # fmt: skip
        except RuntimeError:  # the loop closed in between
            pass
        except Exception:
            log.exception("broker %s: reading state for metrics failed", self._broker)
        return None


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _counter(name: str, doc: str, values: list[str], value: float) -> Metric:
    family = CounterMetricFamily(name, doc, labels=["broker"])
    family.add_metric(values, value)
    return family


def _gauge(name: str, doc: str, values: list[str], value: float) -> Metric:
    family = GaugeMetricFamily(name, doc, labels=["broker"])
    family.add_metric(values, value)
    return family


class MergedCollector(Collector):
    """Several registries as one: families of the same name (one per embedded broker) become
    one family, because the text format allows each name once."""

    def __init__(self, registries: Iterable[CollectorRegistry]) -> None:
        self._registries = list(registries)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for registry in self._registries:
            for family in registry.collect():
                into = merged.get(family.name)
                if into is None:
                    into = merged[family.name] = Metric(
                        family.name, family.documentation, family.type, family.unit
                    )
                into.samples.extend(family.samples)
        yield from merged.values()


def merged_registry(registries: Iterable[CollectorRegistry]) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(MergedCollector(registries))
    return registry
