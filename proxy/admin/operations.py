"""AdminService verbs on par with mqadmin: consumer progress, offset reset by time, message
query, DLQ list and resend, topic route and cluster status.

Everything goes through the brokers' ports (the same BrokerService a proxy uses for clients),
so it works the same for `popmq serve` and a cluster of `popmq broker` processes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.port import BrokerPort
from popmq.broker.contract.types import (
    DLQ_PREFIX,
    PROP_ORIGIN_MESSAGE_ID,
    PROP_ORIGIN_TOPIC,
    PROP_TRACE_CONTEXT,
    RETRY_PREFIX,
    Message,
    PullRequest,
    PullStatus,
    StoredMessage,
    TopicInfo,
)
from popmq.proxy.core import validate
from popmq.proxy.grpc import status as st
from popmq.proxy.services import ProxyServices

from popmq.errors import PopmqError
from popmq.lifecycle import fan_out
from popmq.metrics_http import build_version
from popmq.pb.admin.v1 import admin_pb2 as a

DEFAULT_MAX_SCAN = 10_000
DEFAULT_QUERY_LIMIT = 32
DEFAULT_DLQ_LIMIT = 100
# How many DLQ messages one resend may look through (newest first) per queue.
DLQ_SCAN = 100_000
PULL_BATCH = 256


def _address(port: BrokerPort) -> str:
    return getattr(port, "address", None) or "in-process"


def _view(broker: str, m: StoredMessage, include_body: bool) -> a.StoredMessageView:
    return a.StoredMessageView(
        broker=broker, topic=m.topic, queue_id=m.queue_id, queue_offset=m.queue_offset,
        message_id=m.message_id, tag=m.tag, keys=list(m.keys),
        born_timestamp_ms=m.born_timestamp_ms, store_timestamp_ms=m.store_timestamp_ms,
        reconsume_times=m.reconsume_times, body_size=len(m.body),
        body=m.body if include_body else b"",
        origin_topic=m.properties.get(PROP_ORIGIN_TOPIC, ""),
        origin_message_id=m.properties.get(PROP_ORIGIN_MESSAGE_ID, ""),
        properties={k: v for k, v in m.properties.items() if not k.startswith("__popmq.")},
    )  # fmt: skip


async def _scan(
    port: BrokerPort, topic: str, queue_id: int, low: int, high: int
) -> list[StoredMessage]:
    """Messages of one queue in [low, high), oldest first."""
    out: list[StoredMessage] = []
    offset = low
    while offset < high:
        result = await port.pull(
            PullRequest(topic, queue_id, offset, max_messages=min(PULL_BATCH, high - offset))
        )
        if result.status != PullStatus.FOUND or not result.messages:
            if result.next_offset <= offset:
                break
            offset = result.next_offset
            continue
        out += [m for m in result.messages if m.queue_offset < high]
        offset = result.next_offset
    return out


async def _store_time_ms(port: BrokerPort, topic: str, queue_id: int, offset: int) -> int:
    result = await port.pull(PullRequest(topic, queue_id, offset, max_messages=1))
    return result.messages[0].store_timestamp_ms if result.messages else 0


class OperationsMixin:
    """Mixed into AdminServicer (which provides ``services`` and ``_answer``)."""

    services: ProxyServices
    _answer: Callable[[type, Callable[[], Awaitable[Any]]], Awaitable[Any]]

    def _brokers(self) -> list[tuple[str, BrokerPort]]:
        cluster = self.services.cluster
        return list(zip(cluster.names, cluster.ports, strict=True))

    async def _topic_on_brokers(self, topic: str) -> list[tuple[str, BrokerPort, TopicInfo]]:
        cluster = self.services.cluster
        infos = await cluster.topic_infos(topic)
        return [(name, cluster.port(name), info) for name, info in infos.items()]

    async def _user_topics(self, topic: str) -> list[str]:
        if topic:
            return [validate.topic_name(topic)]
        per_broker = await fan_out(p.list_topics() for _, p in self._brokers())
        return sorted({i.name for infos in per_broker for i in infos if not i.name.startswith("%")})

    async def _require_group(self, group: str) -> None:
        """CONSUMER_GROUP_NOT_FOUND unless some broker has the group registered. Asked of
        list_groups: a broker's get_group registers a group it does not know (a client's
        first use), and a read must not create what it reads."""
        per_broker = await fan_out(p.list_groups() for _, p in self._brokers())
        if not any(s.config.name == group for summaries in per_broker for s in summaries):
            raise RefusedError(Code.CONSUMER_GROUP_NOT_FOUND, f"group {group!r} does not exist")

    # -- consumer progress ---------------------------------------------------------------
    async def ConsumerProgress(
        self, request: a.ConsumerProgressRequest, context: object
    ) -> a.ConsumerProgressResponse:
        async def work() -> a.ConsumerProgressResponse:
            group = validate.group_name(request.group)
            await self._require_group(group)
            response = a.ConsumerProgressResponse(status=st.ok())
            for topic in await self._user_topics(request.topic):
                for broker, port, _ in await self._topic_on_brokers(topic):
                    rows = await port.group_stats(group, topic)
                    # Without --topic, only topics the group has consumed from.
                    if not request.topic and not any(
                        r.consumer_offset > 0 or r.inflight or r.topic.startswith(RETRY_PREFIX)
                        for r in rows
                    ):
                        continue
                    now_ms = int(time.time() * 1000)
                    for row in rows:
                        latency = 0
                        if row.backlog:
                            stored = await _store_time_ms(
                                port, row.topic, row.queue_id, row.consumer_offset
                            )
                            latency = max(now_ms - stored, 0) if stored else 0
                        response.queues.append(
                            a.QueueProgress(
                                broker=broker, topic=row.topic, queue_id=row.queue_id,
                                consumer_offset=row.consumer_offset, max_offset=row.max_offset,
                                lag=row.backlog, inflight=row.inflight, lag_latency_ms=latency,
                            )
                        )  # fmt: skip
            return response

        return await self._answer(a.ConsumerProgressResponse, work)

    async def ResetOffset(
        self, request: a.ResetOffsetRequest, context: object
    ) -> a.ResetOffsetResponse:
        async def work() -> a.ResetOffsetResponse:
            group = validate.group_name(request.group)
            topic = validate.topic_name(request.topic)
            target = request.WhichOneof("to")
            if target is None:
                raise RefusedError(Code.BAD_REQUEST, "say where to: a time, earliest or latest")
            if target == "timestamp_ms" and request.timestamp_ms < 0:
                raise RefusedError(Code.BAD_REQUEST, "the time must not be before 1970")
            response = a.ResetOffsetResponse(status=st.ok())
            for broker, port, info in await self._topic_on_brokers(topic):
                for queue in info.queues:
                    if target == "earliest":
                        new = queue.min_offset
                    elif target == "latest":
                        new = queue.max_offset
                    else:
                        new = await port.offset_for_timestamp(
                            topic, queue.queue_id, request.timestamp_ms
                        )
                    old = await port.get_consumer_offset(group, topic, queue.queue_id)
                    await port.update_consumer_offset(group, topic, queue.queue_id, new)
                    response.queues.append(
                        a.OffsetReset(
                            broker=broker, queue_id=queue.queue_id, old_offset=old,
                            new_offset=new,
                        )
                    )  # fmt: skip
            return response

        return await self._answer(a.ResetOffsetResponse, work)

    # -- messages ------------------------------------------------------------------------
    async def _newest(
        self, topics: Iterable[str], max_scan: int
    ) -> tuple[list[tuple[str, StoredMessage]], bool]:
        """Up to max_scan newest messages of every queue of `topics` (newest first)."""
        found: list[tuple[str, StoredMessage]] = []
        truncated = False
        for topic in topics:
            for broker, port, info in await self._topic_on_brokers(topic):
                for queue in info.queues:
                    low = max(queue.min_offset, queue.max_offset - max_scan)
                    truncated |= low > queue.min_offset
                    for m in await _scan(port, topic, queue.queue_id, low, queue.max_offset):
                        found.append((broker, m))
        found.sort(key=lambda item: item[1].store_timestamp_ms, reverse=True)
        return found, truncated

    async def QueryMessages(
        self, request: a.QueryMessagesRequest, context: object
    ) -> a.QueryMessagesResponse:
        async def work() -> a.QueryMessagesResponse:
            if not request.message_id and not request.key:
                raise RefusedError(Code.BAD_REQUEST, "give a message id or a key")
            if request.max_scan < 0 or request.limit < 0:
                raise RefusedError(Code.BAD_REQUEST, "max_scan and limit must not be negative")
            topic = request.topic
            if topic:
                topic = validate.topic_name(topic, allow_dlq=True)
            topics = await self._user_topics("") if not topic else [topic]
            found, truncated = await self._newest(topics, request.max_scan or DEFAULT_MAX_SCAN)
            limit = request.limit or DEFAULT_QUERY_LIMIT
            response = a.QueryMessagesResponse(status=st.ok(), truncated=truncated)
            for broker, m in found:
                ids = (m.message_id, m.properties.get(PROP_ORIGIN_MESSAGE_ID, ""))
                if request.message_id and request.message_id not in ids:
                    continue
                if request.key and request.key not in m.keys:
                    continue
                response.messages.append(_view(broker, m, request.include_body))
                if len(response.messages) >= limit:
                    break
            return response

        return await self._answer(a.QueryMessagesResponse, work)

    # -- dead-letter queues --------------------------------------------------------------
    async def _dlq(self, group: str, scan: int) -> tuple[list[tuple[str, StoredMessage]], int]:
        dlq = f"{DLQ_PREFIX}{group}"
        try:
            on_brokers = await self._topic_on_brokers(dlq)
        except RefusedError as exc:
            if exc.code == Code.TOPIC_NOT_FOUND:  # nothing was ever dead-lettered
                return [], 0
            raise
        total = sum(q.max_offset - q.min_offset for _, _, i in on_brokers for q in i.queues)
        found, _ = await self._newest([dlq], scan)
        return found, total

    async def ListDlq(self, request: a.ListDlqRequest, context: object) -> a.ListDlqResponse:
        async def work() -> a.ListDlqResponse:
            group = validate.group_name(request.group)
            if request.limit < 0:
                raise RefusedError(Code.BAD_REQUEST, "limit must not be negative")
            limit = request.limit or DEFAULT_DLQ_LIMIT
            found, total = await self._dlq(group, limit)
            return a.ListDlqResponse(
                status=st.ok(), total=total,
                messages=[_view(b, m, include_body=False) for b, m in found[:limit]],
            )  # fmt: skip

        return await self._answer(a.ListDlqResponse, work)

    async def ResendDlq(self, request: a.ResendDlqRequest, context: object) -> a.ResendDlqResponse:
        async def work() -> a.ResendDlqResponse:
            group = validate.group_name(request.group)
            if request.all == bool(request.message_ids):
                raise RefusedError(Code.BAD_REQUEST, "give message ids or --all (not both)")
            found, _ = await self._dlq(group, DLQ_SCAN)
            wanted = set(request.message_ids)
            chosen = [
                (b, m) for b, m in found
                if request.all or wanted & {m.message_id, m.properties.get(PROP_ORIGIN_MESSAGE_ID)}
            ]  # fmt: skip
            missing = wanted - {
                i
                for _, m in chosen
                for i in (m.message_id, m.properties.get(PROP_ORIGIN_MESSAGE_ID))
            }
            if missing:
                raise RefusedError(
                    Code.MESSAGE_NOT_FOUND, f"not in {DLQ_PREFIX}{group}: {sorted(missing)}"
                )
            response = a.ResendDlqResponse(status=st.ok())
            for broker, m in reversed(chosen):  # oldest first, in their original order
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
                sent = await self.services.cluster.port(broker).send([copy])
                view = _view(broker, m, include_body=False)
                view.topic, view.queue_id = origin, sent[0].queue_id
                view.queue_offset, view.message_id = sent[0].queue_offset, sent[0].message_id
                response.resent.append(view)
            return response

        return await self._answer(a.ResendDlqResponse, work)

    # -- cluster -------------------------------------------------------------------------
    async def TopicRoute(
        self, request: a.TopicRouteRequest, context: object
    ) -> a.TopicRouteResponse:
        async def work() -> a.TopicRouteResponse:
            topic = validate.topic_name(request.topic, allow_dlq=True)
            services = self.services
            return a.TopicRouteResponse(
                status=st.ok(), topic=topic,
                proxy=f"{services.advertised_host}:{services.advertised_port}",
                brokers=[
                    a.RouteBroker(broker=b, address=_address(p), queue_count=i.queue_count)
                    for b, p, i in await self._topic_on_brokers(topic)
                ],
            )  # fmt: skip

        return await self._answer(a.TopicRouteResponse, work)

    async def ClusterStatus(
        self, request: a.ClusterStatusRequest, context: object
    ) -> a.ClusterStatusResponse:
        async def probe(name: str, port: BrokerPort) -> a.BrokerStatus:
            status = a.BrokerStatus(broker=name, address=_address(port))
            started = time.perf_counter()
            try:
                async with asyncio.timeout(5):
                    topics = await port.list_topics()
            except (PopmqError, TimeoutError, OSError) as exc:
                status.error = str(exc) or type(exc).__name__
                return status
            status.reachable = True
            status.rtt_ms = round((time.perf_counter() - started) * 1000, 2)
            status.topics = sum(1 for t in topics if not t.name.startswith("%"))
            return status

        services = self.services
        brokers = await fan_out(probe(n, p) for n, p in self._brokers())
        return a.ClusterStatusResponse(
            status=st.ok(), proxy=f"{services.advertised_host}:{services.advertised_port}",
            version=build_version(), brokers=brokers, clients=len(services.registry.clients()),
        )  # fmt: skip
