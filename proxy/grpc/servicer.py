"""MessagingServiceServicer: apache.rocketmq.v2.MessagingService over the proxy core.

Each RPC is translated (proxy/grpc/{routes,clients,send,handles,offsets,receive}.py: protobuf
to the core's domain objects and back) and served by the core (popmq.proxy.core). Every RPC
answers with a RocketMQ Status, never a gRPC error: the core raises RefusedError for bad
requests, and any other exception becomes INTERNAL_ERROR. Streams (ReceiveMessage,
PullMessage) always end with their trailing frame.

Every method is wrapped once, at start-up, by the one seam that records its RPC metrics
(proxy/metrics.py RPC_METRICS through an RpcMeter): a unary call by its answer's code, a stream
by the code its handler returns, WRITE_STALLED when its client stopped reading, CLIENT_GONE when
it ended by an exception (the client went away or the call was cancelled). Only Telemetry,
one long stream of many settings answers, records each answer itself, and ReceiveMessage
records the same metrics in the receive's own coroutine, so that a held long poll keeps one
frame of this module's instead of two (a frame per held poll is memory per poll).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
import grpc
from popmq.broker.contract.errors import Code, RefusedError
from popmq.proxy.admission import poll_owner
from popmq.proxy.core.processor import ProxyCore
from popmq.proxy.core.transactions import OrphanCheck
from popmq.proxy.grpc import clients, handles, offsets, routes, send
from popmq.proxy.grpc import status as st
from popmq.proxy.grpc.convert import popped_into, stored_into, timestamp
from popmq.proxy.grpc.headers import RequestContext, request_context, text_headers
from popmq.proxy.grpc.namespace import served_in
from popmq.proxy.grpc.receive import receive_request, shared_name
from popmq.proxy.grpc.stall import WriterStalled, writes_within
from popmq.proxy.metrics import ProxyMetrics, RpcMeter

from popmq.budget import MemoryBudget
from popmq.clock import SYSTEM, Clock
from popmq.config import ProxyConfig
from popmq.handing import hands_over
from popmq.lifecycle import TaskOwner
from popmq.pb.rocketmq.v2 import service_pb2 as s
from popmq.pb.rocketmq.v2 import service_pb2_grpc

# The status frame of every empty receive (most idle receives end so): built once. A write
# serializes the frame before it returns, and it names no resource a namespace would rename.
_NO_NEW_MESSAGE = s.ReceiveMessageResponse(
    status=st.status(Code.MESSAGE_NOT_FOUND, "no new message")
)
# Commands and check-backs waiting for a Telemetry stream (a client sends few commands).
_TELEMETRY_BUFFER = 64
Resp = TypeVar("Resp")
Translator = Callable[[ProxyCore, Any, RequestContext], Awaitable[Any]]
OnError = Callable[[Any, Any], None]
Handler = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]
# A stream handler writes its frames and returns its RPC's code.
StreamHandler = Callable[[Any, grpc.aio.ServicerContext], Awaitable["int | str"]]


def _poll_owner(ctx: RequestContext, headers: dict[str, str]) -> str:
    return poll_owner(ctx.client_id, ctx.peer, headers.get("authorization", ""))


def _long_poll_context(context: grpc.aio.ServicerContext) -> tuple[RequestContext, str]:
    """The call's context and its admission key. The headers dict stays here: a held long
    poll keeps only what it uses (10,000 idle ones each held theirs, ~1.3 KiB, tracemalloc)."""
    headers = text_headers(context)
    ctx = request_context(context, headers)
    # One string per client, not one per call: a held receive's frame keeps it (and
    # admission's count of that client keys on the same one).
    return ctx, shared_name(_poll_owner(ctx, headers))


def _one_entry_each(response: s.SendMessageResponse, req: s.SendMessageRequest) -> None:
    for msg in req.messages:
        response.entries.add(status=response.status, message_id=msg.system_properties.message_id)


def _keep_handle(
    response: s.ChangeInvisibleDurationResponse, req: s.ChangeInvisibleDurationRequest
) -> None:
    # Clients adopt this handle before reading the status: give theirs back.
    response.receipt_handle = req.receipt_handle


def _not_implemented(what: str) -> Translator:
    async def refuse(core: ProxyCore, request: Any, ctx: RequestContext) -> Any:
        raise RefusedError(Code.NOT_IMPLEMENTED, f"popmq does not support {what}")

    return refuse


class MessagingServicer(service_pb2_grpc.MessagingServiceServicer):
    """gRPC method names are the protocol's (CamelCase)."""

    def __init__(
        self,
        core: ProxyCore,
        metrics: ProxyMetrics,
        config: ProxyConfig | None = None,
        streams: TaskOwner | None = None,
        clock: Clock = SYSTEM,
    ) -> None:
        config = config or ProxyConfig()
        self.core = core
        self.metrics = metrics
        self._clock = clock
        # Owns the tasks reading Telemetry commands (one per open stream).
        self._streams = streams or TaskOwner("telemetry", grace_s=0)
        self._stall_s = config.write_stall_timeout_ms / 1000
        self._budget = MemoryBudget(
            config.max_inflight_bytes,
            "this proxy",
            self.metrics.budget_refused,
            config.inflight_wait_ms,
        )
        budget = self._budget
        self.metrics.watch_inflight_bytes(lambda: budget.held)
        self._telemetry_meter = self._meter("Telemetry")
        # The protocol's methods, each wrapped once by the seam that records its metrics
        # (instance attributes: grpc looks the handlers up on the servicer).
        for method, translator, response_type, on_error in self._unary_methods():
            setattr(self, method, self._metered_unary(method, translator, response_type, on_error))
        # ReceiveMessage records the same metrics in the receive's own coroutine instead of
        # the seam's: a held long poll keeps one frame of the servicer's, not two (280 B a
        # held poll; docs/benchmarks.md, "Idle polls, wave 11").
        self._receive_meter = self._meter("ReceiveMessage")
        for method, handler in (
            ("ReceiveMessage", hands_over(self._receive_message)),
            ("PullMessage", self._metered_stream("PullMessage", self._pull_message)),
        ):
            setattr(self, method, handler)

    # -- the one seam: RPC metrics -----------------------------------------------------------
    def _meter(self, method: str) -> RpcMeter:
        return self.metrics.meter(method, self._clock.monotonic)

    def _unary_methods(self) -> tuple[tuple[str, Translator, type, OnError | None], ...]:
        async def send_within_budget(core: ProxyCore, req: Any, ctx: RequestContext) -> Any:
            return await send.send_message(core, req, ctx, self._budget)

        return (
            ("QueryRoute", routes.query_route, s.QueryRouteResponse, None),
            ("Heartbeat", clients.heartbeat, s.HeartbeatResponse, None),
            ("NotifyClientTermination", clients.notify_termination,
             s.NotifyClientTerminationResponse, None),
            ("QueryAssignment", routes.query_assignment, s.QueryAssignmentResponse, None),
            ("SendMessage", send_within_budget, s.SendMessageResponse, _one_entry_each),
            ("AckMessage", handles.ack_message, s.AckMessageResponse, None),
            ("ChangeInvisibleDuration", handles.change_invisible_duration,
             s.ChangeInvisibleDurationResponse, _keep_handle),
            ("ForwardMessageToDeadLetterQueue", handles.forward_to_dlq,
             s.ForwardMessageToDeadLetterQueueResponse, None),
            ("QueryOffset", offsets.query_offset, s.QueryOffsetResponse, None),
            ("GetOffset", offsets.get_offset, s.GetOffsetResponse, None),
            ("UpdateOffset", offsets.update_offset, s.UpdateOffsetResponse, None),
            ("EndTransaction", send.end_transaction, s.EndTransactionResponse, None),
            ("RecallMessage", send.recall_message, s.RecallMessageResponse, None),
            ("SyncLiteSubscription", _not_implemented("lite topics"),
             s.SyncLiteSubscriptionResponse, None),
        )  # fmt: skip

    def _metered_unary(
        self,
        method: str,
        translator: Translator,
        response_type: type[Resp],
        on_error: OnError | None,
    ) -> Handler:
        meter = self._meter(method)
        now = meter.now
        core = self.core

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Resp:
            started = now()
            ctx = request_context(context)
            try:
                response = await translator(core, request, ctx)
            except Exception as exc:
                response = response_type(status=st.status_of(exc))  # type: ignore[call-arg]
                if on_error is not None:
                    on_error(response, request)
            meter.record(response.status.code, started)
            return response

        return unary

    def _metered_stream(self, method: str, handler: StreamHandler) -> Handler:
        meter = self._meter(method)
        now = meter.now
        stalled = self.metrics.stream_stalled

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> None:
            started = now()
            try:
                code = await handler(request, context)
            except WriterStalled:
                # The client stopped reading (popmq.proxy.grpc.stall): counted, then ended as
                # cancelled, the one way grpc.aio ends a call whose write is still queued (no
                # status can pass it, and no traceback is logged for it).
                stalled(method)
                meter.record("WRITE_STALLED", started)
                raise asyncio.CancelledError from None
            except BaseException:
                meter.record("CLIENT_GONE", started)
                raise
            meter.record(code, started)

        return stream

    # -- route and clients -------------------------------------------------------------------
    async def Telemetry(
        self, request_iterator: AsyncIterator[s.TelemetryCommand], context
    ) -> AsyncIterator[s.TelemetryCommand]:
        """Answers the client's settings; to a producer it also sends transaction check-backs
        (RecoverOrphanedTransactionCommand). Its commands are read by a task of the stream
        owner into one channel with the check-backs, so either wakes the stream."""
        ctx = request_context(context)
        core = self.core
        meter = self._telemetry_meter
        channels = core.transactions.channels
        send_end, receive_end = anyio.create_memory_object_stream[Any](_TELEMETRY_BUFFER)
        closed = (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError)

        async def pump() -> None:
            async with send_end:
                async for command in request_iterator:
                    await send_end.send(command)

        def deliver(check: OrphanCheck) -> bool:
            try:
                send_end.send_nowait(check)
            except closed:
                return False
            return True

        key = object()
        job = self._streams.spawn(pump(), "telemetry-commands", log_errors=False)
        try:
            if job is None:
                return  # the proxy is stopping
            async with receive_end:
                async for item in receive_end:
                    if isinstance(item, OrphanCheck):
                        yield clients.orphan_check_pb(item)
                        continue
                    command = item
                    if command.WhichOneof("command") != "settings":
                        continue  # stack traces, verify results: nothing asked them of us
                    started = meter.now()
                    try:
                        reply = await clients.answer_settings(core, command.settings, ctx)
                        answer = s.TelemetryCommand(status=st.ok(), settings=reply)
                        core.clients.telemetry(ctx, True)
                        published = clients.published_topics(command.settings)
                        if published is not None:
                            channels.open(key, published, deliver)
                    except Exception as exc:
                        answer = s.TelemetryCommand(status=st.status_of(exc))
                    meter.record(answer.status.code, started)
                    yield answer
        finally:
            channels.close(key)
            if job is not None:
                job.cancel()
            core.clients.telemetry(ctx, False)

    # -- POP consumption ---------------------------------------------------------------------
    def _receive_message(
        self, request: s.ReceiveMessageRequest, context: grpc.aio.ServicerContext
    ) -> Awaitable[None]:
        """Admission, then the receive's own coroutine, which grpc.aio awaits (handed over):
        no frame of this call's kept while the receive is held but that one (a frame per held
        poll is memory per poll). Metered as the seam meters a stream (`_metered_stream`)."""
        meter = self._receive_meter
        started = meter.now()
        try:
            ctx, client = _long_poll_context(context)
            # Admission first: a refused receive costs no broker call and answers at once.
            group = shared_name(request.group.name)  # kept by the held frame: one per group
            try:
                self.core.receiver.admit(client, group)
            except Exception as exc:
                return self._refuse_receive(context, st.status_of(exc), started)
        except BaseException:
            meter.record("CLIENT_GONE", started)
            raise
        return self._receive(request, context, ctx, client, group, started)

    async def _refuse_receive(
        self, context: grpc.aio.ServicerContext, failed: Any, started: float
    ) -> None:
        try:
            await self._finish_receive(context, failed)
        except BaseException:
            self._receive_meter.record("CLIENT_GONE", started)
            raise
        self._receive_meter.record(int(failed.code), started)

    async def _receive(
        self,
        request: s.ReceiveMessageRequest,
        context: grpc.aio.ServicerContext,
        ctx: RequestContext,
        client: str,
        group: str,
        started: float,
    ) -> None:
        """The held frame: the plan, the wait, the empty or failed answer. Messages are
        written by `_deliver`, whose frame exists only once there are some."""
        receiver = self.core.receiver
        # All the end needs of the request context: the wait keeps no more of it (its object
        # and the call's request id, about 0.2 KiB of each held poll).
        deadline, clock = ctx.deadline, ctx.clock
        code: int | str
        try:
            try:
                try:
                    plan = await receiver.plan(receive_request(request), ctx)
                    del ctx
                    popped = await receiver.receive(plan)
                except Exception as exc:
                    failed = st.status_of(exc)
                    await self._finish_receive(context, failed)
                    code = failed.code
                else:
                    if popped:
                        code = await self._deliver(request, context, plan, popped)
                    else:
                        await self._finish_receive(context, None)
                        code = Code.MESSAGE_NOT_FOUND
            finally:
                receiver.leave(client, group)
                if deadline is not None and clock.monotonic() > deadline:
                    # Our answer left after the client's deadline: it saw DEADLINE_EXCEEDED
                    # (RequestContext.past_deadline).
                    self.metrics.late_answer()
        except WriterStalled:
            # As the seam counts a stalled stream (`_metered_stream`).
            self.metrics.stream_stalled("ReceiveMessage")
            self._receive_meter.record("WRITE_STALLED", started)
            raise asyncio.CancelledError from None
        except BaseException:
            self._receive_meter.record("CLIENT_GONE", started)
            raise
        self._receive_meter.record(code, started)

    async def _deliver(
        self,
        request: s.ReceiveMessageRequest,
        context: grpc.aio.ServicerContext,
        plan: Any,
        popped: Any,
    ) -> int | str:
        receiver = self.core.receiver
        size = sum(len(m.message.body) for m in popped)
        try:
            await self._budget.acquire(size)
        except RefusedError as exc:  # over the memory budget: give them back at once
            receiver.release_unsent(plan, popped)
            await self._finish_receive(context, st.status_of(exc))
            return exc.code
        except BaseException:  # the client went away while waiting for room: the same
            receiver.release_unsent(plan, popped)
            raise
        sent = 0  # messages written
        writing = False  # popped[sent] is being written
        stall_s = self._stall_s
        # A namespaced call's frames are built as the client names things, once each,
        # and written past the namespace wrapper's per-frame walk.
        own_context, served_namespace = served_in(context)
        try:
            with writes_within(own_context, stall_s) as write:
                await write(s.ReceiveMessageResponse(status=st.ok()))
                now = self._clock.now_ms()
                namespace = request.message_queue.topic.resource_namespace
                for message in popped:
                    frame = s.ReceiveMessageResponse()
                    popped_into(frame.message, message, now, namespace, served_namespace)
                    writing = True
                    await write(frame)
                    writing = False
                    sent += 1
                await write(
                    s.ReceiveMessageResponse(delivery_timestamp=timestamp(self._clock.now_ms()))
                )
        except BaseException:
            # The client is gone or stopped reading: what was never written becomes visible
            # again at once. A message whose write began counts as delivered: its frame may
            # have reached the client (a write is queued in grpc-core before it completes),
            # so it keeps its lease; handed back, it would be delivered twice with no
            # attempt counted (docs/longpolling.md, "Messages popped for a client that went
            # away").
            receiver.release_unsent(plan, popped[sent + writing :])
            if writing:
                receiver.keep_in_doubt(popped[sent])
            raise
        finally:
            self._budget.release(size)
        return Code.OK

    async def _finish_receive(self, context: grpc.aio.ServicerContext, status: Any) -> None:
        """The status frame (None: the empty answer's, built once) and the delivery time."""
        first = _NO_NEW_MESSAGE if status is None else s.ReceiveMessageResponse(status=status)
        try:
            await context.write(first)
            await context.write(
                s.ReceiveMessageResponse(delivery_timestamp=timestamp(self._clock.now_ms()))
            )
        except asyncio.CancelledError:
            raise
        except Exception:
            pass  # the client is gone; nothing was popped

    # -- offsets -----------------------------------------------------------------------------
    def _pull_message(
        self, request: s.PullMessageRequest, context: grpc.aio.ServicerContext
    ) -> Awaitable[int | str]:
        """Admission (of a pull that may wait), then the pull's own coroutine, awaited by the
        seam (no frame of this call's kept while the pull is held, as for a receive)."""
        ctx, client = _long_poll_context(context)
        # A pull that may wait is a long poll like a receive: held under the same bounds.
        held = request.long_polling_timeout.ToMilliseconds() > 0
        group = request.group.name
        try:
            if held:
                self.core.receiver.admit(client, group)
        except Exception as exc:
            return self._refuse_pull(context, st.status_of(exc))
        return self._pull(request, context, ctx, client if held else None, group)

    async def _refuse_pull(self, context: grpc.aio.ServicerContext, failed: Any) -> int:
        await self._write_quietly(context, s.PullMessageResponse(status=failed))
        return int(failed.code)

    async def _pull(
        self,
        request: s.PullMessageRequest,
        context: grpc.aio.ServicerContext,
        ctx: RequestContext,
        held_by: str | None,
        group: str,
    ) -> int | str:
        try:
            try:
                result = await offsets.pull_message(self.core, request, ctx)
            except Exception as exc:
                failed = st.status_of(exc)
                await self._write_quietly(context, s.PullMessageResponse(status=failed))
                return failed.code
            code, text = offsets.pull_status(result)
            # The messages draw from the budget until written, as a receive's (a pull changes no
            # state at the broker: a refused one is simply asked again).
            size = sum(len(m.body) for m in result.messages)
            try:
                await self._budget.acquire(size)
            except RefusedError as exc:
                await self._write_quietly(context, s.PullMessageResponse(status=st.status_of(exc)))
                return exc.code
            own_context, served_namespace = served_in(context)  # as in _receive
            try:
                with writes_within(own_context, self._stall_s) as write:
                    await write(s.PullMessageResponse(status=st.status(code, text)))
                    namespace = request.message_queue.topic.resource_namespace
                    for message in result.messages:
                        frame = s.PullMessageResponse()
                        stored_into(frame.message, message, namespace, served_namespace)
                        await write(frame)
                    await write(s.PullMessageResponse(next_offset=result.next_offset))
            finally:
                self._budget.release(size)
            return code
        finally:
            if held_by is not None:
                self.core.receiver.leave(held_by, group)

    async def _write_quietly(self, context: grpc.aio.ServicerContext, frame: Any) -> None:
        try:
            await context.write(frame)
        except asyncio.CancelledError:
            raise
        except Exception:
            pass
