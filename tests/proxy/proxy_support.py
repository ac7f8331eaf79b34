"""Helpers for the proxy tests: the cluster handle (a real ProxyServer over real in-process
brokers) with a raw apache.rocketmq.v2 stub to drive it exactly as a client would."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from popmq.broker.contract.types import Message
from popmq.broker.core import Broker
from popmq.broker.local import LocalBrokerPort
from popmq.broker.testing import fast_broker_config, running_broker
from popmq.proxy.grpc.servicer import MessagingServicer
from popmq.proxy.server import ProxyServer

from popmq.clock import LoopClock
from popmq.config import PopmqConfig, load_config
from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s
from popmq.pb.rocketmq.v2 import service_pb2_grpc
from popmq.security.signature import signed_metadata

# Small time scales so the suite stays fast; bounds keep RocketMQ's shape.
TEST_SETTINGS: dict[str, Any] = {
    "proxy.min_long_polling_ms": 300,
    "proxy.max_long_polling_ms": 3_000,
    "proxy.min_invisible_ms": 500,
    "proxy.max_invisible_ms": 3_600_000,
    "proxy.strategy": "notify",
    "broker.pop.min_invisible_ms": 0,
    "broker.pop.revive_scan_interval_ms": 50,
    "broker.pop.time_scale": 0.01,
    "broker.topics.queue_count": 4,
}


class StubContext:
    """What the servicer reads of a grpc.aio.ServicerContext, for calls made in process: a
    Python client's headers, no deadline, a peer; written frames are dropped."""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("x-mq-client-id", "c@1"), ("x-mq-language", "PYTHON"))

    def time_remaining(self) -> float | None:
        return None

    def peer(self) -> str:
        return "ipv4:127.0.0.1:50000"

    async def write(self, frame: Any) -> None:
        pass


class NoRenewals:
    """A HandleRenewer renewing nothing: what Handles needs of one (tests of acks alone)."""

    def __len__(self) -> int:  # Handles asks how many handles are being renewed
        return 0

    async def take(self, handle: str) -> str:
        return handle


def make_config(tmp: Path, **overrides: Any) -> PopmqConfig:
    settings = dict(TEST_SETTINGS)
    settings["serve.data_dir"] = str(tmp)
    settings.update(overrides)
    return load_config(None, settings, environ={})


@dataclass
class Cluster:
    config: PopmqConfig
    brokers: list[Broker]
    server: ProxyServer
    channel: grpc.aio.Channel
    stub: service_pb2_grpc.MessagingServiceStub
    client_id: str
    # (access key, secret key) to sign every call with, when the proxy has an ACL.
    signing: tuple[str, str] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def metadata(self, client_id: str | None = None) -> tuple[tuple[str, str], ...]:
        return (
            ("x-mq-language", "PYTHON"),
            ("x-mq-protocol", "GRPC_V2"),
            ("x-mq-client-version", "5.1.2"),
            ("x-mq-client-id", client_id or self.client_id),
            ("x-mq-request-id", uuid.uuid4().hex),
            ("x-mq-namespace", ""),
            *(signed_metadata(*self.signing) if self.signing else ()),
        )

    # -- helpers that speak the protocol -------------------------------------------------
    async def route(self, topic: str) -> s.QueryRouteResponse:
        return await self.stub.QueryRoute(
            s.QueryRouteRequest(topic=pb.Resource(name=topic)), metadata=self.metadata()
        )

    async def send(self, topic: str, *bodies: bytes, **props: Any) -> s.SendMessageResponse:
        messages = [message(topic, body, **props) for body in bodies]
        return await self.stub.SendMessage(
            s.SendMessageRequest(messages=messages), metadata=self.metadata(), timeout=5
        )

    async def receive(
        self,
        group: str,
        topic: str,
        *,
        batch: int = 16,
        invisible_ms: int | None = 5_000,
        poll_ms: int | None = 300,
        deadline_s: float = 5.0,
        broker: str = "",
        client_id: str | None = None,
    ) -> tuple[pb.Status, list[pb.Message], list[str]]:
        """(status, messages, frame kinds in order)."""
        request = s.ReceiveMessageRequest(
            group=pb.Resource(name=group),
            message_queue=pb.MessageQueue(
                topic=pb.Resource(name=topic), broker=pb.Broker(name=broker)
            ),
            filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
            batch_size=batch,
        )
        if invisible_ms is not None:
            request.invisible_duration.FromMilliseconds(invisible_ms)
        if poll_ms is not None:
            request.long_polling_timeout.FromMilliseconds(poll_ms)
        status, messages, kinds = pb.Status(), [], []
        call = self.stub.ReceiveMessage(
            request, metadata=self.metadata(client_id), timeout=deadline_s
        )
        async for frame in call:
            kind = frame.WhichOneof("content")
            kinds.append(kind)
            if kind == "status":
                status = frame.status
            elif kind == "message":
                messages.append(frame.message)
        return status, messages, kinds

    async def ack(self, group: str, topic: str, *msgs: pb.Message) -> s.AckMessageResponse:
        entries = [
            s.AckMessageEntry(
                message_id=m.system_properties.message_id,
                receipt_handle=m.system_properties.receipt_handle,
            )
            for m in msgs
        ]
        return await self.ack_handles(group, topic, entries)

    async def ack_handles(
        self, group: str, topic: str, entries: list[s.AckMessageEntry]
    ) -> s.AckMessageResponse:
        return await self.stub.AckMessage(
            s.AckMessageRequest(
                group=pb.Resource(name=group), topic=pb.Resource(name=topic), entries=entries
            ),
            metadata=self.metadata(),
            timeout=5,
        )

    async def change_invisible(
        self, group: str, topic: str, handle: str, invisible_ms: int
    ) -> s.ChangeInvisibleDurationResponse:
        request = s.ChangeInvisibleDurationRequest(
            group=pb.Resource(name=group), topic=pb.Resource(name=topic), receipt_handle=handle
        )
        request.invisible_duration.FromMilliseconds(invisible_ms)
        return await self.stub.ChangeInvisibleDuration(request, metadata=self.metadata(), timeout=5)


def message(topic: str, body: bytes, **props: Any) -> pb.Message:
    system = pb.SystemProperties(
        message_id=props.pop("message_id", uuid.uuid4().hex.upper()),
        body_encoding=pb.IDENTITY,
        message_type=props.pop("message_type", pb.NORMAL),
        born_host="127.0.0.1",
    )
    system.born_timestamp.GetCurrentTime()
    if "tag" in props:
        system.tag = props.pop("tag")
    if "keys" in props:
        system.keys.extend(props.pop("keys"))
    if "group" in props:
        system.message_group = props.pop("group")
        system.message_type = pb.FIFO
    if "delivery_ms" in props:
        system.delivery_timestamp.FromMilliseconds(props.pop("delivery_ms"))
        system.message_type = pb.DELAY
    user = props.pop("properties", {})
    assert not props, f"unknown message fields {props}"
    return pb.Message(
        topic=pb.Resource(name=topic), body=body, system_properties=system, user_properties=user
    )


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def eventually(predicate: Any, within_s: float = 5.0, interval: float = 0.05) -> None:
    deadline = asyncio.get_running_loop().time() + within_s
    while True:
        if await predicate() if asyncio.iscoroutinefunction(predicate) else predicate():
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(interval)


@contextlib.asynccontextmanager
async def served_servicer(
    tmp_path: Path, strategy: str
) -> AsyncIterator[tuple[ProxyServer, MessagingServicer]]:
    """A ProxyServer over one in-process broker (topic ``t`` holds one message) and its
    MessagingServicer, called in process; closed in order on the way out."""
    config = make_config(tmp_path, **{"proxy.strategy": strategy})
    async with running_broker(fast_broker_config(tmp_path / "b"), LoopClock()) as broker:
        port = LocalBrokerPort(broker)
        await port.send([Message("t", b"m")], 0)
        server = ProxyServer(config, [port])
        try:
            yield server, MessagingServicer(server.core, server.metrics, config.proxy)
        finally:
            await server.tasks.aclose()
            await server.strategy.aclose()
            await server.cluster.aclose()
