"""A small in-memory apache.rocketmq.v2 server for testing popmq.client on its own.

It answers like popmq's proxy does on the wire (status codes, stream frame order) but keeps
everything in dicts: no brokers, no durability, no retry topic. The real proxy is exercised by
tests/sdk/test_client_proxy.py and the Spark tests.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from popmq.pb.rocketmq.v2 import definition_pb2 as d
from popmq.pb.rocketmq.v2 import service_pb2 as s
from popmq.pb.rocketmq.v2 import service_pb2_grpc


def _status(code: int, message: str = "") -> d.Status:
    return d.Status(code=code, message=message)


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class _Popped:
    invisible_until_ms: int
    generation: int  # bumped by every pop and change: older handles stop working
    attempts: int = 1
    acked: bool = False


@dataclass
class FakeState:
    brokers: list[str]
    queues_per_broker: int
    topics: set[str]
    port: int = 0
    messages: dict[tuple[str, str, int], list[d.Message]] = field(
        default_factory=lambda: defaultdict(list)
    )
    offsets: dict[tuple[str, str, str, int], int] = field(default_factory=dict)
    # (topic, broker, queue) -> first offset still stored: retention removed those below.
    purged: dict[tuple[str, str, int], int] = field(default_factory=dict)
    popped: dict[tuple[str, str, str, int, int], _Popped] = field(default_factory=dict)
    next_queue: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    calls: list[str] = field(default_factory=list)


class FakeMessagingService(service_pb2_grpc.MessagingServiceServicer):
    def __init__(self, state: FakeState) -> None:
        self.state = state

    def _queues(self, topic: str) -> list[tuple[str, int]]:
        return [(b, q) for b in self.state.brokers for q in range(self.state.queues_per_broker)]

    def QueryRoute(self, request, context):
        self.state.calls.append("QueryRoute")
        topic = request.topic.name
        if topic not in self.state.topics:
            return s.QueryRouteResponse(status=_status(d.TOPIC_NOT_FOUND, f"no topic {topic}"))
        endpoints = d.Endpoints(
            scheme=d.IPv4, addresses=[d.Address(host="127.0.0.1", port=self.state.port)]
        )
        queues = [
            d.MessageQueue(
                topic=d.Resource(name=topic),
                id=q,
                permission=d.READ_WRITE,
                broker=d.Broker(name=b, id=0, endpoints=endpoints),
                accept_message_types=[d.NORMAL, d.FIFO, d.DELAY],
            )
            for b, q in self._queues(topic)
        ]
        return s.QueryRouteResponse(status=_status(d.OK), message_queues=queues)

    def SendMessage(self, request, context):
        self.state.calls.append("SendMessage")
        entries = []
        with self.state.lock:
            for message in request.messages:
                topic = message.topic.name
                if topic not in self.state.topics:
                    return s.SendMessageResponse(status=_status(d.TOPIC_NOT_FOUND, topic))
                queues = self._queues(topic)
                group = message.system_properties.message_group
                if group:
                    broker, qid = queues[hash(group) % len(queues)]
                else:
                    broker, qid = queues[self.state.next_queue % len(queues)]
                    self.state.next_queue += 1
                stored = d.Message()
                stored.CopyFrom(message)
                log = self.state.messages[(topic, broker, qid)]
                system = stored.system_properties
                system.queue_id = qid
                system.queue_offset = len(log)
                system.store_host = broker
                system.store_timestamp.FromMilliseconds(_now_ms())
                log.append(stored)
                entries.append(
                    s.SendResultEntry(
                        status=_status(d.OK), message_id=system.message_id, offset=len(log) - 1
                    )
                )
        return s.SendMessageResponse(status=_status(d.OK), entries=entries)

    def PullMessage(self, request, context):
        self.state.calls.append("PullMessage")
        queue = request.message_queue
        key = (queue.topic.name, queue.broker.name, queue.id)
        log = self.state.messages.get(key, [])
        offset = request.offset
        if offset < self.state.purged.get(key, 0) or offset > len(log):
            yield s.PullMessageResponse(status=_status(d.ILLEGAL_OFFSET, f"offset {offset}"))
            return
        batch = log[offset : offset + max(request.batch_size, 1)]
        if not batch:
            yield s.PullMessageResponse(status=_status(d.MESSAGE_NOT_FOUND, "no new message"))
            yield s.PullMessageResponse(next_offset=offset)
            return
        yield s.PullMessageResponse(status=_status(d.OK))
        for message in batch:
            yield s.PullMessageResponse(message=message)
        yield s.PullMessageResponse(next_offset=offset + len(batch))

    def QueryOffset(self, request, context):
        queue = request.message_queue
        log = self.state.messages.get((queue.topic.name, queue.broker.name, queue.id), [])
        if request.query_offset_policy == d.BEGINNING:
            offset = self.state.purged.get((queue.topic.name, queue.broker.name, queue.id), 0)
        elif request.query_offset_policy == d.END:
            offset = len(log)
        else:
            wanted = request.timestamp.ToMilliseconds()
            offset = next(
                (
                    i
                    for i, m in enumerate(log)
                    if m.system_properties.store_timestamp.ToMilliseconds() >= wanted
                ),
                len(log),
            )
        return s.QueryOffsetResponse(status=_status(d.OK), offset=offset)

    def GetOffset(self, request, context):
        q = request.message_queue
        key = (request.group.name, q.topic.name, q.broker.name, q.id)
        if key not in self.state.offsets:
            return s.GetOffsetResponse(status=_status(d.OFFSET_NOT_FOUND, "never committed"))
        return s.GetOffsetResponse(status=_status(d.OK), offset=self.state.offsets[key])

    def UpdateOffset(self, request, context):
        q = request.message_queue
        key = (request.group.name, q.topic.name, q.broker.name, q.id)
        self.state.offsets[key] = request.offset
        return s.UpdateOffsetResponse(status=_status(d.OK))

    def ReceiveMessage(self, request, context):
        self.state.calls.append("ReceiveMessage")
        group, topic = request.group.name, request.message_queue.topic.name
        now = _now_ms()
        found = []
        with self.state.lock:
            for broker, qid in self._queues(topic):
                for message in self.state.messages.get((topic, broker, qid), []):
                    if len(found) >= request.batch_size:
                        break
                    offset = message.system_properties.queue_offset
                    key = (group, topic, broker, qid, offset)
                    popped = self.state.popped.get(key)
                    if popped and (popped.acked or popped.invisible_until_ms > now):
                        continue
                    generation = popped.generation + 1 if popped else 1
                    attempts = popped.attempts + 1 if popped else 1
                    until = now + request.invisible_duration.ToMilliseconds()
                    self.state.popped[key] = _Popped(until, generation, attempts)
                    out = d.Message()
                    out.CopyFrom(message)
                    out.system_properties.receipt_handle = f"{broker}|{qid}|{offset}|{generation}"
                    out.system_properties.delivery_attempt = attempts
                    found.append(out)
        if not found:
            yield s.ReceiveMessageResponse(status=_status(d.MESSAGE_NOT_FOUND, "no message"))
        else:
            yield s.ReceiveMessageResponse(status=_status(d.OK))
            for message in found:
                yield s.ReceiveMessageResponse(message=message)
        stamp = s.ReceiveMessageResponse()
        stamp.delivery_timestamp.FromMilliseconds(now)
        yield stamp

    def _popped_entry(self, group: str, topic: str, handle: str) -> _Popped | None:
        try:
            broker, qid, offset, generation = handle.split("|")
            popped = self.state.popped[(group, topic, broker, int(qid), int(offset))]
        except (ValueError, KeyError):
            return None
        return popped if popped.generation == int(generation) else None

    def AckMessage(self, request, context):
        group, topic = request.group.name, request.topic.name
        results = []
        with self.state.lock:
            for entry in request.entries:
                popped = self._popped_entry(group, topic, entry.receipt_handle)
                code = d.INVALID_RECEIPT_HANDLE if popped is None else d.OK
                if popped is not None:
                    popped.acked = True
                results.append(
                    s.AckMessageResultEntry(
                        message_id=entry.message_id,
                        receipt_handle=entry.receipt_handle,
                        status=_status(code),
                    )
                )
        overall = d.OK if all(r.status.code == d.OK for r in results) else d.MULTIPLE_RESULTS
        return s.AckMessageResponse(status=_status(overall), entries=results)

    def ChangeInvisibleDuration(self, request, context):
        group, topic = request.group.name, request.topic.name
        with self.state.lock:
            popped = self._popped_entry(group, topic, request.receipt_handle)
            if popped is None:
                return s.ChangeInvisibleDurationResponse(
                    status=_status(d.INVALID_RECEIPT_HANDLE, "stale handle"),
                    receipt_handle=request.receipt_handle,
                )
            popped.generation += 1
            popped.invisible_until_ms = _now_ms() + request.invisible_duration.ToMilliseconds()
            broker, qid, offset, _ = request.receipt_handle.split("|")
        handle = f"{broker}|{qid}|{offset}|{popped.generation}"
        return s.ChangeInvisibleDurationResponse(status=_status(d.OK), receipt_handle=handle)


class FakeProxy:
    """Starts the fake on 127.0.0.1 (a free port) in a thread pool; stop() when done."""

    def __init__(
        self, topics: set[str], brokers: list[str] | None = None, queues_per_broker: int = 2
    ) -> None:
        self.state = FakeState(brokers or ["broker-a", "broker-b"], queues_per_broker, topics)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        service_pb2_grpc.add_MessagingServiceServicer_to_server(
            FakeMessagingService(self.state), self._server
        )
        self.state.port = self._server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"127.0.0.1:{self.state.port}"

    def start(self) -> FakeProxy:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=None).wait()
