"""BrokerGrpcServer: serves any BrokerPort as popmq.broker.v1.BrokerService over gRPC.

The servicer only converts: protos in, port call, protos out. A RefusedError becomes the
response's Status (code and message); anything unexpected becomes INTERNAL_ERROR, so callers
always get a typed answer. When a caller goes away (cancels, deadline, disconnect) gRPC cancels
the handler task, and with it the awaited port call: a held long poll is released at once.
The standard grpc.health.v1 service reports SERVING while the server runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

import anyio
import grpc
from google.protobuf.message import Message as ProtoMessage
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.port import BrokerPort
from popmq.broker.contract.watch import WatchKey, wait_visible
from popmq.broker.wire import convert
from popmq.broker.wire.bodies import splitting_decoder, take_bodies
from popmq.broker.wire.request_link import (
    LINK_HEADROOM_BYTES,
    Encoded,
    encode,
    encoded,
    frame,
    frames,
)
from popmq.broker.wire.undecodable import add_tolerant

from popmq.budget import MemoryBudget
from popmq.config import BrokerConfig
from popmq.lifecycle import Job, TaskOwner
from popmq.pb.broker.v1 import broker_pb2 as pb
from popmq.pb.broker.v1 import broker_pb2_grpc
from popmq.reflection import enable_reflection
from popmq.security import link
from popmq.tracing import link_span, server_interceptors

log = logging.getLogger(__name__)

R = TypeVar("R", bound=ProtoMessage)

SERVICE_NAME = "popmq.broker.v1.BrokerService"
# A full pop batch of large bodies must fit; the default of broker.max_message_bytes.
MAX_MESSAGE_BYTES = BrokerConfig.model_fields["max_message_bytes"].default


def server_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        *SERVER_OPTIONS,
    ]


# Proxies keep long polls open without sending data; let their keepalive pings through.
SERVER_OPTIONS: list[tuple[str, int]] = [
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_ping_strikes", 0),
    # gRPC shares ports by default: a second broker on a taken port must fail, not co-listen.
    ("grpc.so_reuseport", 0),
]


# Bytes of the budget a pop or pull answer took while it is served on the request link: the
# link gives them back once the answer's frame is written (a unary answer's, once grpc sent it).
_ANSWER_HELD: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "answer_held", default=None
)


def _add_servicer(servicer: Any, server: Any) -> None:
    """The generated registration, except that Call writes frames already encoded (bytes)."""

    class _RawCall:
        def add_generic_rpc_handlers(self, handlers: Any) -> None:
            server.add_generic_rpc_handlers(handlers)

        def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
            call = handlers["Call"]._replace(response_serializer=None)
            server.add_registered_method_handlers(service, {**handlers, "Call": call})

    broker_pb2_grpc.add_BrokerServiceServicer_to_server(servicer, _RawCall())


async def _answer(response_cls: type[R], work: Awaitable[R]) -> R:
    """Await the port call; turn a refusal into the response's status."""
    try:
        return await work
    except RefusedError as error:
        return response_cls(status=convert.error_status(error))
    except Exception as error:  # the caller still deserves a typed answer
        log.exception("broker call failed")
        status = pb.Status(code=Code.INTERNAL_ERROR, message=f"{type(error).__name__}: {error}")
        return response_cls(status=status)


class BrokerServicer(broker_pb2_grpc.BrokerServiceServicer):
    """popmq.broker.v1.BrokerService on top of one BrokerPort."""

    def __init__(
        self,
        port: BrokerPort,
        max_message_bytes: int | None = None,
        max_inflight_bytes: int = BrokerConfig.model_fields["max_inflight_bytes"].default,
        inflight_wait_ms: int = BrokerConfig.model_fields["inflight_wait_ms"].default,
    ) -> None:
        self._port = port
        self._max_message_bytes = max_message_bytes
        # Sends and pop answers in flight (popmq.budget): a crowd of large ones is refused,
        # not OOM-killed.
        self._budget = MemoryBudget(
            max_inflight_bytes, f"broker {port.name}", wait_ms=inflight_wait_ms
        )

    @contextlib.contextmanager
    def _answer_held(self, size: int, context: object) -> Iterator[None]:
        """``size`` bytes of an answer taken from the budget until the answer is written: on the
        request link, the link gives them back once the answer's frame is written; a unary
        call's, once grpc has sent it (the call's done callback: the answer is encoded after
        the handler returns, then written, and a slow reader can hold it that long)."""
        self._budget.take(size)
        held = _ANSWER_HELD.get()
        if held is not None:
            held.append(size)
            yield
            return
        on_done = getattr(context, "add_done_callback", None)
        returned = False
        try:
            yield
            returned = on_done is not None
        finally:
            if returned:
                assert on_done is not None
                on_done(lambda _context: self._budget.release(size))
            else:  # failed, or no grpc call (in-process use): nothing is left to write
                self._budget.release(size)

    async def Describe(self, request: pb.DescribeRequest, context: object) -> pb.DescribeResponse:
        return pb.DescribeResponse(status=convert.ok_status(), name=self._port.name)

    # -- produce -----------------------------------------------------------------------------

    async def Send(self, request: pb.SendRequest, context: object) -> pb.SendResponse:
        bodies = take_bodies(request)  # a large batch's bodies, left in grpc's bytes of it

        async def work() -> pb.SendResponse:
            messages = [convert.message_from_proto(m) for m in request.messages]
            if bodies is not None:
                for message, body in zip(messages, bodies, strict=True):
                    if body is not None:
                        message.body = body  # the store writes it from grpc's bytes
            # Not request.ByteSize(): upb encodes the whole request to measure it.
            async with self._budget.hold(sum(len(m.body) for m in messages)):
                results = await self._port.send(messages, request.queue_id)
            return pb.SendResponse(
                status=convert.ok_status(),
                results=[convert.send_result_to_proto(r) for r in results],
            )

        return await _answer(pb.SendResponse, work())

    # -- POP ---------------------------------------------------------------------------------

    async def Pop(self, request: pb.PopRequest, context: object) -> pb.PopResponse:
        async def work() -> pb.PopResponse:
            # The answer draws from the budget: wait for room before taking any message
            # (refused, nothing was popped), then count what was taken until it is encoded.
            await self._budget.room()
            result = await self._port.pop(convert.pop_request_from_proto(request))
            with self._answer_held(sum(len(m.message.body) for m in result.messages), context):
                return convert.pop_result_to_proto(result)

        return await _answer(pb.PopResponse, work())

    async def Ack(self, request: pb.AckRequest, context: object) -> pb.AckResponse:
        async def work() -> pb.AckResponse:
            entries = [convert.ack_entry_from_proto(e) for e in request.entries]
            results = await self._port.ack(request.group, request.topic, entries)
            return pb.AckResponse(
                status=convert.ok_status(),
                results=[convert.ack_result_to_proto(r) for r in results],
            )

        return await _answer(pb.AckResponse, work())

    async def ChangeInvisibleTime(
        self, request: pb.ChangeInvisibleTimeRequest, context: object
    ) -> pb.ChangeInvisibleTimeResponse:
        async def work() -> pb.ChangeInvisibleTimeResponse:
            result = await self._port.change_invisible_time(
                request.group, request.topic, request.receipt_handle, request.invisible_time_ms
            )
            return convert.change_invisible_to_proto(result)

        return await _answer(pb.ChangeInvisibleTimeResponse, work())

    async def HandBack(self, request: pb.HandBackRequest, context: object) -> pb.HandBackResponse:
        async def work() -> pb.HandBackResponse:
            count = await self._port.hand_back(
                request.group, request.topic, list(request.receipt_handles)
            )
            return pb.HandBackResponse(status=convert.ok_status(), handed_back=count)

        return await _answer(pb.HandBackResponse, work())

    async def Notify(self, request: pb.NotifyRequest, context: object) -> pb.NotifyResponse:
        async def work() -> pb.NotifyResponse:
            result = await self._port.notify(convert.notify_request_from_proto(request))
            return convert.notify_result_to_proto(result)

        return await _answer(pb.NotifyResponse, work())

    async def ForwardToDlq(
        self, request: pb.ForwardToDlqRequest, context: object
    ) -> pb.ForwardToDlqResponse:
        async def work() -> pb.ForwardToDlqResponse:
            await self._port.forward_to_dlq(request.group, request.topic, request.receipt_handle)
            return pb.ForwardToDlqResponse(status=convert.ok_status())

        return await _answer(pb.ForwardToDlqResponse, work())

    async def Recall(self, request: pb.RecallRequest, context: object) -> pb.RecallResponse:
        async def work() -> pb.RecallResponse:
            message_id = await self._port.recall(request.topic, request.recall_handle)
            return pb.RecallResponse(status=convert.ok_status(), message_id=message_id)

        return await _answer(pb.RecallResponse, work())

    async def EndTransaction(
        self, request: pb.EndTransactionRequest, context: object
    ) -> pb.EndTransactionResponse:
        async def work() -> pb.EndTransactionResponse:
            await self._port.end_transaction(
                request.topic, request.message_id, request.transaction_id, request.commit,
                request.source,
            )  # fmt: skip
            return pb.EndTransactionResponse(status=convert.ok_status())

        return await _answer(pb.EndTransactionResponse, work())

    async def ClaimTransactionChecks(
        self, request: pb.ClaimTransactionChecksRequest, context: object
    ) -> pb.ClaimTransactionChecksResponse:
        async def work() -> pb.ClaimTransactionChecksResponse:
            checks = await self._port.claim_transaction_checks(
                list(request.topics), request.limit or 64
            )
            return pb.ClaimTransactionChecksResponse(
                status=convert.ok_status(),
                checks=[convert.transaction_check_to_proto(c) for c in checks],
            )

        return await _answer(pb.ClaimTransactionChecksResponse, work())

    async def ListTransactions(
        self, request: pb.ListTransactionsRequest, context: object
    ) -> pb.ListTransactionsResponse:
        async def work() -> pb.ListTransactionsResponse:
            halves = await self._port.list_transactions()
            return pb.ListTransactionsResponse(
                status=convert.ok_status(), halves=[convert.half_info_to_proto(h) for h in halves]
            )

        return await _answer(pb.ListTransactionsResponse, work())

    async def Watch(
        self, request_iterator: AsyncIterator[pb.WatchRequest], context: object
    ) -> AsyncIterator[pb.WatchEvent]:
        """The link's event stream: one task per armed watch; each answers once."""
        events: asyncio.Queue[pb.WatchEvent | None] = asyncio.Queue()
        armed: dict[int, Job[None]] = {}
        # The stream owns its reader and one task per armed watch; they end with it.
        tasks = TaskOwner("watch-stream", grace_s=0)

        async def answer(arm: pb.WatchArm) -> None:
            key = WatchKey(arm.group, arm.topic, convert.filter_from_proto(arm.filter), arm.fifo)
            status = convert.ok_status()
            try:
                await wait_visible(self._port, key)
            except RefusedError as error:
                status = convert.error_status(error)
            except Exception as error:  # the proxy pops and sees for itself
                log.exception("watch of %s/%s failed", arm.group, arm.topic)
                status = pb.Status(code=Code.INTERNAL_ERROR, message=type(error).__name__)
            finally:
                job = armed.get(arm.id)
                if job is not None and job.is_current():
                    del armed[arm.id]
            events.put_nowait(pb.WatchEvent(id=arm.id, seq=arm.seq, status=status))

        async def read() -> None:
            try:
                async for request in request_iterator:
                    if request.HasField("arm"):
                        old = armed.pop(request.arm.id, None)
                        if old is not None:
                            old.cancel()
                        job = tasks.spawn(answer(request.arm), f"watch:{request.arm.id}")
                        if job is not None:
                            armed[request.arm.id] = job
                    elif request.HasField("cancel"):
                        job = armed.pop(request.cancel.id, None)
                        if job is not None:
                            job.cancel()
            finally:
                events.put_nowait(None)  # the proxy closed its side: end the stream

        tasks.spawn(read(), "watch-reader")
        try:
            while (event := await events.get()) is not None:
                yield event
        finally:
            armed.clear()
            await tasks.aclose()

    async def Call(self, request_iterator: AsyncIterator[pb.LinkRequests], context: Any) -> None:
        """The request link: each LinkRequest is served by the same method as its unary call,
        concurrently, and answered by id in completion order. Ends once the proxy closed its
        side and every request it sent was answered; the proxy's going away cancels them all."""
        answers: asyncio.Queue[Encoded | None] = asyncio.Queue()
        held: dict[int, anyio.CancelScope] = {}
        unwritten: set[Encoded] = set()  # queued answers whose budget bytes are still out

        def queue(answer: Encoded) -> None:
            if answer.held:
                unwritten.add(answer)
            answers.put_nowait(answer)

        def written(batch: list[Encoded]) -> None:
            for answer in batch:
                if answer in unwritten:
                    unwritten.discard(answer)
                    self._budget.release(answer.held)

        async def serve(request: pb.LinkRequest, kind: str, scope: anyio.CancelScope) -> None:
            with scope:  # the proxy's cancel for this id ends it
                await reply(request, kind)
            if scope.cancelled_caught:
                # Ended by the cancel before it answered (nothing was taken): an answer without
                # a result says so, and the proxy stops waiting for a late answer to this id.
                queue(encoded(pb.LinkResponse(id=request.id)))

        async def reply(request: pb.LinkRequest, kind: str) -> None:
            taken: list[int] = []  # budget bytes the answer holds until it is written
            token = _ANSWER_HELD.set(taken)
            queued = False
            try:
                method = getattr(self, _LINKED[kind])
                if request.trace_context:  # the proxy traces this request: continue it
                    with link_span(_LINKED[kind], dict(request.trace_context)):
                        response = await method(getattr(request, kind), context)
                else:
                    response = await method(getattr(request, kind), context)
                payload = response.SerializeToString()  # the answer's one encoding
                del response
                limit = self._max_message_bytes or MAX_MESSAGE_BYTES
                if len(payload) > limit - LINK_HEADROOM_BYTES:
                    # Written, it would end the stream and fail every request on it: this one
                    # fails alone (a pop's messages come back after their invisible time).
                    log.warning(
                        "a %s answer of %d bytes is past the link's message limit",
                        kind, len(payload),
                    )  # fmt: skip
                    message = (
                        f"the {kind} answer is {len(payload)} bytes, more than the broker "
                        f"link's message limit ({limit}); ask for fewer messages "
                        "(proxy.max_batch) or lower the body size limit (max_body_bytes)"
                    )
                    status = pb.Status(code=Code.PAYLOAD_TOO_LARGE, message=message)
                    response_cls = type(getattr(pb.LinkResponse(), kind))
                    payload = response_cls(status=status).SerializeToString()
                queue(encode(pb.LinkResponse(id=request.id), kind, payload, held=sum(taken)))
                queued = True
            finally:
                _ANSWER_HELD.reset(token)
                held.pop(request.id, None)
                if not queued and taken:
                    self._budget.release(sum(taken))

        async def write() -> None:  # the answers ready at a write, a bounded frame each
            try:
                async for batch in frames(answers):
                    await context.write(frame(batch))
                    written(batch)
            finally:  # the stream ended: what was not written gives its budget back
                written(list(unwritten))

        async with anyio.create_task_group() as stream:
            stream.start_soon(write)
            try:
                async with anyio.create_task_group() as calls:
                    async for batch in request_iterator:
                        for request in batch.requests:
                            kind = request.WhichOneof("call")
                            if kind == "cancel":
                                scope = held.pop(request.id, None)
                                if scope is not None:
                                    scope.cancel()
                            elif kind in _LINKED:
                                scope = held[request.id] = anyio.CancelScope()
                                calls.start_soon(serve, request, kind, scope)
                            else:  # an empty call: answered empty, the proxy reports it
                                queue(encoded(pb.LinkResponse(id=request.id)))
            finally:
                answers.put_nowait(None)

    # -- pull and offsets --------------------------------------------------------------------

    async def Pull(self, request: pb.PullRequest, context: object) -> pb.PullResponse:
        async def work() -> pb.PullResponse:
            await self._budget.room()  # as Pop: nothing is read while the budget is full
            result = await self._port.pull(convert.pull_request_from_proto(request))
            with self._answer_held(sum(len(m.body) for m in result.messages), context):
                return convert.pull_result_to_proto(result)

        return await _answer(pb.PullResponse, work())

    async def GetConsumerOffset(
        self, request: pb.QueueRef, context: object
    ) -> pb.GetConsumerOffsetResponse:
        async def work() -> pb.GetConsumerOffsetResponse:
            offset = await self._port.get_consumer_offset(
                request.group, request.topic, request.queue_id
            )
            return pb.GetConsumerOffsetResponse(status=convert.ok_status(), offset=offset)

        return await _answer(pb.GetConsumerOffsetResponse, work())

    async def UpdateConsumerOffset(
        self, request: pb.UpdateConsumerOffsetRequest, context: object
    ) -> pb.UpdateConsumerOffsetResponse:
        async def work() -> pb.UpdateConsumerOffsetResponse:
            await self._port.update_consumer_offset(
                request.group, request.topic, request.queue_id, request.offset
            )
            return pb.UpdateConsumerOffsetResponse(status=convert.ok_status())

        return await _answer(pb.UpdateConsumerOffsetResponse, work())

    async def OffsetForTimestamp(
        self, request: pb.OffsetForTimestampRequest, context: object
    ) -> pb.OffsetForTimestampResponse:
        async def work() -> pb.OffsetForTimestampResponse:
            offset = await self._port.offset_for_timestamp(
                request.topic, request.queue_id, request.timestamp_ms
            )
            return pb.OffsetForTimestampResponse(status=convert.ok_status(), offset=offset)

        return await _answer(pb.OffsetForTimestampResponse, work())

    # -- administration ----------------------------------------------------------------------

    async def CreateTopic(
        self, request: pb.CreateTopicRequest, context: object
    ) -> pb.TopicResponse:
        async def work() -> pb.TopicResponse:
            topic = await self._port.create_topic(
                request.topic, request.queue_count, request.message_type
            )
            return pb.TopicResponse(status=convert.ok_status(), topic=convert.topic_to_proto(topic))

        return await _answer(pb.TopicResponse, work())

    async def GetTopic(self, request: pb.GetTopicRequest, context: object) -> pb.TopicResponse:
        async def work() -> pb.TopicResponse:
            topic = await self._port.get_topic(request.topic, request.auto_create)
            return pb.TopicResponse(status=convert.ok_status(), topic=convert.topic_to_proto(topic))

        return await _answer(pb.TopicResponse, work())

    async def ListTopics(
        self, request: pb.ListTopicsRequest, context: object
    ) -> pb.ListTopicsResponse:
        async def work() -> pb.ListTopicsResponse:
            topics = await self._port.list_topics()
            return pb.ListTopicsResponse(
                status=convert.ok_status(), topics=[convert.topic_to_proto(t) for t in topics]
            )

        return await _answer(pb.ListTopicsResponse, work())

    async def DeleteTopic(
        self, request: pb.DeleteTopicRequest, context: object
    ) -> pb.DeleteTopicResponse:
        async def work() -> pb.DeleteTopicResponse:
            await self._port.delete_topic(request.topic)
            return pb.DeleteTopicResponse(status=convert.ok_status())

        return await _answer(pb.DeleteTopicResponse, work())

    async def GetGroup(self, request: pb.GetGroupRequest, context: object) -> pb.GroupResponse:
        async def work() -> pb.GroupResponse:
            group = await self._port.get_group(request.group)
            return pb.GroupResponse(status=convert.ok_status(), group=convert.group_to_proto(group))

        return await _answer(pb.GroupResponse, work())

    async def UpdateGroup(self, request: pb.GroupConfig, context: object) -> pb.GroupResponse:
        async def work() -> pb.GroupResponse:
            group = await self._port.update_group(convert.group_from_proto(request))
            return pb.GroupResponse(status=convert.ok_status(), group=convert.group_to_proto(group))

        return await _answer(pb.GroupResponse, work())

    async def ListGroups(
        self, request: pb.ListGroupsRequest, context: object
    ) -> pb.ListGroupsResponse:
        async def work() -> pb.ListGroupsResponse:
            groups = await self._port.list_groups()
            return pb.ListGroupsResponse(
                status=convert.ok_status(),
                groups=[convert.group_summary_to_proto(g) for g in groups],
            )

        return await _answer(pb.ListGroupsResponse, work())

    async def DeleteGroup(
        self, request: pb.DeleteGroupRequest, context: object
    ) -> pb.DeleteGroupResponse:
        async def work() -> pb.DeleteGroupResponse:
            done = await self._port.delete_group(request.group, request.clean_offsets,
                                                 request.force)  # fmt: skip
            return pb.DeleteGroupResponse(
                status=convert.ok_status(),
                inflight=done.inflight,
                offsets_removed=done.offsets_removed,
            )

        return await _answer(pb.DeleteGroupResponse, work())

    async def GroupStats(
        self, request: pb.GroupStatsRequest, context: object
    ) -> pb.GroupStatsResponse:
        async def work() -> pb.GroupStatsResponse:
            stats = await self._port.group_stats(request.group, request.topic)
            return pb.GroupStatsResponse(
                status=convert.ok_status(),
                stats=[convert.group_stats_to_proto(s) for s in stats],
            )

        return await _answer(pb.GroupStatsResponse, work())


# LinkRequest's call field -> the servicer method that serves it (same code as the unary call).
_LINKED = {
    "send": "Send",
    "pop": "Pop",
    "ack": "Ack",
    "change_invisible_time": "ChangeInvisibleTime",
    "notify": "Notify",
    "forward_to_dlq": "ForwardToDlq",
    "pull": "Pull",
}


class BrokerGrpcServer:
    """Runs BrokerService (plus grpc.health.v1) for one BrokerPort on host:port_number.

    port_number 0 picks a free port; ``bound_port`` tells which, once started.
    """

    def __init__(
        self,
        port: BrokerPort,
        host: str = "127.0.0.1",
        port_number: int = 0,
        *,
        config: BrokerConfig | None = None,
        services: Sequence[Callable[[grpc.aio.Server], object]] = (),
    ) -> None:
        self._port = port
        # More services on the same port and credentials (replication between brokers).
        self._services = tuple(services)
        # TLS and the cluster token (popmq.security.link); None: plaintext, open (tests).
        self._config = config
        self._host = host
        self._port_number = port_number
        self._server: grpc.aio.Server | None = None
        self._health: health_aio.HealthServicer | None = None
        self._bound_port: int | None = None

    @property
    def bound_port(self) -> int:
        if self._bound_port is None:
            raise RuntimeError("BrokerGrpcServer is not started")
        return self._bound_port

    @property
    def address(self) -> str:
        """host:port to give a RemoteBrokerPort."""
        return f"{self._host}:{self.bound_port}"

    async def __aenter__(self) -> BrokerGrpcServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("BrokerGrpcServer already started")
        config = self._config
        # Tracing first, so refused calls are traced too.
        interceptors = [
            *server_interceptors(),
            *(link.server_interceptors(config) if config else []),
        ]
        limit = config.max_message_bytes if config else MAX_MESSAGE_BYTES
        server = grpc.aio.server(options=server_options(limit), interceptors=interceptors or None)
        # Undecodable bodies answer INVALID_ARGUMENT with a rate-limited log line.
        add_tolerant(
            _add_servicer,
            BrokerServicer(
                self._port,
                config.max_message_bytes if config else None,
                *([config.max_inflight_bytes, config.inflight_wait_ms] if config else []),
            ),
            server,
            # A large batch's bodies stay in grpc's bytes of it (views), not copied once more.
            decoders={"Send": splitting_decoder(pb.SendRequest.FromString, 1, 2)},
        )
        for add_service in self._services:
            add_service(server)
        health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        enable_reflection(server, [SERVICE_NAME, "grpc.health.v1.Health"])
        try:
            address = f"{self._host}:{self._port_number}"
            bound = (
                link.add_port(server, address, config)
                if config
                else server.add_insecure_port(address)
            )
        except RuntimeError as error:  # grpc reports a failed bind this way
            raise OSError(f"cannot listen on {self._host}:{self._port_number}: {error}") from None
        if bound == 0:
            raise OSError(f"cannot listen on {self._host}:{self._port_number}")
        await server.start()
        await health.set("", health_pb2.HealthCheckResponse.SERVING)
        await health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        self._server, self._health, self._bound_port = server, health, bound

    async def aclose(self, grace_s: float | None = 1.0) -> None:
        """Stop accepting calls; in-flight calls get grace_s to finish, then are cancelled
        (which cancels the port calls they hold)."""
        server, health = self._server, self._health
        if server is None or health is None:
            return
        self._server = self._health = None
        await health.enter_graceful_shutdown()
        await server.stop(grace_s)

    async def wait_for_termination(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()
