"""The admin operations (topics, groups, clients, stats; consumer progress, offset reset,
message query, DLQ list and resend, topic route and cluster status), applied across every
broker, domain in and domain out. The admin gRPC service (popmq.proxy.admin) translates.

Everything goes through the brokers' ports (the same BrokerService a proxy uses for clients),
so it works the same for `popmq serve` and a cluster of `popmq broker` processes.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import random
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.port import BrokerPort
from popmq.broker.contract.types import (
    DLQ_PREFIX,
    PROP_ORIGIN_MESSAGE_ID,
    PROP_ORIGIN_TOPIC,
    PROP_TRACE_CONTEXT,
    RETRY_PREFIX,
    ConsumeMode,
    GroupConfig,
    GroupQueueStats,
    HalfMessageInfo,
    Message,
    PullRequest,
    PullStatus,
    SendResult,
    StoredMessage,
    TopicInfo,
)
from popmq.proxy.cluster import BrokerCluster
from popmq.proxy.core import validate
from popmq.proxy.core.address import ProxyAddress
from popmq.proxy.registry import ClientInfo, ClientRegistry

from popmq.clock import SYSTEM, Clock
from popmq.config import parse_duration_ms
from popmq.coord.directory import status_json
from popmq.errors import PopmqError
from popmq.lifecycle import fan_out
from popmq.metrics_http import build_version

DEFAULT_MAX_SCAN = 10_000
DEFAULT_QUERY_LIMIT = 32
DEFAULT_DLQ_LIMIT = 100
PULL_BATCH = 256
MAX_TEST_BODY_BYTES = 4 * 1024 * 1024  # RocketMQ's default max message size
CLIENTS_PAGE = 500  # ListClients' page when the request names none
MAX_CLIENTS_PAGE = 1_000


def _page_token(last: ClientInfo) -> str:
    raw = json.dumps([last.client_id, last.access_key]).encode()
    return base64.urlsafe_b64encode(raw).decode()


# A token we give out holds one client id (a header: grpc caps metadata at 8 KiB) and one
# access key, far below this: a longer one is forged and refused before decoding. Nested JSON
# arrays made json recurse too deep (RecursionError): refused too.
_MAX_PAGE_TOKEN = 64 * 1024


def _page_key(token: str) -> tuple[str, str]:
    try:
        if len(token) > _MAX_PAGE_TOKEN:
            raise ValueError("too long")
        key = json.loads(base64.urlsafe_b64decode(token.encode()))
    except (ValueError, UnicodeError, RecursionError):
        key = None
    if not (isinstance(key, list) and len(key) == 2 and all(isinstance(k, str) for k in key)):
        raise RefusedError(Code.BAD_REQUEST, "page_token is not one this proxy gave out")
    return key[0], key[1]


@dataclass(frozen=True)
class ReadBounds:
    """How much an admin read may hold (proxy.admin_*): an admin asking for a whole topic
    must not make the proxy read it into memory. Asking past max_scan or max_results is
    BAD_REQUEST; a scan that reaches scan_bytes stops there, answered as truncated."""

    max_scan: int = 100_000  # messages per queue one query may look through
    max_results: int = 10_000  # messages one answer may hold (query, DLQ listing)
    scan_bytes: int = 64 * 1024 * 1024  # bytes of messages one scan holds at once

    def check(self, name: str, value: int, most: int, setting: str) -> int:
        if value < 0:
            raise RefusedError(Code.BAD_REQUEST, f"{name} must not be negative")
        if value > most:
            raise RefusedError(
                Code.BAD_REQUEST,
                f"{name} {value} is above this proxy's limit of {most} (proxy.{setting})",
            )
        return value


def _held_bytes(m: StoredMessage) -> int:
    return (
        len(m.body)
        + sum(len(k) for k in m.keys)
        + sum(len(k) + len(v) for k, v in m.properties.items())
    )


# A topic on each broker that has it, in the cluster's broker order.
TopicBrokers = list[tuple[str, TopicInfo]]
# A message and the broker it was read from.
Found = tuple[str, StoredMessage]


@dataclass(slots=True)
class GroupChanges:
    """What UpdateGroup changes (None: keep)."""

    consume_mode: str | None = None  # POP or PULL, any case
    max_attempts: int | None = None
    retry_levels: list[str] | None = None  # [] with reset: the broker's default levels
    reset_retry_levels: bool = False
    fifo: bool | None = None


@dataclass(slots=True)
class GroupRow:
    config: GroupConfig
    brokers: list[str] = field(default_factory=list)
    inflight: int = 0
    offset_queues: int = 0


@dataclass(slots=True)
class DeletedGroup:
    brokers: list[str]
    inflight: int
    offsets_removed: int


@dataclass(slots=True)
class QueueProgress:
    broker: str
    stats: GroupQueueStats
    lag_latency_ms: int


@dataclass(slots=True)
class Accumulation:
    """A group's backlog on a topic (its retry topic included), as RocketMQ's Admin counts it."""

    inflight: int = 0  # delivered, not acked
    accumulation: int = 0  # not acked (in flight or not delivered yet)
    oldest_ms: int = 0  # age of the oldest message not acked

    @property
    def ready(self) -> int:
        return max(self.accumulation - self.inflight, 0)


@dataclass(slots=True)
class OffsetReset:
    broker: str
    queue_id: int
    old_offset: int
    new_offset: int


@dataclass(slots=True)
class Resent:
    broker: str
    original: StoredMessage  # as it was in the DLQ
    topic: str  # where it went again
    sent: SendResult


@dataclass(slots=True)
class RouteBroker:
    broker: str
    address: str
    queue_count: int


@dataclass(slots=True)
class BrokerStatus:
    broker: str
    address: str
    reachable: bool = False
    rtt_ms: float = 0.0
    topics: int = 0
    error: str = ""


@dataclass(slots=True)
class ClusterStatus:
    proxy: str
    version: str
    brokers: list[BrokerStatus]
    clients: int
    # The replicated groups followed in etcd, as `popmq admin cluster status --etcd --json`
    # writes them (status_json): name, leader, epoch, in_sync, draining, nodes.
    groups: list[dict[str, Any]] = field(default_factory=list)


def broker_address(port: BrokerPort) -> str:
    return getattr(port, "address", None) or "in-process"


@dataclass(slots=True)
class _Spot:
    """A dead letter chosen for a resend, found: where it is and how much it holds (its body
    is not kept while the rest of the DLQ is read)."""

    broker: str
    queue_id: int
    offset: int
    ids: tuple[str, str]  # its message id and its origin's
    size: int  # _held_bytes


async def _pick(
    port: BrokerPort,
    broker: str,
    topic: str,
    queue_id: int,
    span: tuple[int, int],
    wanted: Callable[[StoredMessage], bool],
    room: list[int],
    refuse: Callable[[], RefusedError],
    window: int,
    largest: list[int],
) -> list[_Spot]:
    """Where the ``wanted`` messages of one queue in ``span`` [low, high) are, oldest first,
    their sizes counted against ``room[0]`` (``refuse()`` is raised before they would pass
    it). Only their places are kept, so each pull asks for as many messages as ``window``
    fits at the largest size seen so far (``largest[0]``, shared by the queues; one while none
    is known): what a pull hands over stays within it, give or take one message larger than
    any before it, however many were chosen already."""
    out: list[_Spot] = []
    offset, high = span
    while offset < high:
        fits = window // largest[0] if largest[0] else 1
        count = max(1, min(PULL_BATCH, high - offset, fits))
        result = await port.pull(PullRequest(topic, queue_id, offset, max_messages=count))
        if result.status != PullStatus.FOUND or not result.messages:
            if result.next_offset <= offset:
                break
            offset = result.next_offset
            continue
        for m in result.messages:
            if m.queue_offset >= high:
                continue
            size = _held_bytes(m)
            largest[0] = max(largest[0], size)
            if not wanted(m):
                continue
            if size > room[0]:
                raise refuse()
            room[0] -= size
            ids = (m.message_id, m.properties.get(PROP_ORIGIN_MESSAGE_ID, ""))
            out.append(_Spot(broker, queue_id, m.queue_offset, ids, size))
        offset = result.next_offset
    return out


async def _fetch(port: BrokerPort, topic: str, spots: list[_Spot]) -> list[StoredMessage]:
    """The messages at ``spots`` (one queue's, oldest first) read again, consecutive offsets
    in one pull: what is read is what was counted. A message no longer there (retention ran
    meanwhile) is MESSAGE_NOT_FOUND, before anything is sent."""
    out: list[StoredMessage] = []
    at = 0
    while at < len(spots):
        first = spots[at]
        run = 1
        while (
            at + run < len(spots)
            and run < PULL_BATCH
            and spots[at + run].offset == first.offset + run
        ):
            run += 1
        result = await port.pull(PullRequest(topic, first.queue_id, first.offset, max_messages=run))
        got = {m.queue_offset: m for m in result.messages}
        for spot in spots[at : at + run]:
            m = got.get(spot.offset)
            if m is None and spot is not first and spot.offset >= result.next_offset:
                break  # the pull stopped short (its byte bound): the next one starts here
            if m is None or m.message_id != spot.ids[0]:
                raise RefusedError(
                    Code.MESSAGE_NOT_FOUND,
                    f"{spot.ids[0]} left {topic} before it was resent (retention?); "
                    "nothing was resent",
                )
            out.append(m)
            at += 1
    return out


async def _scan_newest(
    port: BrokerPort, topic: str, queue_id: int, low: int, high: int, room: list[int]
) -> tuple[list[StoredMessage], bool]:
    """Messages of one queue in [low, high), newest chunk first, until ``room[0]`` bytes are
    used up; and whether older ones were left unread for it."""
    chunks: list[list[StoredMessage]] = []
    top = high
    while top > low and room[0] > 0:
        start = max(low, top - PULL_BATCH)
        chunk: deque[StoredMessage] = deque()
        held = 0
        cut = False
        offset = start
        while offset < top:  # read forward, drop from the old end past the room left
            result = await port.pull(
                PullRequest(topic, queue_id, offset, max_messages=min(PULL_BATCH, top - offset))
            )
            if result.status != PullStatus.FOUND or not result.messages:
                if result.next_offset <= offset:
                    break
                offset = result.next_offset
                continue
            for m in result.messages:
                if m.queue_offset < top:
                    chunk.append(m)
                    held += _held_bytes(m)
            while chunk and held > room[0]:
                held -= _held_bytes(chunk.popleft())
                cut = True
            offset = result.next_offset
        room[0] -= held
        chunks.append(list(chunk))
        if cut:  # older messages of this queue stay unread
            break
        top = start
    return [m for chunk in reversed(chunks) for m in chunk], top > low


async def _store_time_ms(port: BrokerPort, topic: str, queue_id: int, offset: int) -> int:
    result = await port.pull(PullRequest(topic, queue_id, offset, max_messages=1))
    return result.messages[0].store_timestamp_ms if result.messages else 0


class Admin:
    def __init__(
        self,
        cluster: BrokerCluster,
        registry: ClientRegistry,
        metrics_text: Callable[[], str],
        address: ProxyAddress,
        bounds: ReadBounds | None = None,
        clock: Clock = SYSTEM,
        cluster_name: str = "DefaultCluster",
    ) -> None:
        self.clock = clock  # born times of console sends, consumer lag
        self.cluster = cluster
        self.registry = registry
        self.metrics_text = metrics_text  # the metrics, read (Prometheus' text format)
        self.cluster_name = cluster_name
        self.address = address
        self.bounds = bounds or ReadBounds()

    @property
    def proxy(self) -> str:
        """This proxy's address, as admin answers name it."""
        return str(self.address.bound)

    def _brokers(self) -> list[tuple[str, BrokerPort]]:
        cluster = self.cluster
        return list(zip(cluster.names, cluster.ports, strict=True))

    async def _topic_on_brokers(self, topic: str) -> list[tuple[str, BrokerPort, TopicInfo]]:
        cluster = self.cluster
        infos = await cluster.topic_infos(topic)
        return [(name, cluster.port(name), info) for name, info in infos.items()]

    async def _user_topics(self, topic: str) -> list[str]:
        if topic:
            return [validate.topic_name(topic)]
        per_broker = await fan_out(p.list_topics() for _, p in self._brokers())
        return sorted({i.name for infos in per_broker for i in infos if not i.name.startswith("%")})

    # -- topics ------------------------------------------------------------------------------
    async def create_topic(
        self, name: str, queue_count: int, brokers: list[str], message_type: str = ""
    ) -> TopicBrokers:
        """On ``brokers`` ([]: every broker); ``message_type`` a MessageType name ("": keep
        an existing topic's, MIXED for a new one)."""
        name = validate.topic_name(name)
        if queue_count < 1:
            raise RefusedError(Code.BAD_REQUEST, "queue count must be at least 1")
        cluster = self.cluster
        brokers = brokers or cluster.names
        infos = await fan_out(
            cluster.port(b).create_topic(name, queue_count, message_type) for b in brokers
        )
        cluster.forget_topic(name)
        return list(zip(brokers, infos, strict=True))

    async def list_topics(self, include_system: bool) -> list[tuple[str, TopicBrokers]]:
        """Every topic by name, with the brokers that have it."""
        cluster = self.cluster
        per_broker = await fan_out(p.list_topics() for p in cluster.ports)
        topics: dict[str, TopicBrokers] = {}
        for broker, infos in zip(cluster.names, per_broker, strict=True):
            for info in infos:
                system = info.name.startswith((RETRY_PREFIX, DLQ_PREFIX, "%"))
                if system and not include_system:
                    continue
                topics.setdefault(info.name, []).append((broker, info))
        return [(name, topics[name]) for name in sorted(topics)]

    async def describe_topic(
        self, name: str, group: str = ""
    ) -> tuple[TopicBrokers, list[tuple[str, GroupQueueStats]]]:
        """The topic on each broker and, with ``group``, the group's progress on each queue."""
        name = validate.topic_name(name, allow_dlq=True)
        infos = list((await self.cluster.topic_infos(name)).items())
        rows: list[tuple[str, GroupQueueStats]] = []
        if group:
            group = validate.group_name(group)
            brokers = [b for b, _ in infos]
            stats = await fan_out(self.cluster.port(b).group_stats(group, name) for b in brokers)
            for broker, broker_rows in zip(brokers, stats, strict=True):
                rows += [(broker, row) for row in broker_rows]
        return infos, rows

    async def delete_topic(self, name: str) -> None:
        name = validate.topic_name(name, allow_dlq=True)
        cluster = self.cluster
        infos = await cluster.topic_infos(name)
        await fan_out(cluster.port(b).delete_topic(name) for b in infos)
        cluster.forget_topic(name)

    # -- groups ------------------------------------------------------------------------------
    async def _require_group(self, group: str) -> None:
        """CONSUMER_GROUP_NOT_FOUND unless some broker has the group registered. Asked of
        list_groups: a broker's get_group registers a group it does not know (a client's
        first use), and a read must not create what it reads."""
        per_broker = await fan_out(p.list_groups() for p in self.cluster.ports)
        if not any(s.config.name == group for summaries in per_broker for s in summaries):
            raise RefusedError(Code.CONSUMER_GROUP_NOT_FOUND, f"group {group!r} does not exist")

    async def get_group(self, name: str) -> GroupConfig:
        name = validate.group_name(name)
        await self._require_group(name)
        return await self.cluster.ports[0].get_group(name)

    async def update_group(self, name: str, changes: GroupChanges) -> GroupConfig:
        name = validate.group_name(name)
        cluster = self.cluster
        current = await cluster.ports[0].get_group(name)
        updates: dict[str, Any] = {}
        if changes.consume_mode is not None:
            mode = changes.consume_mode.upper()
            if mode not in ConsumeMode.__members__:
                raise RefusedError(Code.BAD_REQUEST, "consume mode must be POP or PULL")
            updates["consume_mode"] = ConsumeMode[mode]
        if changes.max_attempts is not None:
            if changes.max_attempts < 1:
                raise RefusedError(Code.BAD_REQUEST, "max attempts must be at least 1")
            updates["max_attempts"] = changes.max_attempts
        if changes.reset_retry_levels:
            updates["retry_levels"] = []
        elif changes.retry_levels:
            for level in changes.retry_levels:
                try:
                    parse_duration_ms(level)
                except ValueError as exc:
                    raise RefusedError(Code.BAD_REQUEST, str(exc)) from None
            updates["retry_levels"] = list(changes.retry_levels)
        if changes.fifo is not None:
            updates["fifo"] = changes.fifo
        return await cluster.update_group(dataclasses.replace(current, **updates))

    async def list_groups(self) -> list[GroupRow]:
        cluster = self.cluster
        per_broker = await fan_out(p.list_groups() for p in cluster.ports)
        groups: dict[str, GroupRow] = {}
        for broker, summaries in zip(cluster.names, per_broker, strict=True):
            for s in summaries:
                row = groups.setdefault(s.config.name, GroupRow(s.config))
                row.brokers.append(broker)
                row.inflight += s.inflight
                row.offset_queues += s.offset_queues
        return [groups[name] for name in sorted(groups)]

    async def list_transactions(self) -> list[tuple[str, HalfMessageInfo]]:
        """Undecided transactional messages of every broker, as (broker, half message)."""
        cluster = self.cluster
        per_broker = await fan_out(p.list_transactions() for p in cluster.ports)
        return [
            (broker, half)
            for broker, halves in zip(cluster.names, per_broker, strict=True)
            for half in halves
        ]

    async def resolve_transaction(self, message_id: str, commit: bool) -> tuple[str, str]:
        """Commit or roll back the undecided transactional message ``message_id`` (an
        operator's decision, source ADMIN); its (broker, topic). NOT_FOUND if no broker holds
        it undecided."""
        if not message_id:
            raise RefusedError(Code.ILLEGAL_MESSAGE_ID, "a message id is required")
        for broker, half in await self.list_transactions():
            if half.message_id == message_id:
                await self.cluster.port(broker).end_transaction(
                    half.topic, half.message_id, half.transaction_id, commit, "ADMIN"
                )
                return broker, half.topic
        raise RefusedError(
            Code.NOT_FOUND, f"no undecided transactional message {message_id} on any broker"
        )

    async def delete_group(self, name: str, clean_offsets: bool, force: bool) -> DeletedGroup:
        name = validate.group_name(name)
        cluster = self.cluster
        per_broker = await fan_out(p.list_groups() for p in cluster.ports)
        holders = [
            (broker, port, summary)
            for broker, port, summaries in zip(
                cluster.names, cluster.ports, per_broker, strict=True
            )
            for summary in summaries
            if summary.config.name == name
        ]
        if not holders:
            raise RefusedError(Code.CONSUMER_GROUP_NOT_FOUND, f"group {name!r} does not exist")
        inflight = sum(s.inflight for _, _, s in holders)
        if inflight and not force:  # checked before any broker changes
            raise RefusedError(
                Code.PRECONDITION_FAILED,
                f"group {name!r} has {inflight} messages in flight; ack them or wait for "
                "their invisible time, or delete with force (they then revive as usual)",
            )
        done = await fan_out(
            port.delete_group(name, clean_offsets, force) for _, port, _ in holders
        )
        cluster.forget_group(name)
        return DeletedGroup(
            brokers=[broker for broker, _, _ in holders],
            inflight=sum(d.inflight for d in done),
            offsets_removed=sum(d.offsets_removed for d in done),
        )

    # -- clients and stats -------------------------------------------------------------------
    def clients(self, group: str = "") -> list[ClientInfo]:
        return self.registry.clients(group or None)

    def clients_page(
        self, group: str = "", page_size: int = 0, page_token: str = ""
    ) -> tuple[list[ClientInfo], str]:
        """One page of clients, in (client id, access key) order, after ``page_token`` (the
        last client of the previous page: clients that come or go between pages shift no
        other one); and the next page's token, "" after the last page."""
        if page_size < 0 or page_size > MAX_CLIENTS_PAGE:
            raise RefusedError(
                Code.BAD_REQUEST, f"page_size must be 0..{MAX_CLIENTS_PAGE} (0: {CLIENTS_PAGE})"
            )
        size = page_size or CLIENTS_PAGE
        after = _page_key(page_token) if page_token else None
        found = self.registry.clients(group or None)
        if after is not None:
            found = [c for c in found if (c.client_id, c.access_key) > after]
        page = found[:size]
        more = len(found) > size
        return page, _page_token(page[-1]) if more else ""

    def stats_text(self) -> str:
        """The proxy's metrics in Prometheus' text format."""
        return self.metrics_text()

    def change_log_level(self, level: str) -> str:
        """Set the level of popmq's loggers in this proxy process (RocketMQ's TRACE is DEBUG
        here, WARN is WARNING); returns the level set."""
        name = {"TRACE": "DEBUG", "WARN": "WARNING"}.get(level, level)
        if name not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise RefusedError(Code.BAD_REQUEST, f"unknown log level {level!r}")
        logging.getLogger("popmq").setLevel(name)
        logging.getLogger("popmq").warning("log level of popmq's loggers set to %s", name)
        return name

    async def send_test_message(
        self, topic: str, body: bytes, tag: str, keys: list[str], properties: dict[str, str]
    ) -> tuple[str, Message, SendResult]:
        """Send one message to a broker of ``topic`` picked at random (as a producer spreads
        its sends): (broker, what was sent, the broker's result)."""
        topic = validate.topic_name(topic)
        if len(body) > MAX_TEST_BODY_BYTES:
            raise RefusedError(Code.MESSAGE_BODY_TOO_LARGE, "the body is over 4 MiB")
        # As a producer's send is checked: a __popmq.* property would be the broker's own
        # (__popmq.transaction made a half message that no producer would ever check back).
        validate.tag(tag)
        if keys:
            validate.keys(keys)
        if properties:
            validate.properties(properties)
        infos = await self.cluster.topic_infos(topic)
        broker = random.choice(list(infos))
        message = Message(
            topic=topic, body=body, tag=tag, keys=keys, properties=properties,
            born_timestamp_ms=self.clock.now_ms(), born_host="popmq-console",
        )  # fmt: skip
        sent = await self.cluster.port(broker).send([message])
        return broker, message, sent[0]

    async def group_accumulation(self, group: str, topics: list[str]) -> dict[str, Accumulation]:
        """The group's backlog per topic it consumed (or per topic of ``topics``), its retry
        topic's counted with the topic it retries."""
        rows: list[tuple[str, QueueProgress]] = []
        for topic in topics or [""]:
            rows += [(topic, row) for row in await self.consumer_progress(group, topic)]
        found: dict[str, Accumulation] = {}
        for topic, row in rows:
            name = topic or _retried_topic(group, row.stats.topic)
            into = found.setdefault(name, Accumulation())
            into.inflight += row.stats.inflight
            into.accumulation += row.stats.backlog
            into.oldest_ms = max(into.oldest_ms, row.lag_latency_ms)
        return found

    # -- consumer progress and offsets -------------------------------------------------------
    async def consumer_progress(self, group: str, topic: str = "") -> list[QueueProgress]:
        """The group's progress on each queue of ``topic`` (""; every topic it consumed)."""
        group = validate.group_name(group)
        await self._require_group(group)
        found: list[QueueProgress] = []
        for name in await self._user_topics(topic):
            for broker, port, _ in await self._topic_on_brokers(name):
                rows = await port.group_stats(group, name)
                # Without a topic, only topics the group has consumed from.
                if not topic and not any(
                    r.consumer_offset > 0 or r.inflight or r.topic.startswith(RETRY_PREFIX)
                    for r in rows
                ):
                    continue
                now_ms = self.clock.now_ms()
                for row in rows:
                    latency = 0
                    if row.backlog:
                        stored = await _store_time_ms(
                            port, row.topic, row.queue_id, row.consumer_offset
                        )
                        latency = max(now_ms - stored, 0) if stored else 0
                    found.append(QueueProgress(broker, row, latency))
        return found

    async def reset_offset(
        self, group: str, topic: str, to: str | None, timestamp_ms: int = 0
    ) -> list[OffsetReset]:
        """``to``: "earliest", "latest" or "timestamp_ms" (then ``timestamp_ms``)."""
        group = validate.group_name(group)
        topic = validate.topic_name(topic)
        if to is None:
            raise RefusedError(Code.BAD_REQUEST, "say where to: a time, earliest or latest")
        if to == "timestamp_ms" and timestamp_ms < 0:
            raise RefusedError(Code.BAD_REQUEST, "the time must not be before 1970")
        done: list[OffsetReset] = []
        for broker, port, info in await self._topic_on_brokers(topic):
            for queue in info.queues:
                if to == "earliest":
                    new = queue.min_offset
                elif to == "latest":
                    new = queue.max_offset
                else:
                    new = await port.offset_for_timestamp(topic, queue.queue_id, timestamp_ms)
                old = await port.get_consumer_offset(group, topic, queue.queue_id)
                await port.update_consumer_offset(group, topic, queue.queue_id, new)
                done.append(OffsetReset(broker, queue.queue_id, old, new))
        return done

    # -- messages ----------------------------------------------------------------------------
    async def _newest(self, topics: Iterable[str], max_scan: int) -> tuple[list[Found], bool]:
        """Up to max_scan newest messages of every queue of `topics` (newest first), no more
        than bounds.scan_bytes of them (truncated: some queue held older ones unread)."""
        found: list[Found] = []
        truncated = False
        room = [self.bounds.scan_bytes]
        for topic in topics:
            for broker, port, info in await self._topic_on_brokers(topic):
                for queue in info.queues:
                    low = max(queue.min_offset, queue.max_offset - max_scan)
                    truncated |= low > queue.min_offset
                    read, cut = await _scan_newest(
                        port, topic, queue.queue_id, low, queue.max_offset, room
                    )
                    truncated |= cut
                    found += [(broker, m) for m in read]
        found.sort(key=lambda item: item[1].store_timestamp_ms, reverse=True)
        return found, truncated

    async def query_messages(
        self,
        message_id: str,
        key: str,
        topic: str = "",
        max_scan: int = 0,
        limit: int = 0,
        *,
        start_ms: int = 0,
        end_ms: int = 0,
    ) -> tuple[list[Found], bool]:
        """Messages by id (theirs or their origin's), key or store time in [start_ms, end_ms)
        (0: unbounded), newest first; and whether the scan stopped short of some queue's
        oldest message."""
        if not (message_id or key or start_ms or end_ms):
            raise RefusedError(Code.BAD_REQUEST, "give a message id, a key or a time range")
        if start_ms < 0 or end_ms < 0:
            raise RefusedError(Code.BAD_REQUEST, "times must not be before 1970")
        bounds = self.bounds
        max_scan = bounds.check("max_scan", max_scan, bounds.max_scan, "admin_max_scan")
        limit = bounds.check("limit", limit, bounds.max_results, "admin_max_results")
        if topic:
            topic = validate.topic_name(topic, allow_dlq=True)
        topics = await self._user_topics("") if not topic else [topic]
        default_scan = min(DEFAULT_MAX_SCAN, bounds.max_scan)
        found, truncated = await self._newest(topics, max_scan or default_scan)
        limit = limit or min(DEFAULT_QUERY_LIMIT, bounds.max_results)
        matches: list[Found] = []
        for broker, m in found:
            ids = (m.message_id, m.properties.get(PROP_ORIGIN_MESSAGE_ID, ""))
            if message_id and message_id not in ids:
                continue
            if key and key not in m.keys:
                continue
            if m.store_timestamp_ms < start_ms or (end_ms and m.store_timestamp_ms >= end_ms):
                continue
            matches.append((broker, m))
            if len(matches) >= limit:
                break
        return matches, truncated

    # -- dead-letter queues ------------------------------------------------------------------
    async def _dlq_on_brokers(self, group: str) -> list[tuple[str, BrokerPort, TopicInfo]]:
        try:
            return await self._topic_on_brokers(f"{DLQ_PREFIX}{group}")
        except RefusedError as exc:
            if exc.code == Code.TOPIC_NOT_FOUND:  # nothing was ever dead-lettered
                return []
            raise

    async def list_dlq(self, group: str, limit: int = 0) -> tuple[list[Found], int, bool]:
        """The group's newest dead letters (up to ``limit``), how many there are, and whether
        the listing stopped at bounds.scan_bytes before ``limit``."""
        group = validate.group_name(group)
        bounds = self.bounds
        limit = bounds.check("limit", limit, bounds.max_results, "admin_max_results")
        limit = limit or min(DEFAULT_DLQ_LIMIT, bounds.max_results)
        on_brokers = await self._dlq_on_brokers(group)
        if not on_brokers:
            return [], 0, False
        total = sum(q.max_offset - q.min_offset for _, _, i in on_brokers for q in i.queues)
        found, truncated = await self._newest([f"{DLQ_PREFIX}{group}"], limit)
        # Cut for bytes, not for the limit: there were more than fit.
        truncated = truncated and len(found) < min(limit, total)
        return found[:limit], total, truncated

    async def resend_dlq(self, group: str, message_ids: list[str], all_: bool) -> list[Resent]:
        """Send dead letters again to their original topic, oldest first."""
        group = validate.group_name(group)
        if all_ == bool(message_ids):
            raise RefusedError(Code.BAD_REQUEST, "give message ids or --all (not both)")
        wanted = set(message_ids)
        dlq = f"{DLQ_PREFIX}{group}"

        # Found first, then resent: a missing id must leave every other one unsent. The scan
        # keeps where the chosen messages are and counts their bytes: it refuses before they
        # would pass proxy.admin_scan_bytes. Then they alone are read again (and their bodies
        # kept only until each is sent again).
        def wanted_message(m: StoredMessage) -> bool:
            return all_ or bool(wanted & {m.message_id, m.properties.get(PROP_ORIGIN_MESSAGE_ID)})

        def too_much() -> RefusedError:
            return RefusedError(
                Code.BAD_REQUEST,
                f"the messages to resend from {dlq} hold more than "
                f"proxy.admin_scan_bytes ({self.bounds.scan_bytes} bytes): resend "
                "them by message ids, in parts",
            )

        room = [self.bounds.scan_bytes]  # what the chosen ones may still hold
        largest = [0]
        spots: list[_Spot] = []
        ports: dict[str, BrokerPort] = {}
        for broker, port, info in await self._dlq_on_brokers(group):
            ports[broker] = port
            for queue in info.queues:
                spots += await _pick(
                    port, broker, dlq, queue.queue_id, (queue.min_offset, queue.max_offset),
                    wanted_message, room, too_much, self.bounds.scan_bytes, largest,
                )  # fmt: skip
        missing = wanted - {i for spot in spots for i in spot.ids if i}
        if missing:
            raise RefusedError(
                Code.MESSAGE_NOT_FOUND, f"not in {DLQ_PREFIX}{group}: {sorted(missing)}"
            )
        # All of them read again before any is sent.
        chosen: list[Found] = []
        by_queue: dict[tuple[str, int], list[_Spot]] = {}
        for spot in spots:
            by_queue.setdefault((spot.broker, spot.queue_id), []).append(spot)
        for (broker, _), queue_spots in by_queue.items():
            chosen += [(broker, m) for m in await _fetch(ports[broker], dlq, queue_spots)]
        chosen.sort(key=lambda item: item[1].store_timestamp_ms)
        resent: list[Resent] = []
        for broker, m in chosen:  # oldest first, in their original order
            origin = m.properties.get(PROP_ORIGIN_TOPIC)
            if not origin:
                raise RefusedError(
                    Code.BAD_REQUEST, f"message {m.message_id} does not name its topic"
                )
            # the producer's trace context stays; the DLQ bookkeeping goes
            properties = {
                k: v
                for k, v in m.properties.items()
                if k == PROP_TRACE_CONTEXT or not k.startswith("__popmq.")
            }
            copy = Message(
                topic=origin, body=m.body, tag=m.tag, keys=list(m.keys),
                properties=properties, message_group=m.message_group,
                born_timestamp_ms=m.born_timestamp_ms, born_host=m.born_host,
            )  # fmt: skip
            sent = await self.cluster.port(broker).send([copy])
            resent.append(Resent(broker, m, origin, sent[0]))
        return resent

    # -- cluster -----------------------------------------------------------------------------
    async def topic_route(self, topic: str) -> list[RouteBroker]:
        topic = validate.topic_name(topic, allow_dlq=True)
        return [
            RouteBroker(b, broker_address(p), i.queue_count)
            for b, p, i in await self._topic_on_brokers(topic)
        ]

    async def cluster_status(self) -> ClusterStatus:
        async def probe(name: str, port: BrokerPort) -> BrokerStatus:
            status = BrokerStatus(broker=name, address=broker_address(port))
            started = self.clock.monotonic()  # a measurement for the reader, not a deadline
            try:
                with anyio.fail_after(5):  # a cancel scope: TimeoutError past it
                    topics = await port.list_topics()
            except (PopmqError, TimeoutError, OSError) as exc:
                status.error = str(exc) or type(exc).__name__
                return status
            status.reachable = True
            status.rtt_ms = round((self.clock.monotonic() - started) * 1000, 2)
            status.topics = sum(1 for t in topics if not t.name.startswith("%"))
            return status

        brokers = await fan_out(probe(n, p) for n, p in self._brokers())
        return ClusterStatus(
            proxy=self.proxy,
            version=build_version(),
            brokers=list(brokers),
            clients=len(self.registry.clients()),
            groups=cast(list[dict[str, Any]], status_json(self.cluster.group_views)["groups"]),
        )


def _retried_topic(group: str, topic: str) -> str:
    """The topic a retry topic of ``group`` retries (%RETRY%group+topic, or the V1
    %RETRY%group_topic); ``topic`` itself for any other."""
    for prefix in (f"{RETRY_PREFIX}{group}+", f"{RETRY_PREFIX}{group}_"):
        if topic.startswith(prefix):
            return topic[len(prefix) :]
    return topic
