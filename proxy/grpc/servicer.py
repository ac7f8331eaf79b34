"""MessagingServiceServicer: apache.rocketmq.v2.MessagingService over the proxy core.

Each RPC is translated (proxy/grpc/{routes,clients,send,handles,offsets,receive}.py: protobuf
to the core's domain objects and back) and served by the core (popmq.proxy.core). Every RPC
answers with a RocketMQ Status, never a gRPC error: the core raises RefusedError for bad
requests, and any other exception becomes INTERNAL_ERROR. Streams (ReceiveMessage,
PullMessage) always end with their trailing frame.
"""

from __future__ import annotations

import asyncio
import time
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
from popmq.proxy.grpc.receive import receive_request
from popmq.proxy.grpc.stall import WriterStalled, writes_within
from popmq.proxy.metrics import ProxyMetrics

from popmq.budget import MemoryBudget
from popmq.config import ProxyConfig
from popmq.lifecycle import TaskOwner
from popmq.pb.rocketmq.v2 import service_pb2 as s
from popmq.pb.rocketmq.v2 import service_pb2_grpc

# Commands and check-backs waiting for a Telemetry stream (a client sends few commands).
_TELEMETRY_BUFFER = 64
# Code(code).name is an enum lookup per RPC; the names by value are read once.
_CODE_NAMES: dict[int, str] = {code.value: code.name for code in Code}
Req = TypeVar("Req")
Resp = TypeVar("Resp")
Translator = Callable[[ProxyCore, Any, RequestContext], Awaitable[Any]]


def _poll_owner(ctx: RequestContext, headers: dict[str, str]) -> str:
    return poll_owner(ctx.client_id, ctx.peer, headers.get("authorization", ""))


def _long_poll_context(context: grpc.aio.ServicerContext) -> tuple[RequestContext, str]:
    """The call's context and its admission key. The headers dict stays here: a held long
    poll keeps only what it uses (10,000 idle ones each held theirs, ~1.3 KiB, tracemalloc)."""
    headers = text_headers(context)
    ctx = request_context(context, headers)
    return ctx, _poll_owner(ctx, headers)


def _now_ms() -> int:
    # The delivery timestamp is a stamp for the client's clock, not a deadline: real wall time.
    return int(time.time() * 1000)


class MessagingServicer(service_pb2_grpc.MessagingServiceServicer):
    """gRPC method names are the protocol's (CamelCase)."""

    def __init__(
        self,
        core: ProxyCore,
        metrics: ProxyMetrics,
        config: ProxyConfig | None = None,
        streams: TaskOwner | None = None,
    ) -> None:
        config = config or ProxyConfig()
        self.core = core
        self.metrics = metrics
        # Owns the tasks reading Telemetry commands (one per open stream).
        self._streams = streams or TaskOwner("telemetry", grace_s=0)
        # Metric children by label values: labels() is a lookup with locking on every RPC.
        self._counters: dict[tuple[str, str], Any] = {}
        self._timers: dict[str, Any] = {}
        self._stall_s = config.write_stall_timeout_ms / 1000
        self._budget = MemoryBudget(
            config.max_inflight_bytes,
            "this proxy",
            self.metrics.budget_refusals.inc,
            config.inflight_wait_ms,
        )
        budget = self._budget
        self.metrics.inflight_bytes.set_function(lambda: budget.held)

    # -- plumbing ----------------------------------------------------------------------------
    def _record(self, method: str, code: int | str, started: float) -> None:
        if isinstance(code, str):
            name = code
        else:
            name = _CODE_NAMES.get(code) or str(code)
        counter = self._counters.get((method, name))
        if counter is None:
            counter = self._counters[method, name] = self.metrics.rpc_requests.labels(method, name)
        timer = self._timers.get(method)
        if timer is None:
            timer = self._timers[method] = self.metrics.rpc_latency.labels(method)
        counter.inc()
        # RPC latency for metrics (started = time.perf_counter() at the call's start, the same
        # in every handler): a measurement of real elapsed time that no logic reads.
        elapsed = time.perf_counter() - started
        timer.observe(elapsed)
        self.metrics.observe_rpc(method, name, elapsed)

    async def _unary(
        self,
        method: str,
        translator: Translator,
        request: Any,
        context: grpc.aio.ServicerContext,
        response_type: type[Resp],
        on_error: Callable[[Resp, Any], None] | None = None,
    ) -> Resp:
        started = time.perf_counter()
        ctx = request_context(context)
        try:
            response = await translator(self.core, request, ctx)
        except Exception as exc:
            response = response_type(status=st.status_of(exc))  # type: ignore[call-arg]
            if on_error is not None:
                on_error(response, request)
        self._record(method, response.status.code, started)
        return response

    # -- route and clients -------------------------------------------------------------------
    async def QueryRoute(self, request, context):
        return await self._unary(
            "QueryRoute", routes.query_route, request, context, s.QueryRouteResponse
        )

    async def Heartbeat(self, request, context):
        return await self._unary(
            "Heartbeat", clients.heartbeat, request, context, s.HeartbeatResponse
        )

    async def NotifyClientTermination(self, request, context):
        return await self._unary(
            "NotifyClientTermination", clients.notify_termination, request, context,
            s.NotifyClientTerminationResponse,
        )  # fmt: skip

    async def QueryAssignment(self, request, context):
        return await self._unary(
            "QueryAssignment", routes.query_assignment, request, context,
            s.QueryAssignmentResponse,
        )  # fmt: skip

    async def Telemetry(
        self, request_iterator: AsyncIterator[s.TelemetryCommand], context
    ) -> AsyncIterator[s.TelemetryCommand]:
        """Answers the client's settings; to a producer it also sends transaction check-backs
        (RecoverOrphanedTransactionCommand). Its commands are read by a task of the stream
        owner into one channel with the check-backs, so either wakes the stream."""
        ctx = request_context(context)
        core = self.core
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
                    started = time.perf_counter()
                    try:
                        reply = await clients.answer_settings(core, command.settings, ctx)
                        answer = s.TelemetryCommand(status=st.ok(), settings=reply)
                        core.clients.telemetry(ctx, True)
                        published = clients.published_topics(command.settings)
                        if published is not None:
                            channels.open(key, published, deliver)
                    except Exception as exc:
                        answer = s.TelemetryCommand(status=st.status_of(exc))
                    self._record("Telemetry", answer.status.code, started)
                    yield answer
        finally:
            channels.close(key)
            if job is not None:
                job.cancel()
            core.clients.telemetry(ctx, False)

    # -- produce -----------------------------------------------------------------------------
    async def SendMessage(self, request, context):
        def one_entry_each(response: s.SendMessageResponse, req: s.SendMessageRequest) -> None:
            for msg in req.messages:
                response.entries.add(
                    status=response.status, message_id=msg.system_properties.message_id
                )

        async def within_budget(core: ProxyCore, req: Any, ctx: RequestContext) -> Any:
            return await send.send_message(core, req, ctx, self._budget)

        return await self._unary(
            "SendMessage", within_budget, request, context, s.SendMessageResponse,
            one_entry_each,
        )  # fmt: skip

    # -- POP consumption ---------------------------------------------------------------------
    async def ReceiveMessage(self, request, context):
        started = time.perf_counter()
        ctx, client = _long_poll_context(context)
        receiver = self.core.receiver
        # Admission first: a refused receive costs no broker call and answers at once.
        group = request.group.name
        try:
            receiver.admit(client, group)
        except Exception as exc:
            failed = st.status_of(exc)
            await self._finish_receive(context, failed)
            self._record("ReceiveMessage", failed.code, started)
            return
        try:
            await self._receive(request, context, ctx, started)
        except WriterStalled:
            self._stalled("ReceiveMessage", started)
        finally:
            receiver.leave(client, group)
            if ctx.past_deadline():
                # Our answer left after the client's deadline: it saw DEADLINE_EXCEEDED.
                self.metrics.late_answers.inc()

    async def _receive(
        self,
        request: s.ReceiveMessageRequest,
        context: grpc.aio.ServicerContext,
        ctx: RequestContext,
        started: float,
    ) -> None:
        receiver = self.core.receiver
        try:
            plan = await receiver.plan(receive_request(request), ctx)
            popped = await receiver.receive(plan)
        except Exception as exc:
            failed = st.status_of(exc)
            await self._finish_receive(context, failed)
            self._record("ReceiveMessage", failed.code, started)
            return
        if not popped:
            await self._finish_receive(context, st.status(Code.MESSAGE_NOT_FOUND, "no new message"))
            self._record("ReceiveMessage", Code.MESSAGE_NOT_FOUND, started)
            return
        size = sum(len(m.message.body) for m in popped)
        try:
            await self._budget.acquire(size)
        except RefusedError as exc:  # over the memory budget: give them back at once
            receiver.release_unsent(plan, popped)
            await self._finish_receive(context, st.status_of(exc))
            self._record("ReceiveMessage", exc.code, started)
            return
        sent = 0  # messages written
        writing = False  # popped[sent] is being written
        stall_s = self._stall_s
        # A namespaced call's frames are built as the client names things, once each,
        # and written past the namespace interceptor's per-frame walk.
        own_context, served_namespace = served_in(context)
        try:
            with writes_within(own_context, stall_s) as write:
                await write(s.ReceiveMessageResponse(status=st.ok()))
                now = _now_ms()
                namespace = request.message_queue.topic.resource_namespace
                for message in popped:
                    frame = s.ReceiveMessageResponse()
                    popped_into(frame.message, message, now, namespace, served_namespace)
                    writing = True
                    await write(frame)
                    writing = False
                    sent += 1
                await write(s.ReceiveMessageResponse(delivery_timestamp=timestamp(_now_ms())))
        except BaseException as exc:
            # The client is gone or stopped reading: what was never written becomes visible
            # again at once. A message whose write began counts as delivered: its frame may
            # have reached the client (a write is queued in grpc-core before it completes),
            # so it keeps its lease; handed back, it would be delivered twice with no
            # attempt counted (docs/longpolling.md, "Messages popped for a client that went
            # away").
            receiver.release_unsent(plan, popped[sent + writing :])
            if writing:
                receiver.keep_in_doubt(popped[sent])
            if not isinstance(exc, WriterStalled):
                self._record("ReceiveMessage", "CLIENT_GONE", started)
            raise
        finally:
            self._budget.release(size)
        self._record("ReceiveMessage", Code.OK, started)

    def _stalled(self, method: str, started: float) -> None:
        """End a stream whose client stopped reading (popmq.proxy.grpc.stall): counted, then
        ended as cancelled, the one way grpc.aio ends a call whose write is still queued
        (no status can pass it, and no traceback is logged for it)."""
        self.metrics.stalled_streams.labels(method).inc()
        self._record(method, "WRITE_STALLED", started)
        raise asyncio.CancelledError

    async def _finish_receive(self, context: grpc.aio.ServicerContext, status: Any) -> None:
        try:
            await context.write(s.ReceiveMessageResponse(status=status))
            await context.write(s.ReceiveMessageResponse(delivery_timestamp=timestamp(_now_ms())))
        except asyncio.CancelledError:
            raise
        except Exception:
            pass  # the client is gone; nothing was popped

    async def AckMessage(self, request, context):
        return await self._unary(
            "AckMessage", handles.ack_message, request, context, s.AckMessageResponse
        )

    async def ChangeInvisibleDuration(self, request, context):
        def keep_handle(
            response: s.ChangeInvisibleDurationResponse, req: s.ChangeInvisibleDurationRequest
        ) -> None:
            # Clients adopt this handle before reading the status: give theirs back.
            response.receipt_handle = req.receipt_handle

        return await self._unary(
            "ChangeInvisibleDuration", handles.change_invisible_duration, request, context,
            s.ChangeInvisibleDurationResponse, keep_handle,
        )  # fmt: skip

    async def ForwardMessageToDeadLetterQueue(self, request, context):
        return await self._unary(
            "ForwardMessageToDeadLetterQueue", handles.forward_to_dlq, request, context,
            s.ForwardMessageToDeadLetterQueueResponse,
        )  # fmt: skip

    # -- offsets -----------------------------------------------------------------------------
    async def PullMessage(self, request, context):
        started = time.perf_counter()
        ctx, client = _long_poll_context(context)
        # A pull that may wait is a long poll like a receive: held under the same bounds.
        held = request.long_polling_timeout.ToMilliseconds() > 0
        group = request.group.name
        try:
            if held:
                self.core.receiver.admit(client, group)
        except Exception as exc:
            failed = st.status_of(exc)
            await self._write_quietly(context, s.PullMessageResponse(status=failed))
            self._record("PullMessage", failed.code, started)
            return
        try:
            await self._pull(request, context, ctx, started)
        except WriterStalled:
            self._stalled("PullMessage", started)
        finally:
            if held:
                self.core.receiver.leave(client, group)

    async def _pull(
        self,
        request: s.PullMessageRequest,
        context: grpc.aio.ServicerContext,
        ctx: RequestContext,
        started: float,
    ) -> None:
        try:
            result = await offsets.pull_message(self.core, request, ctx)
        except Exception as exc:
            failed = st.status_of(exc)
            await self._write_quietly(context, s.PullMessageResponse(status=failed))
            self._record("PullMessage", failed.code, started)
            return
        code, text = offsets.pull_status(result)
        # The messages draw from the budget until written, as a receive's (a pull changes no
        # state at the broker: a refused one is simply asked again).
        size = sum(len(m.body) for m in result.messages)
        try:
            await self._budget.acquire(size)
        except RefusedError as exc:
            await self._write_quietly(context, s.PullMessageResponse(status=st.status_of(exc)))
            self._record("PullMessage", exc.code, started)
            return
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
        self._record("PullMessage", code, started)

    async def _write_quietly(self, context: grpc.aio.ServicerContext, frame: Any) -> None:
        try:
            await context.write(frame)
        except asyncio.CancelledError:
            raise
        except Exception:
            pass

    async def QueryOffset(self, request, context):
        return await self._unary(
            "QueryOffset", offsets.query_offset, request, context, s.QueryOffsetResponse
        )

    async def GetOffset(self, request, context):
        return await self._unary(
            "GetOffset", offsets.get_offset, request, context, s.GetOffsetResponse
        )

    async def UpdateOffset(self, request, context):
        return await self._unary(
            "UpdateOffset", offsets.update_offset, request, context, s.UpdateOffsetResponse
        )

    # -- not supported -----------------------------------------------------------------------
    async def _not_implemented(self, method: str, response_type: type[Resp], what: str) -> Resp:
        self._record(method, Code.NOT_IMPLEMENTED, time.perf_counter())
        failed = st.status(Code.NOT_IMPLEMENTED, f"popmq does not support {what}")
        return response_type(status=failed)  # type: ignore[call-arg]

    async def EndTransaction(self, request, context):
        return await self._unary(
            "EndTransaction", send.end_transaction, request, context, s.EndTransactionResponse
        )

    async def RecallMessage(self, request, context):
        return await self._unary(
            "RecallMessage", send.recall_message, request, context, s.RecallMessageResponse
        )

    async def SyncLiteSubscription(self, request, context):
        return await self._not_implemented(
            "SyncLiteSubscription", s.SyncLiteSubscriptionResponse, "lite topics"
        )
