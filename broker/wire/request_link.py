"""RequestLink: a proxy's hot-path requests to one broker on a few multiplexed Call streams.

Instead of one unary RPC per send/pop/ack, each request goes as a ``LinkRequest`` with an id on
one of ``streams`` long-lived bidirectional streams (popmq.broker.v1 ``Call``), and the broker
answers with a ``LinkResponse`` of the same id, in completion order. The streams share the
port's channel, so TLS and the cluster token apply as to every other call.

- Flow control: at most ``window`` requests are in flight per stream; more wait for a slot
  (HTTP/2 flow control bounds the bytes underneath). Held requests (long polls: a pop, notify
  or pull with a poll time) take no slot: they wait at the broker for up to their poll time, and
  thousands of them (bounded by the proxy's admission control and the broker's hold table)
  would otherwise keep every ack and send waiting behind them into its deadline.
- Encoding: each request (and answer) is encoded once, when it is queued (``Encoded``): its
  size is then known without encoding it again (upb's ByteSize encodes the whole message),
  and a frame is the join of its items' pieces, written as bytes (no LinkRequests message is
  built around them, which would copy every body once more).
- Size: a write carries what is queued up to ``FRAME_BYTES`` (one larger item goes alone), so
  requests or answers that are each fine never add up past the transport's message limit,
  which would end the stream and fail every request on it. A single request past the limit
  is refused on its own before it is sent.
- Deadlines and cancellation: a request whose caller gives up or whose deadline passes sends a
  ``LinkCancel``, and the broker drops what it holds for it (and answers the id empty, so the
  proxy knows it is over). A broker may have answered just before the cancel reached it (a
  held pop woken as its caller's deadline passed): such a late answer goes to the request's
  ``late`` handler, if it has one (the remote port hands a late pop's messages back), instead
  of being dropped with the messages in it invisible for their whole invisible time.
- Loss: when a stream ends (broker restart, network, ``break_stream``) every request in flight
  on it fails with ``BrokerUnavailableError``, exactly as a unary call would, so the proxy's
  failover sees a broker that is down. No request is retried blindly (an ack or send may have
  been applied) and none is left waiting. The next request opens a new stream. Once the link
  is closed (its port closing), a request still made on it (or waiting for a slot of the
  window) fails the same way at once, rather than waiting out its deadline for an answer that
  no reader is left to take.

Task ownership: ``run()`` owns every stream's task in one task group; the port starts it once
and cancels it on close.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import grpc
from google.protobuf.message import Message as ProtoMessage
from opentelemetry import propagate, trace
from popmq.broker.contract.errors import (
    BrokerAuthError,
    BrokerTimeoutError,
    BrokerUnavailableError,
    Code,
    RefusedError,
)

from popmq.pb.broker.v1 import broker_pb2 as pb
from popmq.tracing import tracer

# LinkRequest's call field -> the BrokerService method it stands for (span names).
METHODS = {
    "send": "Send", "pop": "Pop", "ack": "Ack", "change_invisible_time": "ChangeInvisibleTime",
    "notify": "Notify", "forward_to_dlq": "ForwardToDlq", "pull": "Pull",
}  # fmt: skip

log = logging.getLogger(__name__)

# Bytes one write of a Call stream carries at most (unless one item alone is larger): well
# under the transport's message limit on both sides (256 MiB), small enough that a burst of
# answers goes out in several writes rather than one huge one.
FRAME_BYTES = 4 * 1024 * 1024
# Room for the link's own fields (id, trace context, the frame) around one request.
LINK_HEADROOM_BYTES = 64 * 1024
# Late handlers kept per stream at most (the oldest go first). A broker answers every cancelled
# id, which frees its handler; one from before that answer would leave one per cancel for ever.
# Above the 10,000 long polls a proxy holds by default, so a burst of them given up at once
# (clients gone together) keeps every handler: a few MB at most.
LATE_MAX = 16 * 1024

Late = Callable[[pb.LinkResponse], None]  # what a given-up request's answer is handed to


CALL_METHOD = "/popmq.broker.v1.BrokerService/Call"


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field_head(number: int, length: int) -> bytes:
    """The key and length of a length-delimited protobuf field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(length)


class Encoded:
    """One LinkRequest or LinkResponse, encoded once, in pieces joined only into the frame that
    carries it. ``held``: bytes of a memory budget to give back once it is written."""

    __slots__ = ("held", "parts", "size")

    def __init__(self, parts: list[bytes], held: int = 0) -> None:
        self.parts = parts
        self.size = sum(len(part) for part in parts)
        self.held = held


def encode(envelope: ProtoMessage, kind: str, payload: bytes, held: int = 0) -> Encoded:
    """``envelope`` (a LinkRequest or LinkResponse with its id, and trace context) with its
    ``kind`` field set to the encoded ``payload``: protobuf reads concatenated encodings of a
    message as one, so the payload is never copied into an envelope message first."""
    number = envelope.DESCRIPTOR.fields_by_name[kind].number
    head = envelope.SerializeToString() + _field_head(number, len(payload))
    return Encoded([head, payload], held)


def encoded(message: ProtoMessage) -> Encoded:
    return Encoded([message.SerializeToString()])


def frame(items: list[Encoded]) -> bytes:
    """The bytes of a LinkRequests or LinkResponses message holding ``items`` (field 1)."""
    parts: list[bytes] = []
    for item in items:
        parts.append(_field_head(1, item.size))
        parts.extend(item.parts)
    return b"".join(parts)


def _call_late(late: Late, answer: pb.LinkResponse) -> None:
    """A late handler's failure is logged: it must not end the stream that read the answer."""
    try:
        late(answer)
    except Exception:
        log.exception("the late answer to request %d was not handled", answer.id)


class LinkUnsupportedError(BrokerUnavailableError):
    """The broker has no Call method (an older broker): nothing was sent; use unary calls."""


class LinkHealth:
    """Whether a broker's request link works, shared by its streams: while the broker is down
    every request opens a stream that fails, so the log says so once when it goes down and once
    when it is back, and the failed requests are counted (``failures``), not logged one by one."""

    def __init__(self, broker: str) -> None:
        self._broker = broker
        self.down = False
        self.failures = 0  # requests failed by a lost stream, over the link's life

    def lost(self, reason: str, requests: int) -> None:
        self.failures += requests
        if self.down:
            log.debug("request link to broker %s still down (%s)", self._broker, reason)
            return
        self.down = True
        log.warning(
            "request link to broker %s is down (%s): requests fail as unavailable until it is "
            "back (counted in popmq_proxy_broker_request_link_failures)", self._broker, reason,
        )  # fmt: skip

    def answered(self) -> None:
        if self.down:
            self.down = False
            log.info("request link to broker %s is back", self._broker)


class LinkStream:
    """One Call stream: requests out through a queue, answers matched to waiters by id."""

    def __init__(
        self,
        broker: str,
        open_call: Callable[[Any], Any],
        window: int,
        health: LinkHealth | None = None,
    ) -> None:
        self._broker = broker
        self.health = health if health is not None else LinkHealth(broker)
        self._open_call = open_call
        self.window = asyncio.Semaphore(max(1, window))
        self.pending: dict[int, asyncio.Future[pb.LinkResponse]] = {}
        # Given-up requests whose answer may still come, and answers that came for a caller
        # cancelled a moment before (its request's finally takes them).
        self.late: dict[int, Late] = {}
        self.unclaimed: dict[int, pb.LinkResponse] = {}
        self.late_dropped = 0  # late handlers dropped past the limit (their answers lost)
        self._outbox: asyncio.Queue[Encoded | None] | None = None
        self._wanted = asyncio.Event()
        self._call: Any = None
        self._closing = False
        self.connects = 0  # streams opened so far
        self.losses = 0  # streams that ended under the link

    def put(self, request: Encoded) -> None:
        """Queue a request for the current stream (opening one if there is none)."""
        if self._outbox is None:
            self._outbox = asyncio.Queue()
            self._wanted.set()
        self._outbox.put_nowait(request)

    def cancel(self, request_id: int, late: Late | None = None) -> None:
        """Tell the broker to drop the request; ``late`` gets its answer if one comes anyway
        (the broker had answered before the cancel reached it)."""
        if self._outbox is not None:
            self._outbox.put_nowait(encoded(pb.LinkRequest(id=request_id, cancel=pb.LinkCancel())))
            if late is not None:
                self.late[request_id] = late
                if len(self.late) > LATE_MAX:
                    del self.late[next(iter(self.late))]
                    self.late_dropped += 1
                    if self.late_dropped == 1:
                        log.warning(
                            "request link to broker %s: more than %d requests given up at "
                            "once; an answer still on its way to the oldest is dropped (its "
                            "messages come back after their invisible time)",
                            self._broker, LATE_MAX,
                        )  # fmt: skip

    def break_stream(self) -> None:
        """Cut the current stream as a network failure would (tests and chaos drills)."""
        if self._call is not None:
            self._call.cancel()

    async def run(self) -> None:
        """Open a stream whenever requests wait for one; read its answers until it ends."""
        while True:
            await self._wanted.wait()
            outbox = self._outbox
            assert outbox is not None
            reason = "ended by the broker"
            code: grpc.StatusCode | None = None
            try:
                self._call = call = self._open_call(_drain(outbox))
                self.connects += 1
                async for answers in call:
                    self.health.answered()
                    for answer in answers.responses:
                        waiter = self.pending.pop(answer.id, None)
                        if waiter is not None:
                            if not waiter.done():
                                waiter.set_result(answer)
                            else:  # its caller was just cancelled: its finally takes it
                                self.unclaimed[answer.id] = answer
                        elif self.late:
                            late = self.late.pop(answer.id, None)
                            if late is not None:
                                _call_late(late, answer)
            except grpc.aio.AioRpcError as error:
                reason = f"{error.code().name}: {error.details()}"
                code = error.code()
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if self._closing or (task is not None and task.cancelling()):
                    self._lost("the proxy is closing", outbox)
                    raise
                reason = "cut"  # break_stream()
            except Exception as error:  # whatever ends a stream must not end the link
                # Anything else (a gRPC usage or internal error, a bug) must not end run():
                # the link would be dead for the port's life, its requests and coalesced
                # callers left waiting. It ends this stream like a transport failure.
                reason = f"{type(error).__name__}: {error}"
                log.warning("request link to broker %s failed: %s", self._broker, reason)
            self._lost(reason, outbox, code)

    def _lost(
        self,
        reason: str,
        outbox: asyncio.Queue[Encoded | None],
        code: grpc.StatusCode | None = None,
    ) -> None:
        if self._outbox is outbox:
            self._outbox = None
            self._wanted.clear()
        outbox.put_nowait(None)  # ends the request iterator of the dead call
        self._call = None
        if self.pending:
            self.losses += 1
            self.health.lost(reason, len(self.pending))
        error: Exception
        if code == grpc.StatusCode.UNAUTHENTICATED:  # a deployment fault: say which
            error = BrokerAuthError(self._broker, reason)
        elif code == grpc.StatusCode.UNIMPLEMENTED:
            error = LinkUnsupportedError(self._broker, f"request link refused: {reason}")
        else:
            error = BrokerUnavailableError(self._broker, f"request link lost: {reason}")
        self.late.clear()  # nothing more comes on this stream
        pending, self.pending = self.pending, {}
        for waiter in pending.values():
            if not waiter.done():
                waiter.set_exception(error)

    def close(self) -> None:
        self._closing = True

    @property
    def closed(self) -> bool:
        return self._closing


class RequestLink:
    """``streams`` Call streams to one broker; requests spread over them round robin."""

    def __init__(
        self,
        broker: str,
        open_call: Callable[[Any], Any],
        *,
        streams: int,
        window: int,
        max_request_bytes: int = 256 * 1024 * 1024,
    ) -> None:
        self._broker = broker
        # The transport's message limit: a request past it would end the stream it rides on.
        self._max_request_bytes = max_request_bytes
        self.health = LinkHealth(broker)
        self.streams = [
            LinkStream(broker, open_call, window, self.health) for _ in range(max(1, streams))
        ]
        self._turn = itertools.count()
        self._ids = itertools.count(1)

    async def run(self) -> None:
        async with anyio.create_task_group() as group:
            for stream in self.streams:
                group.start_soon(stream.run, name=f"link-stream:{self._broker}")

    def close(self) -> None:
        for stream in self.streams:
            stream.close()

    def break_streams(self) -> None:
        for stream in self.streams:
            stream.break_stream()

    @property
    def in_flight(self) -> int:
        return sum(len(s.pending) for s in self.streams)

    async def request(
        self,
        kind: str,
        message: Any,
        deadline_s: float,
        *,
        held: bool = False,
        late: Late | None = None,
    ) -> Any:
        """Send one call and return the broker's response message for it (the ``kind`` field
        of the LinkResponse). Raises BrokerUnavailableError when the stream is lost, and
        BrokerTimeoutError when the deadline passes. ``held``: a long poll (takes no slot of
        the window). ``late``: called with the LinkResponse if the caller gave up (cancelled,
        deadline) and the broker answered anyway; with one without a result when the broker
        confirms the cancel (nothing was done)."""
        if not trace.get_current_span().get_span_context().is_valid:  # not tracing: no cost
            return await self._request(kind, message, deadline_s, None, held, late)
        method = f"/popmq.broker.v1.BrokerService/{METHODS.get(kind, kind)}"
        with tracer().start_as_current_span(method, kind=trace.SpanKind.CLIENT):
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            return await self._request(kind, message, deadline_s, carrier, held, late)

    async def _request(
        self,
        kind: str,
        message: Any,
        deadline_s: float,
        carrier: dict[str, str] | None,
        held: bool,
        late: Late | None = None,
    ) -> Any:
        payload = message.SerializeToString()  # the one encoding of this request
        size = len(payload)
        # Alone, not with the stream's other requests (room kept for the link's own fields).
        if size > self._max_request_bytes - LINK_HEADROOM_BYTES:
            raise RefusedError(
                Code.PAYLOAD_TOO_LARGE,
                f"{kind} request to broker {self._broker} is {size} bytes, more than the "
                f"link's message limit of {self._max_request_bytes}",
            )
        stream = self.streams[next(self._turn) % len(self.streams)]
        request_id = next(self._ids)
        waiter: asyncio.Future[pb.LinkResponse] | None = None
        taken = False
        try:
            async with asyncio.timeout(deadline_s):
                async with contextlib.nullcontext() if held else stream.window:
                    if stream.closed:  # its reader is gone: nothing would answer it
                        raise BrokerUnavailableError(self._broker, "request link closed")
                    waiter = asyncio.get_running_loop().create_future()
                    stream.pending[request_id] = waiter
                    envelope = pb.LinkRequest(id=request_id)
                    if carrier:
                        envelope.trace_context.update(carrier)
                    stream.put(encode(envelope, kind, payload))
                    del payload  # queued; the frame holds it from here
                    answer = await waiter
                    taken = True
        except TimeoutError:
            raise BrokerTimeoutError(
                self._broker, f"no answer to {kind} within {deadline_s:.1f} s"
            ) from None
        finally:
            if stream.pending.pop(request_id, None) is not None:
                # Gave up (deadline, caller gone): free the broker; an answer already on its
                # way goes to ``late``.
                stream.cancel(request_id, late)
            elif not taken:
                # Answered, but the caller gave up before reading it: cancelled first
                # (``unclaimed``), or the answer was set and the cancel came in the same turn
                # (in the waiter). Not lost either way.
                unread = stream.unclaimed.pop(request_id, None) if stream.unclaimed else None
                if unread is None and waiter is not None and _has_result(waiter):
                    unread = waiter.result()
                if unread is not None and late is not None:
                    _call_late(late, unread)
        if answer.WhichOneof("result") != kind:
            raise RefusedError(
                Code.INTERNAL_ERROR,
                f"broker {self._broker} answered {answer.WhichOneof('result')} to {kind}",
            )
        return getattr(answer, kind)


def _has_result(waiter: asyncio.Future[pb.LinkResponse]) -> bool:
    return waiter.done() and not waiter.cancelled() and waiter.exception() is None


async def _drain(outbox: asyncio.Queue[Encoded | None]) -> AsyncIterator[bytes]:
    """The stream's messages (LinkRequests, encoded): the requests queued when gRPC asks, a
    frame per write."""
    async for batch in frames(outbox):
        yield frame(batch)


async def frames(queue: asyncio.Queue[Encoded | None]) -> AsyncIterator[list[Encoded]]:
    """What is queued when the writer asks, in lists of at most FRAME_BYTES (an item larger
    than that goes alone), until a None. Both ends of the Call stream write this way."""
    carried: Encoded | None = None  # the item that did not fit the previous frame
    while True:
        item = carried if carried is not None else await queue.get()
        carried = None
        if item is None:
            return
        batch, size = [item], item.size
        while not queue.empty():
            item = queue.get_nowait()
            if item is None:
                yield batch
                return
            item_size = item.size
            if size + item_size > FRAME_BYTES:
                carried = item
                break
            batch.append(item)
            size += item_size
        yield batch
