"""SendMessage: validate each message, pick its queue, store it, one entry per message.

A request's messages go to one queue per message group (FIFO) or one round-robin queue for the
rest, as RocketMQ sends a batch to one queue.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections import defaultdict

from popmq.broker.contract.errors import BrokerUnavailableError, Code, RefusedError
from popmq.broker.contract.types import PROP_TRACE_CONTEXT, Message, SendResult
from popmq.proxy.admission import refuse
from popmq.proxy.cluster import QueueRef, TopicRoute
from popmq.proxy.core import validate
from popmq.proxy.core.context import RequestContext
from popmq.proxy.core.times import timestamp_ms
from popmq.proxy.grpc import status as st
from popmq.proxy.grpc.convert import message_from_pb
from popmq.proxy.services import ProxyServices

from popmq.lifecycle import fan_out
from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s
from popmq.tracing import link_to, tracer

# Spreads batches moved off a broker that is down over the live ones.
_spread = itertools.count()


def _checked(services: ProxyServices, msg: pb.Message, ctx: RequestContext) -> Message:
    props = msg.system_properties
    topic = validate.topic_name(msg.topic.name)
    limit = services.proxy.max_body_bytes
    if len(msg.body) > limit:
        raise refuse(
            services.metrics, "body_size", Code.MESSAGE_BODY_TOO_LARGE,
            f"message body is {len(msg.body)} bytes, more than the limit of {limit} "
            "(proxy.max_body_bytes)",
        )  # fmt: skip
    validate.body(msg.body, limit)
    if props.body_encoding == pb.GZIP:
        raise RefusedError(Code.UNSUPPORTED, "gzip-encoded message bodies are not supported")
    if props.message_type == pb.TRANSACTION:
        raise RefusedError(Code.UNSUPPORTED, "transactional messages are not supported")
    if props.HasField("lite_topic") or props.message_type in (pb.LITE, pb.PRIORITY):
        raise RefusedError(Code.UNSUPPORTED, "lite and priority messages are not supported")
    validate.tag(props.tag)
    if props.keys:
        validate.keys(list(props.keys))
    validate.message_group(props.message_group)
    if msg.user_properties:
        validate.properties(dict(msg.user_properties))
    if props.HasField("message_group") and props.HasField("delivery_timestamp"):
        raise RefusedError(
            Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
            "a message cannot have both a message group (FIFO) and a delivery time (delay)",
        )
    if props.message_type == pb.FIFO and not props.message_group:
        raise RefusedError(
            Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a FIFO message needs a message group"
        )
    if props.HasField("delivery_timestamp"):
        due_ms = timestamp_ms(props.delivery_timestamp, Code.ILLEGAL_DELIVERY_TIME, "delivery time")
        delay = due_ms - int(time.time() * 1000)
        if delay > validate.MAX_DELAY_MS:
            raise RefusedError(
                Code.ILLEGAL_DELIVERY_TIME,
                f"delivery time is more than {validate.MAX_DELAY_MS // 3_600_000} h ahead",
            )
    message = message_from_pb(msg, topic, ctx.peer)
    if not message.message_id:
        message.message_id = uuid.uuid4().hex.upper()
    return message


async def send_message(
    services: ProxyServices, request: s.SendMessageRequest, ctx: RequestContext
) -> s.SendMessageResponse:
    if not request.messages:
        raise RefusedError(Code.BAD_REQUEST, "SendMessage needs at least one message")
    if len(request.messages) > services.proxy.max_send_messages:
        raise refuse(
            services.metrics, "send_messages", Code.PAYLOAD_TOO_LARGE,
            f"{len(request.messages)} messages in one send; the limit is "
            f"{services.proxy.max_send_messages} (proxy.max_send_messages)",
        )  # fmt: skip
    messages = [_checked(services, msg, ctx) for msg in request.messages]
    with tracer().start_as_current_span("popmq.send") as span:
        if span.is_recording():  # link each message to its producer's span
            span.set_attribute("messaging.batch.message_count", len(messages))
            for message in messages:
                link = link_to(message.properties.get(PROP_TRACE_CONTEXT, ""))
                if link is not None:
                    span.add_link(link.context)
        return await _send(services, messages)


async def _send(services: ProxyServices, messages: list[Message]) -> s.SendMessageResponse:
    cluster = services.cluster

    # Batch by target queue: each FIFO message group has its queue, the rest share one.
    batches: dict[QueueRef, list[int]] = defaultdict(list)
    shared: dict[str, QueueRef] = {}
    routes: dict[str, TopicRoute] = {}  # a request's messages nearly always share one topic
    for index, message in enumerate(messages):
        route = routes.get(message.topic)
        if route is None:
            route = routes[message.topic] = await cluster.route(message.topic)
        if message.message_group:
            target = cluster.pick_queue(route, message.message_group)
        else:
            target = shared.get(message.topic) or cluster.pick_queue(route)
            shared[message.topic] = target
        batches[target].append(index)

    async def store(target: QueueRef, indexes: list[int]) -> list[SendResult]:
        batch = [messages[i] for i in indexes]
        tried: set[str] = set()
        while True:
            try:
                return await cluster.port(target.broker).send(batch, target.queue_id)
            except BrokerUnavailableError:
                # The broker is down: an unordered batch goes to a live one instead (a FIFO
                # group keeps its queue, so its order holds; the client retries it).
                cluster.note_unavailable(target.broker)
                tried.add(target.broker)
                if batch[0].message_group:
                    raise
                route = await cluster.route(batch[0].topic)
                others = [q for q in route.queues if q.broker not in tried]
                if not others:
                    raise
                target = others[next(_spread) % len(others)]

    targets = list(batches.items())
    outcomes: list[list[SendResult] | BaseException]
    if len(targets) == 1:  # the usual case: one batch needs no task of its own
        try:
            outcomes = [await store(*targets[0])]
        except Exception as exc:
            outcomes = [exc]
    else:
        outcomes = await fan_out(
            [store(target, indexes) for target, indexes in targets], return_exceptions=True
        )
    entries: list[s.SendResultEntry | None] = [None] * len(messages)
    ok = st.ok()
    codes = set()
    for (_, indexes), outcome in zip(targets, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            if not isinstance(outcome, Exception):
                raise outcome  # cancellation and the like
            failed = st.status_of(outcome)
            codes.add(Code(failed.code))
            for i in indexes:
                entries[i] = s.SendResultEntry(status=failed, message_id=messages[i].message_id)
            continue
        codes.add(Code.OK)
        for i, result in zip(indexes, outcome, strict=True):
            entries[i] = s.SendResultEntry(
                status=ok, message_id=result.message_id, offset=result.queue_offset
            )
    done = [entry for entry in entries if entry is not None]
    code = st.combined_code(list(codes))
    summary = done[0].status.message if code != Code.MULTIPLE_RESULTS else "see entries"
    return s.SendMessageResponse(status=st.status(code, summary), entries=done)
