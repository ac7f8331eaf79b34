"""ReceiveMessage: validate, clamp the poll time, long-poll through the strategy.

The servicer streams the result (status, messages, delivery timestamp) and hands back what it
could not write, which is made visible again soon (RocketMQ nacks it for 1 s).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.port import BrokerPort
from popmq.broker.contract.types import FilterExpression, PoppedMessage, PopRequest
from popmq.proxy.admission import refuse
from popmq.proxy.core import validate
from popmq.proxy.core.context import RequestContext
from popmq.proxy.core.times import invisible_duration_ms, polling_duration_ms
from popmq.proxy.longpoll.base import LongPollRequest
from popmq.proxy.services import ProxyServices

from popmq.config import ProxyConfig
from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s

log = logging.getLogger(__name__)

# RocketMQ's client request timeout; without a polling time the poll leaves half of it free.
DEFAULT_REQUEST_TIMEOUT_MS = 3_000


def polling_time_ms(
    requested_ms: int | None, remaining_ms: int | None, config: ProxyConfig, load_ms: int = 0
) -> int:
    """How long a receive may hold.

    - absent: the call's remaining time minus half a request timeout (RocketMQ), clamped;
    - 0: the minimum; positive below the minimum: ILLEGAL_POLLING_TIME; above the max: max;
    - never past the client's deadline minus the reserve; if that leaves less than the
      minimum, ILLEGAL_POLLING_TIME (RocketMQ: "deadline time remaining is not enough");
    - ``load_ms`` more reserve under load (never below the minimum): polls that end together
      are answered one after another, and a lagging loop answers late, so under a flood the
      last answers need that much more room before their deadlines (see load_reserve_ms).
    """
    low, high = config.min_long_polling_ms, config.max_long_polling_ms
    if requested_ms is None:
        if remaining_ms is None:
            poll = high
        else:
            poll = remaining_ms - DEFAULT_REQUEST_TIMEOUT_MS // 2
    elif requested_ms < 0:
        raise RefusedError(Code.ILLEGAL_POLLING_TIME, "long polling timeout is negative")
    elif 0 < requested_ms < low:
        raise RefusedError(
            Code.ILLEGAL_POLLING_TIME,
            f"long polling timeout {requested_ms} ms is below the minimum {low} ms",
        )
    else:
        poll = requested_ms
    poll = min(max(poll, low), high)
    if remaining_ms is not None:
        budget = remaining_ms - config.long_polling_reserve_ms
        if poll > budget:
            if budget < low:
                raise RefusedError(
                    Code.ILLEGAL_POLLING_TIME,
                    f"the call's deadline leaves {max(remaining_ms, 0)} ms, not enough for a "
                    f"long poll of at least {low} ms",
                )
            poll = budget
        poll = min(poll, max(budget - load_ms, low))
    return poll


def load_reserve_ms(services: ProxyServices) -> int:
    """Reserve for load: per receive held now, plus the event loop's current lag."""
    admission = services.admission
    per_held = services.proxy.long_polling_reserve_per_held_ms
    return int(admission.active * per_held + admission.lag_ms)


def filter_of(expression: pb.FilterExpression) -> FilterExpression:
    if expression.type == pb.SQL:
        raise RefusedError(Code.UNSUPPORTED, "SQL92 filter expressions are not supported")
    text = expression.expression.strip() or "*"
    if text != "*" and not FilterExpression(text).tags():
        raise RefusedError(Code.ILLEGAL_FILTER_EXPRESSION, f"bad tag expression {text!r}")
    return FilterExpression(text)


@dataclass(slots=True)
class ReceivePlan:
    group: str
    topic: str
    brokers: list[BrokerPort]
    long_poll: LongPollRequest
    auto_renew: bool = False  # a PushConsumer's receive: this proxy renews the handles
    client_id: str = ""
    access_key: str = ""  # with client_id, the registry entry whose life renewal follows


async def plan_receive(
    services: ProxyServices, request: s.ReceiveMessageRequest, ctx: RequestContext
) -> ReceivePlan:
    config = services.proxy
    group = validate.group_name(request.group.name)
    topic = validate.topic_name(request.message_queue.topic.name, allow_dlq=True)
    if request.batch_size <= 0 or request.batch_size > config.max_batch:
        raise refuse(
            services.metrics, "batch_size", Code.BAD_REQUEST,
            f"batch size must be in 1..{config.max_batch} (proxy.max_batch), "
            f"not {request.batch_size}",
        )  # fmt: skip
    auto_renew = request.auto_renew and config.auto_renew and _is_push_consumer(services, ctx)
    if auto_renew:
        invisible_ms = config.renew_slice_ms  # then renewed slice by slice (proxy/renewal.py)
    elif request.auto_renew:
        invisible_ms = config.default_invisible_ms
    else:
        invisible_ms = (
            invisible_duration_ms(request.invisible_duration)
            if request.HasField("invisible_duration")
            else 0
        )
        validate.invisible_time(invisible_ms, config.min_invisible_ms, config.max_invisible_ms)
    requested = (
        polling_duration_ms(request.long_polling_timeout)
        if request.HasField("long_polling_timeout")
        else None
    )
    poll_ms = polling_time_ms(requested, ctx.remaining_ms(), config, load_reserve_ms(services))
    expression = filter_of(request.filter_expression)
    route = await services.cluster.route(topic, create=ctx.create_topic(topic))
    group_config = await services.cluster.group(group)
    preferred = request.message_queue.broker.name or None
    if preferred not in route.brokers:
        preferred = None
    pop = PopRequest(
        group=group,
        topic=topic,
        queue_id=-1,
        max_messages=request.batch_size,
        invisible_time_ms=invisible_ms,
        poll_time_ms=0,
        filter=expression,
        fifo=group_config.fifo,
    )
    return ReceivePlan(
        group=group,
        topic=topic,
        brokers=services.cluster.live_ports(list(route.brokers)),
        long_poll=LongPollRequest(pop=pop, poll_ms=poll_ms, preferred_broker=preferred),
        auto_renew=auto_renew,
        client_id=ctx.client_id,
        access_key=ctx.access_key,
    )


def _is_push_consumer(services: ProxyServices, ctx: RequestContext) -> bool:
    """Renewal needs a client this proxy hears from (telemetry/heartbeat), so it can stop when
    the client goes; one known as another kind of client does not get it."""
    # The caller's own entry: another user's client under the same id earns no renewal.
    info = services.registry.get(ctx.client_id, ctx.access_key) if ctx.client_id else None
    return info is not None and info.client_type in ("", "PUSH_CONSUMER")


async def receive(services: ProxyServices, plan: ReceivePlan) -> list[PoppedMessage]:
    popped = await services.strategy.receive(plan.brokers, plan.long_poll)
    if plan.auto_renew and popped:
        services.renewer.track(
            plan.client_id, plan.group, plan.topic, popped, access_key=plan.access_key
        )
    return popped


def release_unsent(services: ProxyServices, plan: ReceivePlan, unsent: list[PoppedMessage]) -> None:
    """Messages popped for a client that vanished: make them visible again at once, in the
    background (the request that popped them is gone), on the long polls' one release path
    (BrokerCalls.release). If this fails they still come back when their invisible time ends."""
    if not unsent:
        return
    services.renewer.forget(m.receipt_handle for m in unsent)
    by_port: dict[BrokerPort, list[PoppedMessage]] = {}
    for message in unsent:
        try:
            port = services.cluster.port_for_handle(message.receipt_handle)
        except RefusedError as exc:  # best effort: the invisible time is the safety net
            log.info("could not release an undelivered message: %s", exc)
            services.metrics.released_messages.labels("kept").inc()
            continue
        by_port.setdefault(port, []).append(message)
    calls = services.strategy.calls
    for port, messages in by_port.items():
        calls.release(port, plan.long_poll.pop, messages)
