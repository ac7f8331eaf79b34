"""RemoteBrokerPort: the BrokerPort of a broker reached over gRPC (popmq.broker.v1).

Refusals come back as the response status and are re-raised as the same RefusedError. gRPC
errors are mapped in one place, map_rpc_errors: BrokerUnavailableError (unreachable),
BrokerTimeoutError (deadline passed), BrokerAuthError (the broker refused this proxy's cluster
token), else a RefusedError; a call cancelled under its caller (the port's channel closed) is
BrokerUnavailableError too (``_answer``), never a bare CancelledError. Every
call has a deadline: rpc_timeout_s, plus the poll time for long polls. Cancelling the awaiting
task cancels the RPC, and the broker then drops the held request.

Hot-path calls (send, pop, ack, change_invisible_time, notify, forward_to_dlq, pull) go over the
request link (popmq.broker.wire.request_link: a few multiplexed Call streams, acks and sends
coalesced) unless ``broker_link.requests`` is "unary"; administration stays unary. A broker that
does not know the Call method gets unary calls from then on.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import anyio
import grpc
from popmq.broker.contract.errors import (
    BrokerAuthError,
    BrokerTimeoutError,
    BrokerUnavailableError,
    Code,
    PopmqError,
    RefusedError,
)
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
    PopRequest,
    PopResult,
    PullRequest,
    PullResult,
    SendResult,
    TopicInfo,
    TransactionCheck,
)
from popmq.broker.wire import convert
from popmq.broker.wire.coalesce import Coalescer
from popmq.broker.wire.link import BrokerLink
from popmq.broker.wire.request_link import CALL_METHOD, LinkUnsupportedError, RequestLink

from popmq.config import BrokerLinkConfig
from popmq.lifecycle import AsyncClosing, TaskOwner
from popmq.pb.broker.v1 import broker_pb2 as pb
from popmq.pb.broker.v1 import broker_pb2_grpc
from popmq.security.link import broker_channel

R = TypeVar("R")

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
# A unary long poll whose caller gives up with at most this much of its poll time left runs
# on to its end, its answer handed back (RemoteBrokerPort._held_call).
UNARY_DETACH_S = 1.0

CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # Notice a broker that vanished without closing the connection (pod gone, cable cut).
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    # Re-dial a lost broker at least every second: grpc's backoff otherwise grows to 120 s,
    # and every call to a broker that is back fails until the next attempt.
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 1_000),
    # grpc reads this one as the connect timeout, not a backoff: at 250 ms a handshake slowed
    # by a loaded host failed the first calls UNAVAILABLE. A refused dial still fails at once.
    ("grpc.min_reconnect_backoff_ms", 5_000),
]


# Codes meaning "the call never got an answer from the broker".
_UNREACHABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.CANCELLED,  # the server shut down under the call
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


@contextmanager
def map_rpc_errors(broker: str) -> Iterator[None]:
    """Turn a failed gRPC call to ``broker`` into popmq's error tree (the one place that does)."""
    try:
        yield
    except grpc.aio.AioRpcError as error:
        code = error.code()
        detail = f"{code.name}: {error.details()}"
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise BrokerTimeoutError(broker, detail) from error
        if code in _UNREACHABLE:
            raise BrokerUnavailableError(broker, detail) from error
        if code == grpc.StatusCode.UNAUTHENTICATED:
            raise BrokerAuthError(broker, detail) from error
        raise RefusedError(Code.INTERNAL_ERROR, f"broker {broker}: {detail}") from error


class RemoteBrokerPort(AsyncClosing):
    """BrokerPort over a grpc.aio channel to one broker's BrokerGrpcServer."""

    def __init__(
        self,
        name: str,
        address: str,
        *,
        rpc_timeout_s: float = 10.0,
        link: BrokerLinkConfig | None = None,
        unreachable_code: Code | None = None,
    ) -> None:
        self._name = name
        # The code a caller sees when this broker cannot be reached (default: the error's,
        # INTERNAL_SERVER_ERROR). A proxy following a group in etcd says HA_NOT_AVAILABLE:
        # its leader is gone and the next one is not known yet, which clients retry.
        self._unreachable_code = unreachable_code
        self._link = link  # TLS and cluster token (popmq.security.link); None: plaintext
        self._settings = link or BrokerLinkConfig()
        self._streamed = self._settings.requests == "stream"
        self._requests: RequestLink | None = None
        self._acks: Coalescer[tuple[str, str], AckEntry, AckEntryResult] | None = None
        self._sends: Coalescer[tuple[str, int], Message, SendResult] | None = None
        # Runs the request link and its coalescers for the port's life (owned, cancelled on close).
        self._link_tasks: TaskOwner | None = None
        self._address = address
        self._rpc_timeout_s = rpc_timeout_s
        # Made on first use: grpc.aio objects belong to the event loop that creates them.
        self._channel: grpc.aio.Channel | None = None
        self._stub: broker_pb2_grpc.BrokerServiceStub | None = None
        self._watch_link: BrokerLink | None = None
        # Messages of pops answered after their caller gave up, handed back (_late_pop).
        self.late_popped = 0
        # Unary long polls whose caller gave up, awaited for their answer (_held_call).
        self._late_tasks: TaskOwner | None = None
        self._detached: set[Any] = set()  # their calls
        self._closing = False  # aclose() began: no call is detached from then on

    @property
    def name(self) -> str:
        return self._name

    @property
    def address(self) -> str:
        return self._address

    def __repr__(self) -> str:
        return f"RemoteBrokerPort({self._name!r}, {self._address!r})"

    # -- plumbing ------------------------------------------------------------------------------

    def _get_stub(self) -> broker_pb2_grpc.BrokerServiceStub:
        if self._stub is None:
            self._channel = broker_channel(self._address, CHANNEL_OPTIONS, self._link)
            self._stub = broker_pb2_grpc.BrokerServiceStub(self._channel)
        return self._stub

    @property
    def watch_backend(self) -> BrokerLink:
        """The link carrying this proxy's visibility watches on this broker (one stream)."""
        if self._watch_link is None:
            self._watch_link = BrokerLink(self._name, self._get_stub)
        return self._watch_link

    @property
    def request_link(self) -> RequestLink | None:
        """The request link (None in unary mode or before first use)."""
        return self._requests

    @property
    def coalescers(self) -> tuple[Coalescer[Any, Any, Any] | None, ...]:
        return (self._acks, self._sends)

    def _start_link(self) -> RequestLink:
        """The request link and its coalescers, run by one task group for the port's life."""
        if self._requests is None:
            self._get_stub()
            assert self._channel is not None
            settings = self._settings
            # Frames go out already encoded (request_link.frame): no request serializer.
            open_call = self._channel.stream_stream(
                CALL_METHOD, response_deserializer=pb.LinkResponses.FromString
            )
            self._requests = RequestLink(
                self._name, open_call, streams=settings.streams, window=settings.window,
                max_request_bytes=MAX_MESSAGE_BYTES,
            )  # fmt: skip
            if settings.coalesce_ms > 0:
                window_s, most = settings.coalesce_ms / 1000, settings.coalesce_max
                self._acks = Coalescer(self._ack_now, window_s=window_s, max_items=most)
                self._sends = Coalescer(self._send_now, window_s=window_s, max_items=most)
            self._link_tasks = TaskOwner(f"request-link:{self._name}", grace_s=0)
            # Spawned from an empty context, not the first caller's (its trace, its span).
            contextvars.Context().run(
                self._link_tasks.spawn, self._run_link(), f"request-link:{self._name}"
            )
        return self._requests

    async def _run_link(self) -> None:
        requests = self._requests
        assert requests is not None
        async with anyio.create_task_group() as group:
            group.start_soon(requests.run)
            for coalescer in (self._acks, self._sends):
                if coalescer is not None:
                    group.start_soon(coalescer.run)

    async def _linked(
        self,
        kind: str,
        method: Callable[..., Awaitable[R]],
        request: object,
        deadline_s: float,
        *,
        held: bool = False,
        late: Callable[[pb.LinkResponse], None] | None = None,
    ) -> R:
        """One hot-path call: on the request link, or unary (fallback). ``held``: a long poll;
        ``late``: where an answer goes that comes after the caller gave up (the link only)."""
        try:
            if self._streamed:
                try:
                    link = self._start_link()
                    response = await link.request(kind, request, deadline_s, held=held, late=late)
                except LinkUnsupportedError:
                    log.warning("broker %s has no request link: unary calls from now on",
                                self._name)  # fmt: skip
                    self._streamed = False
                else:
                    convert.raise_for_status(response.status)
                    return response
            if held and late is not None:
                return await self._held_call(method, request, deadline_s, late)
            return await self._call(method, request, deadline_s)
        except BrokerUnavailableError as error:
            self._recode(error)
            raise

    async def _held_call(
        self,
        method: Callable[..., Any],
        request: object,
        deadline_s: float,
        late: Callable[[pb.LinkResponse], None],
    ) -> R:
        """A unary long poll whose answer, if its caller gives up, goes to ``late``.

        Awaiting a grpc.aio call cancels it when the awaiting task is cancelled, and a
        cancelled call drops its answer, even one already received: a held pop woken as the
        proxy's deadline passed lost its messages for their whole invisible time. The call is
        awaited through its done callback instead. When the caller goes, an answer already
        there goes to ``late``; a call whose poll ends within ``UNARY_DETACH_S`` anyway (the
        caller's deadline passed: the broker's poll time is the caller's remaining time)
        runs on in the background and its answer goes to ``late`` (an answer on its way is
        what a cancel would drop); a call with more poll time left (the client gone) is
        cancelled, releasing the broker's hold (an answer crossing that cancel is still lost).
        """
        call = method(request, timeout=deadline_s)
        ends = anyio.current_time() + deadline_s - self._rpc_timeout_s
        done = anyio.Event()
        call.add_done_callback(lambda _call: done.set())
        try:
            await done.wait()
        except BaseException:
            if call.done() or ends - anyio.current_time() <= UNARY_DETACH_S:
                self._detach(call, late)
            else:
                call.cancel()
            raise
        response = await self._answer(call)
        convert.raise_for_status(response.status)
        result: R = response
        return result

    async def _answer(self, call: Awaitable[R]) -> R:
        """Await a unary call. A call cancelled under its caller (this port's channel closed:
        a retired port closed while its long polls hold) raises grpc's bare CancelledError in
        a task nobody cancelled; let out, it reads as that task's cancel, and a task group
        takes it as a sibling's, cancelling every sibling (all the proxy's broker calls in
        BrokerCalls' owner). It is the broker out of reach through this port instead."""
        try:
            with map_rpc_errors(self._name):
                return await call
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise  # the caller's own cancel
            raise BrokerUnavailableError(
                self._name, "CANCELLED: the call was cancelled under its caller (port closed)"
            ) from None

    def _detach(self, call: Any, late: Callable[[pb.LinkResponse], None]) -> None:
        """Let a unary long poll whose caller gave up end by itself; its answer goes to
        ``late`` (nothing is left to wait for it once the port closes: cancelled then)."""
        if self._closing:  # no owner is made after close: nothing would close it
            call.cancel()
            return
        owner = self._late_tasks
        if owner is None:
            owner = self._late_tasks = TaskOwner(f"late-calls:{self._name}", grace_s=0)
        work = self._late_answer(call, late)
        if owner.spawn(work, f"late-call:{self._name}") is None:
            call.cancel()  # closing
        else:
            self._detached.add(call)

    async def _late_answer(self, call: Any, late: Callable[[pb.LinkResponse], None]) -> None:
        try:
            response = await self._answer(call)
        except (PopmqError, grpc.aio.AioRpcError):
            return  # no answer: the broker took nothing for it
        finally:
            self._detached.discard(call)
        answer = pb.LinkResponse()
        answer.pop.CopyFrom(response)
        late(answer)

    def _recode(self, error: BrokerUnavailableError) -> None:
        """Give ``error`` this port's code for an unreachable broker, if it has one."""
        if self._unreachable_code is not None:
            error.code = self._unreachable_code

    def _deadline(self, poll_time_ms: int = 0) -> float:
        return self._rpc_timeout_s + max(poll_time_ms, 0) / 1000

    async def _call(
        self, method: Callable[..., Awaitable[R]], request: object, deadline_s: float
    ) -> R:
        try:
            response = await self._answer(method(request, timeout=deadline_s))
        except BrokerUnavailableError as error:
            self._recode(error)
            raise
        convert.raise_for_status(response.status)  # type: ignore[attr-defined]
        return response

    async def describe(self) -> str:
        """The name the broker reports for itself (a connectivity and wiring check)."""
        stub = self._get_stub()
        response = await self._call(stub.Describe, pb.DescribeRequest(), self._deadline())
        return response.name

    # -- produce -------------------------------------------------------------------------------

    async def send(self, messages: list[Message], queue_id: int = -1) -> list[SendResult]:
        topics = {m.topic for m in messages}
        if self._streamed and len(topics) == 1:
            self._start_link()
            if self._sends is not None:
                try:
                    return await self._sends.submit((topics.pop(), queue_id), messages)
                except BrokerUnavailableError as error:
                    self._recode(error)
                    raise
        return await self._send_now((messages[0].topic if messages else "", queue_id), messages)

    async def _send_now(self, key: tuple[str, int], messages: list[Message]) -> list[SendResult]:
        stub = self._get_stub()
        request = pb.SendRequest(queue_id=key[1])
        for message in messages:  # each body copied once, into the request
            convert.message_into(request.messages.add(), message)
        response = await self._linked("send", stub.Send, request, self._deadline())
        return [convert.send_result_from_proto(r) for r in response.results]

    # -- POP -----------------------------------------------------------------------------------

    async def pop(self, request: PopRequest) -> PopResult:
        stub = self._get_stub()
        response = await self._linked(
            "pop",
            stub.Pop,
            convert.pop_request_to_proto(request),
            self._deadline(request.poll_time_ms),
            held=request.poll_time_ms > 0,
            late=functools.partial(self._late_pop, request.group, request.topic),
        )
        return convert.pop_result_from_proto(response)

    def _late_pop(self, group: str, topic: str, answer: pb.LinkResponse) -> None:
        """A pop whose caller gave up (its deadline, the client gone) was answered anyway: the
        broker took messages just before the cancel reached it (a held pop woken as the
        proxy's deadline passed). Nobody will deliver them: hand them back, visible again at
        once, rather than leave them invisible for their whole invisible time (counted in
        ``late_popped``). An answer without a pop is the broker's word that nothing was
        taken. A unary pop's late answer comes here from ``_held_call`` (one whose call was
        cancelled with poll time left, its client gone, is dropped by gRPC)."""
        if answer.WhichOneof("result") != "pop" or not answer.pop.messages:
            return
        handles = [popped.receipt_handle for popped in answer.pop.messages]
        self.late_popped += len(handles)
        owner = self._link_tasks if self._link_tasks is not None else self._late_tasks
        work = self._hand_back_late(group, topic, handles)
        if owner is None:
            work.close()
        if owner is None or owner.spawn(work, f"late-pop:{self._name}") is None:
            # closing: they come back after their invisible time
            log.warning("%d message(s) of a late pop answer on %s are not handed back (closing)",
                        len(handles), self._name)  # fmt: skip

    async def _hand_back_late(self, group: str, topic: str, handles: list[str]) -> None:
        try:
            try:
                await self.hand_back(group, topic, handles)
            except PopmqError as error:
                if error.code is not Code.NOT_IMPLEMENTED:
                    raise
                # A broker from before HandBack: visible again by a change of invisible time,
                # handle by handle as the proxy's own release does (one refused stops none).
                failed: PopmqError | None = None
                for handle in handles:
                    try:
                        await self.change_invisible_time(group, topic, handle, 0)
                    except PopmqError as each:
                        failed = each
                if failed is not None:
                    raise failed from None
        except PopmqError as error:
            log.warning("could not hand back %d message(s) of a late pop answer on %s: %s "
                        "(they come back after their invisible time)",
                        len(handles), self._name, error)  # fmt: skip

    async def ack(self, group: str, topic: str, entries: list[AckEntry]) -> list[AckEntryResult]:
        if self._streamed:
            self._start_link()
            if self._acks is not None:
                try:
                    return await self._acks.submit((group, topic), entries)
                except BrokerUnavailableError as error:
                    self._recode(error)
                    raise
        return await self._ack_now((group, topic), entries)

    async def _ack_now(self, key: tuple[str, str], entries: list[AckEntry]) -> list[AckEntryResult]:
        stub = self._get_stub()
        request = pb.AckRequest(
            group=key[0], topic=key[1], entries=[convert.ack_entry_to_proto(e) for e in entries]
        )
        response = await self._linked("ack", stub.Ack, request, self._deadline())
        return [convert.ack_result_from_proto(r) for r in response.results]

    async def change_invisible_time(
        self, group: str, topic: str, receipt_handle: str, invisible_time_ms: int
    ) -> ChangeInvisibleResult:
        stub = self._get_stub()
        request = pb.ChangeInvisibleTimeRequest(
            group=group,
            topic=topic,
            receipt_handle=receipt_handle,
            invisible_time_ms=invisible_time_ms,
        )
        response = await self._linked(
            "change_invisible_time", stub.ChangeInvisibleTime, request, self._deadline()
        )
        return convert.change_invisible_from_proto(response)

    async def hand_back(self, group: str, topic: str, receipt_handles: list[str]) -> int:
        """Unary (a rare call, off the hot path). A broker from before HandBack answers
        UNIMPLEMENTED: refused with NOT_IMPLEMENTED, which callers take as "use a change of
        invisible time instead"."""
        stub = self._get_stub()
        request = pb.HandBackRequest(group=group, topic=topic, receipt_handles=receipt_handles)
        try:
            response = await self._call(stub.HandBack, request, self._deadline())
        except BrokerUnavailableError as error:
            cause = error.__cause__
            if (
                isinstance(cause, grpc.aio.AioRpcError)
                and cause.code() == grpc.StatusCode.UNIMPLEMENTED
            ):
                raise RefusedError(
                    Code.NOT_IMPLEMENTED, f"broker {self._name} does not know HandBack"
                ) from error
            raise
        return int(response.handed_back)

    async def notify(self, request: NotifyRequest) -> NotifyResult:
        stub = self._get_stub()
        response = await self._linked(
            "notify",
            stub.Notify,
            convert.notify_request_to_proto(request),
            self._deadline(request.poll_time_ms),
            held=request.poll_time_ms > 0,
        )
        return convert.notify_result_from_proto(response)

    async def forward_to_dlq(self, group: str, topic: str, receipt_handle: str) -> None:
        stub = self._get_stub()
        request = pb.ForwardToDlqRequest(group=group, topic=topic, receipt_handle=receipt_handle)
        await self._linked("forward_to_dlq", stub.ForwardToDlq, request, self._deadline())

    async def recall(self, topic: str, recall_handle: str) -> str:
        stub = self._get_stub()
        request = pb.RecallRequest(topic=topic, recall_handle=recall_handle)
        response = await self._call(stub.Recall, request, self._deadline())
        return str(response.message_id)

    async def end_transaction(
        self, topic: str, message_id: str, transaction_id: str, commit: bool, source: str = ""
    ) -> None:
        stub = self._get_stub()
        request = pb.EndTransactionRequest(topic=topic, message_id=message_id,
                                           transaction_id=transaction_id, commit=commit,
                                           source=source)  # fmt: skip
        await self._call(stub.EndTransaction, request, self._deadline())

    async def claim_transaction_checks(
        self, topics: list[str], limit: int = 64
    ) -> list[TransactionCheck]:
        stub = self._get_stub()
        request = pb.ClaimTransactionChecksRequest(topics=topics, limit=limit)
        response = await self._call(stub.ClaimTransactionChecks, request, self._deadline())
        return [convert.transaction_check_from_proto(c) for c in response.checks]

    async def list_transactions(self) -> list[HalfMessageInfo]:
        stub = self._get_stub()
        request = pb.ListTransactionsRequest()
        response = await self._call(stub.ListTransactions, request, self._deadline())
        return [convert.half_info_from_proto(h) for h in response.halves]

    # -- pull and offsets ----------------------------------------------------------------------

    async def pull(self, request: PullRequest) -> PullResult:
        stub = self._get_stub()
        response = await self._linked(
            "pull",
            stub.Pull,
            convert.pull_request_to_proto(request),
            self._deadline(request.poll_time_ms),
            held=request.poll_time_ms > 0,
        )
        return convert.pull_result_from_proto(response)

    async def get_consumer_offset(self, group: str, topic: str, queue_id: int) -> int:
        stub = self._get_stub()
        request = pb.QueueRef(group=group, topic=topic, queue_id=queue_id)
        response = await self._call(stub.GetConsumerOffset, request, self._deadline())
        return response.offset

    async def update_consumer_offset(
        self, group: str, topic: str, queue_id: int, offset: int
    ) -> None:
        stub = self._get_stub()
        request = pb.UpdateConsumerOffsetRequest(
            group=group, topic=topic, queue_id=queue_id, offset=offset
        )
        await self._call(stub.UpdateConsumerOffset, request, self._deadline())

    async def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        stub = self._get_stub()
        request = pb.OffsetForTimestampRequest(
            topic=topic, queue_id=queue_id, timestamp_ms=timestamp_ms
        )
        response = await self._call(stub.OffsetForTimestamp, request, self._deadline())
        return response.offset

    # -- administration ------------------------------------------------------------------------

    async def create_topic(self, topic: str, queue_count: int, message_type: str = "") -> TopicInfo:
        stub = self._get_stub()
        request = pb.CreateTopicRequest(
            topic=topic, queue_count=queue_count, message_type=message_type
        )
        response = await self._call(stub.CreateTopic, request, self._deadline())
        return convert.topic_from_proto(response.topic)

    async def get_topic(self, topic: str, auto_create: bool = False) -> TopicInfo:
        stub = self._get_stub()
        request = pb.GetTopicRequest(topic=topic, auto_create=auto_create)
        response = await self._call(stub.GetTopic, request, self._deadline())
        return convert.topic_from_proto(response.topic)

    async def list_topics(self) -> list[TopicInfo]:
        stub = self._get_stub()
        response = await self._call(stub.ListTopics, pb.ListTopicsRequest(), self._deadline())
        return [convert.topic_from_proto(t) for t in response.topics]

    async def delete_topic(self, topic: str) -> None:
        stub = self._get_stub()
        await self._call(stub.DeleteTopic, pb.DeleteTopicRequest(topic=topic), self._deadline())

    async def get_group(self, group: str) -> GroupConfig:
        stub = self._get_stub()
        response = await self._call(
            stub.GetGroup, pb.GetGroupRequest(group=group), self._deadline()
        )
        return convert.group_from_proto(response.group)

    async def update_group(self, config: GroupConfig) -> GroupConfig:
        stub = self._get_stub()
        response = await self._call(
            stub.UpdateGroup, convert.group_to_proto(config), self._deadline()
        )
        return convert.group_from_proto(response.group)

    async def list_groups(self) -> list[GroupSummary]:
        stub = self._get_stub()
        response = await self._call(stub.ListGroups, pb.ListGroupsRequest(), self._deadline())
        return [convert.group_summary_from_proto(g) for g in response.groups]

    async def delete_group(
        self, group: str, clean_offsets: bool = False, force: bool = False
    ) -> GroupDeleted:
        stub = self._get_stub()
        request = pb.DeleteGroupRequest(group=group, clean_offsets=clean_offsets, force=force)
        response = await self._call(stub.DeleteGroup, request, self._deadline())
        return GroupDeleted(response.inflight, response.offsets_removed)

    async def group_stats(self, group: str, topic: str) -> list[GroupQueueStats]:
        stub = self._get_stub()
        request = pb.GroupStatsRequest(group=group, topic=topic)
        response = await self._call(stub.GroupStats, request, self._deadline())
        return [convert.group_stats_from_proto(s) for s in response.stats]

    async def aclose(self) -> None:
        self._closing = True
        if self._requests is not None:
            self._requests.close()
        owner, self._link_tasks = self._link_tasks, None
        if owner is not None:
            await owner.aclose()
        late, self._late_tasks = self._late_tasks, None
        if late is not None:
            await late.aclose()
        for call in self._detached:  # the port closes: nothing is left to take the answers
            call.cancel()
        self._detached.clear()
        self._requests = self._acks = self._sends = None
        link, self._watch_link = self._watch_link, None
        if link is not None:
            await link.aclose()
        channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            await channel.close()
