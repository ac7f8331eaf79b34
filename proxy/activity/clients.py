"""Client lifecycle: Telemetry settings, Heartbeat, NotifyClientTermination.

The answer to a client's Settings is RocketMQ's: the client's own settings with the server's
publishing limits or subscription parameters and retry policy filled in.
"""

from __future__ import annotations

import ipaddress

from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import GroupConfig
from popmq.proxy.core import validate
from popmq.proxy.core.context import RequestContext
from popmq.proxy.grpc import status as st
from popmq.proxy.grpc.convert import duration
from popmq.proxy.services import ProxyServices

from popmq.config import DEFAULT_RETRY_LEVELS, parse_duration_ms
from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s

# RocketMQ's producer retry policy (grpcClientProducerBackoff*): 10 ms doubling to 1 s, 3 tries.
PRODUCER_MAX_ATTEMPTS = 3
PRODUCER_BACKOFF_INITIAL_MS = 10
PRODUCER_BACKOFF_MAX_MS = 1_000
PRODUCER_BACKOFF_MULTIPLIER = 2.0
CONSUMER_TYPES = frozenset(
    {pb.PUSH_CONSUMER, pb.SIMPLE_CONSUMER, pb.PULL_CONSUMER, pb.LITE_PUSH_CONSUMER,
     pb.LITE_SIMPLE_CONSUMER}
)  # fmt: skip


def client_type_name(value: int) -> str:
    try:
        return pb.ClientType.Name(value)
    except ValueError:
        return f"UNKNOWN({value})"


def language_name(value: int) -> str:
    try:
        return pb.Language.Name(value)
    except ValueError:
        return f"UNKNOWN({value})"


def require_client_id(ctx: RequestContext) -> str:
    if not ctx.client_id:
        raise RefusedError(Code.CLIENT_ID_REQUIRED, "the x-mq-client-id header is required")
    return ctx.client_id


def producer_backoff() -> pb.RetryPolicy:
    return pb.RetryPolicy(
        max_attempts=PRODUCER_MAX_ATTEMPTS,
        exponential_backoff=pb.ExponentialBackoff(
            initial=duration(PRODUCER_BACKOFF_INITIAL_MS),
            max=duration(PRODUCER_BACKOFF_MAX_MS),
            multiplier=PRODUCER_BACKOFF_MULTIPLIER,
        ),
    )


def consumer_backoff(group: GroupConfig) -> pb.RetryPolicy:
    """The group's redelivery delays (RocketMQ's levels unless the group has its own)."""
    levels = group.retry_levels or DEFAULT_RETRY_LEVELS
    return pb.RetryPolicy(
        max_attempts=group.max_attempts,
        customized_backoff=pb.CustomizedBackoff(
            next=[duration(parse_duration_ms(level)) for level in levels]
        ),
    )


def client_metric(endpoint: str) -> pb.Metric:
    """Settings.metric: where the client exports its own metrics (off without an endpoint)."""
    if not endpoint:
        return pb.Metric(on=False)
    host, _, port = endpoint.rpartition(":")
    try:
        scheme = pb.IPv6 if ipaddress.ip_address(host).version == 6 else pb.IPv4
    except ValueError:
        scheme = pb.DOMAIN_NAME
    address = pb.Address(host=host, port=int(port))
    return pb.Metric(on=True, endpoints=pb.Endpoints(scheme=scheme, addresses=[address]))


async def answer_settings(
    services: ProxyServices, settings: pb.Settings, ctx: RequestContext
) -> pb.Settings:
    """Record the client and build the Settings it should use."""
    client_id = require_client_id(ctx)
    reply = pb.Settings()
    reply.CopyFrom(settings)
    reply.metric.CopyFrom(client_metric(services.proxy.client_metrics_endpoint))
    kind = settings.client_type
    topics: set[str] = set()
    group = ""
    if settings.WhichOneof("pub_sub") == "publishing" or kind == pb.PRODUCER:
        topics = {t.name for t in settings.publishing.topics}
        reply.publishing.max_body_size = services.proxy.max_body_bytes
        reply.publishing.validate_message_type = True
        reply.backoff_policy.CopyFrom(producer_backoff())
    elif settings.WhichOneof("pub_sub") == "subscription" or kind in CONSUMER_TYPES:
        subscription = settings.subscription
        group = validate.group_name(subscription.group.name)
        topics = {entry.topic.name for entry in subscription.subscriptions}
        config = await services.cluster.group(group)
        reply.subscription.fifo = config.fifo
        reply.subscription.receive_batch_size = services.proxy.max_batch
        # Push consumers adopt this as their poll time; simple consumers keep awaitDuration.
        if kind != pb.SIMPLE_CONSUMER or not subscription.HasField("long_polling_timeout"):
            reply.subscription.long_polling_timeout.CopyFrom(
                duration(services.proxy.max_long_polling_ms)
            )
        reply.backoff_policy.CopyFrom(consumer_backoff(config))
    else:
        raise RefusedError(Code.UNRECOGNIZED_CLIENT_TYPE, "settings carry neither pub nor sub")
    services.registry.touch(
        client_id,
        client_type=client_type_name(kind),
        group=group or None,
        topics=topics,
        language=ctx.language or language_name(settings.user_agent.language),
        version=ctx.client_version or settings.user_agent.version,
        peer=ctx.peer,
        access_key=ctx.access_key,
    )
    return reply


async def heartbeat(
    services: ProxyServices, request: s.HeartbeatRequest, ctx: RequestContext
) -> s.HeartbeatResponse:
    client_id = require_client_id(ctx)
    group = ""
    if request.HasField("group") and request.group.name:
        group = validate.group_name(request.group.name)
    elif request.client_type in CONSUMER_TYPES:
        raise RefusedError(Code.ILLEGAL_CONSUMER_GROUP, "a consumer heartbeat needs its group")
    services.registry.touch(
        client_id,
        client_type=client_type_name(request.client_type) if request.client_type else None,
        group=group or None,
        language=ctx.language,
        version=ctx.client_version,
        peer=ctx.peer,
        access_key=ctx.access_key,
    )
    return s.HeartbeatResponse(status=st.ok())


async def notify_termination(
    services: ProxyServices, request: s.NotifyClientTerminationRequest, ctx: RequestContext
) -> s.NotifyClientTerminationResponse:
    services.registry.remove(require_client_id(ctx), ctx.access_key)
    return s.NotifyClientTerminationResponse(status=st.ok())
