"""BrokerGrpcServer + RemoteBrokerPort against a small in-test BrokerPort: transport behaviour
(status codes, deadlines, cancellation, health) independent of the real broker."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from popmq.broker.contract.errors import (
    BrokerTimeoutError,
    BrokerUnavailableError,
    Code,
    RefusedError,
)
from popmq.broker.contract.port import BrokerPort
from popmq.broker.contract.types import (
    AckEntry,
    AckEntryResult,
    ChangeInvisibleResult,
    GroupConfig,
    GroupDeleted,
    GroupQueueStats,
    GroupSummary,
    HalfMessageInfo,
    Message,
    NotifyRequest,
    NotifyResult,
    PoppedMessage,
    PopRequest,
    PopResult,
    PopStatus,
    PullRequest,
    PullResult,
    PullStatus,
    SendResult,
    StoredMessage,
    TopicInfo,
    TransactionCheck,
)
from popmq.broker.wire.remote import RemoteBrokerPort
from popmq.broker.wire.server import SERVICE_NAME, BrokerGrpcServer

from popmq.pb.broker.v1 import broker_pb2_grpc


class FakePort:
    """Answers from memory; pops with poll_time_ms hold until cancelled (and say so)."""

    def __init__(self) -> None:
        self.sent: list[Message] = []
        self.ended: list[tuple[str, str, bool, str]] = []
        self.held = asyncio.Event()
        self.released = asyncio.Event()

    @property
    def name(self) -> str:
        return "fake-broker"

    async def send(self, messages: list[Message], queue_id: int = -1) -> list[SendResult]:
        if any(m.topic == "boom" for m in messages):
            raise RuntimeError("disk on fire")
        if any(not m.body for m in messages):
            raise RefusedError(Code.MESSAGE_BODY_EMPTY, "empty body")
        self.sent.extend(messages)
        return [
            SendResult(m.message_id or f"gen-{i}", m.topic, max(queue_id, 0), i, self.name)
            for i, m in enumerate(messages, start=len(self.sent) - len(messages))
        ]

    async def pop(self, request: PopRequest) -> PopResult:
        if request.poll_time_ms > 0:
            self.held.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.released.set()
                raise
        stored = StoredMessage(
            request.topic, 0, 0, b"x", "", [], {}, "m0", "", 0, 0, "", 1, self.name, 0
        )
        return PopResult(PopStatus.FOUND, [PoppedMessage(stored, "rh-0", 99)], rest_num=3)

    async def ack(self, group: str, topic: str, entries: list[AckEntry]) -> list[AckEntryResult]:
        return [
            AckEntryResult(e.receipt_handle, e.message_id, Code.OK if e.receipt_handle else 40013)
            for e in entries
        ]

    async def change_invisible_time(
        self, group: str, topic: str, receipt_handle: str, invisible_time_ms: int
    ) -> ChangeInvisibleResult:
        raise RefusedError(Code.INVALID_RECEIPT_HANDLE, f"stale handle {receipt_handle}")

    async def hand_back(self, group: str, topic: str, receipt_handles: list[str]) -> int:
        return sum(1 for handle in receipt_handles if handle.startswith("rh-"))

    async def notify(self, request: NotifyRequest) -> NotifyResult:
        return NotifyResult(has_message=request.topic == "busy")

    async def forward_to_dlq(self, group: str, topic: str, receipt_handle: str) -> None:
        return None

    async def recall(self, topic: str, recall_handle: str) -> str:
        if recall_handle != "r1.good":
            raise RefusedError(Code.BAD_REQUEST, "invalid recall handle: made up")
        return f"id-of-{topic}"

    async def end_transaction(
        self, topic: str, message_id: str, transaction_id: str, commit: bool, source: str = ""
    ) -> None:
        if transaction_id != "t1.good":
            raise RefusedError(Code.INVALID_TRANSACTION_ID, "invalid transaction id: made up")
        self.ended.append((topic, message_id, commit, source))

    async def claim_transaction_checks(
        self, topics: list[str], limit: int = 64
    ) -> list[TransactionCheck]:
        stored = StoredMessage(
            topics[0], 1, 0, b"half", "T", ["k"], {"p": "v"}, "m9", "", 0, 0, "", 1, self.name, 0
        )
        return [TransactionCheck(stored, "t1.check", limit)]

    async def list_transactions(self) -> list[HalfMessageInfo]:
        return [HalfMessageInfo("t", "m9", "t1.x", 123, 2, True)]

    async def pull(self, request: PullRequest) -> PullResult:
        return PullResult(PullStatus.NO_NEW_MESSAGE, [], request.offset, 0, request.offset)

    async def get_consumer_offset(self, group: str, topic: str, queue_id: int) -> int:
        return -1

    async def update_consumer_offset(
        self, group: str, topic: str, queue_id: int, offset: int
    ) -> None:
        return None

    async def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        return timestamp_ms // 1000

    async def create_topic(self, topic: str, queue_count: int, message_type: str = "") -> TopicInfo:
        return TopicInfo(topic, queue_count, message_type=message_type or "MIXED")

    async def get_topic(self, topic: str, auto_create: bool = False) -> TopicInfo:
        raise RefusedError(Code.TOPIC_NOT_FOUND, f"no topic {topic}")

    async def list_topics(self) -> list[TopicInfo]:
        return []

    async def delete_topic(self, topic: str) -> None:
        return None

    async def get_group(self, group: str) -> GroupConfig:
        return GroupConfig(group)

    async def update_group(self, config: GroupConfig) -> GroupConfig:
        return config

    async def group_stats(self, group: str, topic: str) -> list[GroupQueueStats]:
        return [GroupQueueStats(topic, 0, 1, 5, 2)]

    async def list_groups(self) -> list[GroupSummary]:
        return []

    async def delete_group(
        self, group: str, clean_offsets: bool = False, force: bool = False
    ) -> GroupDeleted:
        return GroupDeleted()

    async def aclose(self) -> None:
        return None


@pytest.fixture
async def served() -> AsyncIterator[tuple[FakePort, BrokerGrpcServer, RemoteBrokerPort]]:
    fake = FakePort()
    assert isinstance(fake, BrokerPort)
    server = BrokerGrpcServer(fake, "127.0.0.1", 0)
    await server.start()
    remote = RemoteBrokerPort("fake-broker", server.address, rpc_timeout_s=2.0)
    try:
        yield fake, server, remote
    finally:
        await remote.aclose()
        await server.aclose(0)


async def test_remote_port_is_a_broker_port(served) -> None:
    _, server, remote = served
    assert isinstance(remote, BrokerPort)
    assert server.bound_port > 0
    assert await remote.describe() == "fake-broker"


async def test_health_service_reports_serving(served) -> None:
    _, server, _ = served
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", SERVICE_NAME):
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_calls_round_trip(served) -> None:
    fake, _, remote = served
    results = await remote.send([Message("t", b"a", message_id="m1"), Message("t", b"b")], 2)
    assert [(r.message_id, r.queue_id, r.queue_offset) for r in results] == [
        ("m1", 2, 0),
        ("gen-1", 2, 1),
    ]
    assert [m.body for m in fake.sent] == [b"a", b"b"]
    popped = await remote.pop(PopRequest("g", "t"))
    assert popped.status is PopStatus.FOUND and popped.rest_num == 3
    assert popped.messages[0].receipt_handle == "rh-0"
    assert popped.messages[0].message.store_host == "fake-broker"
    acks = await remote.ack("g", "t", [AckEntry("rh", "m"), AckEntry("", "m2")])
    assert [a.code for a in acks] == [Code.OK, Code.INVALID_RECEIPT_HANDLE]
    assert (await remote.notify(NotifyRequest("g", "busy"))).has_message
    assert not (await remote.notify(NotifyRequest("g", "idle"))).has_message
    assert await remote.get_consumer_offset("g", "t", 0) == -1
    assert await remote.offset_for_timestamp("t", 0, 5_000) == 5
    assert (await remote.pull(PullRequest("t", 0, 7))).next_offset == 7
    assert (await remote.create_topic("t", 4)).queue_count == 4
    assert (await remote.group_stats("g", "t"))[0].backlog == 4
    await remote.forward_to_dlq("g", "t", "rh")
    await remote.update_consumer_offset("g", "t", 0, 3)
    assert await remote.recall("t", "r1.good") == "id-of-t"
    with pytest.raises(RefusedError) as err:
        await remote.recall("t", "r1.bad")
    assert err.value.code == Code.BAD_REQUEST and "made up" in err.value.message
    await remote.end_transaction("t", "m9", "t1.good", True, "SERVER_CHECK")
    assert fake.ended == [("t", "m9", True, "SERVER_CHECK")]
    with pytest.raises(RefusedError) as err:
        await remote.end_transaction("t", "m9", "t1.bad", False)
    assert err.value.code == Code.INVALID_TRANSACTION_ID
    (check,) = await remote.claim_transaction_checks(["tx"], 7)
    assert (check.transaction_id, check.checks, check.message.topic) == ("t1.check", 7, "tx")
    assert (check.message.body, check.message.keys, check.message.properties) == (
        b"half", ["k"], {"p": "v"})  # fmt: skip
    assert await remote.list_transactions() == [HalfMessageInfo("t", "m9", "t1.x", 123, 2, True)]


async def test_hand_back_round_trips_and_an_older_broker_says_not_implemented(served) -> None:
    _, _, remote = served
    assert await remote.hand_back("g", "t", ["rh-1", "stale", "rh-2"]) == 2
    # A broker from before HandBack: the generated servicer answers UNIMPLEMENTED, which the
    # port turns into NOT_IMPLEMENTED (the proxy then changes the invisible time instead).
    older = grpc.aio.server()
    broker_pb2_grpc.add_BrokerServiceServicer_to_server(
        broker_pb2_grpc.BrokerServiceServicer(), older
    )
    bound = older.add_insecure_port("127.0.0.1:0")
    await older.start()
    port = RemoteBrokerPort("older", f"127.0.0.1:{bound}", rpc_timeout_s=2.0)
    try:
        with pytest.raises(RefusedError) as refused:
            await port.hand_back("g", "t", ["rh-1"])
        assert refused.value.code is Code.NOT_IMPLEMENTED
    finally:
        await port.aclose()
        await older.stop(0)


async def test_broker_errors_keep_their_code(served) -> None:
    _, _, remote = served
    with pytest.raises(RefusedError) as caught:
        await remote.change_invisible_time("g", "t", "rh-9", 1000)
    assert caught.value.code is Code.INVALID_RECEIPT_HANDLE
    assert caught.value.message == "stale handle rh-9"
    with pytest.raises(RefusedError) as caught:
        await remote.get_topic("nope")
    assert caught.value.code is Code.TOPIC_NOT_FOUND
    with pytest.raises(RefusedError) as caught:
        await remote.send([Message("t", b"")])
    assert caught.value.code is Code.MESSAGE_BODY_EMPTY


async def test_unexpected_failure_becomes_internal_error(served) -> None:
    _, _, remote = served
    with pytest.raises(RefusedError) as caught:
        await remote.send([Message("boom", b"x")])
    assert caught.value.code is Code.INTERNAL_ERROR
    assert "disk on fire" in caught.value.message


async def test_cancelling_the_caller_releases_the_held_pop(served) -> None:
    fake, _, remote = served
    task = asyncio.create_task(remote.pop(PopRequest("g", "t", poll_time_ms=60_000)))
    await asyncio.wait_for(fake.held.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(fake.released.wait(), 10)


@pytest.mark.wallclock  # real timing, generous bounds (see pyproject markers)
async def test_long_poll_deadline_is_poll_time_plus_margin(served) -> None:
    fake, server, _ = served
    remote = RemoteBrokerPort("fake-broker", server.address, rpc_timeout_s=0.2)
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(BrokerTimeoutError) as caught:
            await remote.pop(PopRequest("g", "t", poll_time_ms=300))
        elapsed = loop.time() - started
        assert caught.value.code is Code.PROXY_TIMEOUT
        assert not isinstance(caught.value, RefusedError)  # no answer is not a refusal
        assert 0.45 <= elapsed < 3.0  # the held call would never end: slack for a loaded CI
        await asyncio.wait_for(fake.released.wait(), 10)  # the broker let go too
    finally:
        await remote.aclose()


async def test_server_stop_cancels_held_calls(served) -> None:
    fake, server, remote = served
    task = asyncio.create_task(remote.pop(PopRequest("g", "t", poll_time_ms=60_000)))
    await asyncio.wait_for(fake.held.wait(), 10)
    await server.aclose(0.1)
    await asyncio.wait_for(fake.released.wait(), 10)
    with pytest.raises(BrokerUnavailableError):
        await task


async def test_unreachable_broker_is_unavailable() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    remote = RemoteBrokerPort("gone", address, rpc_timeout_s=2.0)
    try:
        with pytest.raises(BrokerUnavailableError) as caught:
            await remote.send([Message("t", b"x")])
        assert caught.value.broker == "gone"
        assert caught.value.code is Code.INTERNAL_SERVER_ERROR
        assert not isinstance(caught.value, RefusedError)  # unreachable is not a refusal
    finally:
        await remote.aclose()
