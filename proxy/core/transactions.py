"""Transactional messages at the proxy: EndTransaction, and the check-back loop.

A transaction id names its broker in clear (broker/transaction_id.py), so EndTransaction goes
to that broker, which opens the sealed rest. The check-back loop asks each broker, every
``transaction_check_poll_ms``, for the half messages due for a check among the topics that
producers connected here declared (a broker counts each one it hands out, so two proxies never
ask about the same message within one check interval), and hands each to a live producer of
its topic through that producer's Telemetry stream (``ProducerChannels``). gRPC producers have
no group: as in RocketMQ's proxy, any producer that declared the topic may answer.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass

import anyio
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import PROP_TX_TRACE, StoredMessage
from popmq.broker.transaction_id import peek_transaction_broker
from popmq.proxy.cluster import BrokerCluster
from popmq.proxy.core import validate
from popmq.proxy.events import ProxyEvents

from popmq.tracing import continue_from, link_to, tracer

log = logging.getLogger(__name__)

RESOLUTIONS = ("COMMIT", "ROLLBACK")
SOURCES = ("CLIENT", "SERVER_CHECK", "ADMIN")


@dataclass(slots=True)
class OrphanCheck:
    """What a producer is asked: 'commit or roll back this message?'"""

    message: StoredMessage
    transaction_id: str


# Hands a check to one producer's stream; False when the stream is gone or full.
Deliver = Callable[[OrphanCheck], bool]


class ProducerChannels:
    """The Telemetry streams of producers connected to this proxy, by the topics they declared."""

    def __init__(self) -> None:
        self._streams: dict[object, tuple[frozenset[str], Deliver]] = {}
        self._turn = itertools.count()

    def open(self, key: object, topics: set[str], deliver: Deliver) -> None:
        self._streams[key] = (frozenset(topics), deliver)

    def close(self, key: object) -> None:
        self._streams.pop(key, None)

    def topics(self) -> set[str]:
        return {topic for topics, _ in self._streams.values() for topic in topics}

    def deliver(self, check: OrphanCheck) -> bool:
        """Hand the check to one producer of its topic (taking turns); False if none took it."""
        candidates = [d for topics, d in self._streams.values() if check.message.topic in topics]
        if not candidates:
            return False
        start = next(self._turn)
        return any(candidates[(start + i) % len(candidates)](check) for i in range(len(candidates)))


class Transactions:
    def __init__(
        self,
        cluster: BrokerCluster,
        channels: ProducerChannels,
        metrics: ProxyEvents,
        poll_ms: int = 1_000,
    ) -> None:
        self.cluster = cluster
        self.channels = channels
        self.metrics = metrics
        self.poll_ms = poll_ms

    async def end(
        self, topic: str, message_id: str, transaction_id: str, resolution: str, source: str
    ) -> None:
        """EndTransaction: COMMIT or ROLLBACK, routed by the transaction id's broker."""
        topic = validate.topic_name(topic)
        if resolution == "TRANSACTION_RESOLUTION_UNSPECIFIED":
            return  # "unknown yet" (a checker's answer): nothing decided, asked again later
        if resolution not in RESOLUTIONS:
            raise RefusedError(
                Code.BAD_REQUEST, f"transaction resolution must be COMMIT or ROLLBACK, not "
                f"{resolution}",
            )  # fmt: skip
        if not message_id:
            raise RefusedError(Code.ILLEGAL_MESSAGE_ID, "EndTransaction needs the message id")
        broker = peek_transaction_broker(transaction_id)
        if broker not in self.cluster.names:
            raise RefusedError(
                Code.INVALID_TRANSACTION_ID, f"invalid transaction id: no broker {broker!r} here"
            )
        await self.cluster.port(broker).end_transaction(
            topic, message_id, transaction_id, resolution == "COMMIT",
            source if source in SOURCES else "CLIENT",
        )  # fmt: skip

    async def check_once(self) -> int:
        """One round: claim due checks from every broker for the topics producers here
        declared, and hand each to one of them. Returns how many were handed over."""
        topics = sorted(self.channels.topics())
        if not topics:
            return 0
        handed = 0
        for name in self.cluster.names:
            try:
                due = await self.cluster.port(name).claim_transaction_checks(topics)
            except Exception as exc:  # a broker down: the others are still checked
                log.debug("transaction checks: broker %s did not answer (%s)", name, exc)
                continue
            for check in due:
                # Each check joins its half send's trace (and links to that span).
                traceparent = check.message.properties.get(PROP_TX_TRACE, "")
                link = link_to(traceparent)
                with tracer().start_as_current_span(
                    "popmq.transaction.check", context=continue_from(traceparent),
                    links=[link] if link is not None else None,
                    attributes={"messaging.message.id": check.message.message_id,
                                "messaging.destination.name": check.message.topic,
                                "popmq.transaction.checks": check.checks},
                ) as span:  # fmt: skip
                    delivered = self.channels.deliver(
                        OrphanCheck(check.message, check.transaction_id)
                    )
                    span.set_attribute("popmq.transaction.handed_over", delivered)
                if delivered:
                    handed += 1
                else:  # the producer left meanwhile: the next check interval asks again
                    log.info("transaction check of message %s (%s): no producer took it",
                             check.message.message_id, check.message.topic)  # fmt: skip
        self.metrics.transaction_checks(handed)
        return handed

    async def run(self) -> None:
        """The check-back loop (until cancelled)."""
        while True:
            try:
                await self.check_once()
            except Exception:
                log.exception("transaction check round failed; next round as usual")
            await anyio.sleep(self.poll_ms / 1000)
