"""Telemetry settings, Heartbeat and NotifyClientTermination on the wire."""

from __future__ import annotations

import ipaddress

from popmq.proxy.core.clients import ClientSettings, RetryPolicy, SettingsAnswer
from popmq.proxy.core.context import RequestContext
from popmq.proxy.core.processor import ProxyCore
from popmq.proxy.core.transactions import OrphanCheck
from popmq.proxy.grpc import status as st
from popmq.proxy.grpc.convert import duration, stored_into
from popmq.proxy.grpc.receive import filter_kind

from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s


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


def retry_pb(policy: RetryPolicy) -> pb.RetryPolicy:
    if policy.backoff is not None:
        initial_ms, max_ms, multiplier = policy.backoff
        return pb.RetryPolicy(
            max_attempts=policy.max_attempts,
            exponential_backoff=pb.ExponentialBackoff(
                initial=duration(initial_ms), max=duration(max_ms), multiplier=multiplier
            ),
        )
    return pb.RetryPolicy(
        max_attempts=policy.max_attempts,
        customized_backoff=pb.CustomizedBackoff(next=[duration(ms) for ms in policy.delays_ms]),
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


def client_settings(settings: pb.Settings) -> ClientSettings:
    return ClientSettings(
        client_type=client_type_name(settings.client_type),
        role=settings.WhichOneof("pub_sub"),
        published={t.name for t in settings.publishing.topics},
        subscribed={entry.topic.name for entry in settings.subscription.subscriptions},
        group=settings.subscription.group.name,
        has_poll_time=settings.subscription.HasField("long_polling_timeout"),
        filters=[
            (filter_kind(entry.expression.type), entry.expression.expression)
            for entry in settings.subscription.subscriptions
        ],
        language=language_name(settings.user_agent.language),
        version=settings.user_agent.version,
    )


def settings_pb(
    settings: pb.Settings, answer: SettingsAnswer, metrics_endpoint: str
) -> pb.Settings:
    """The client's own settings with the server's answer filled in."""
    reply = pb.Settings()
    reply.CopyFrom(settings)
    reply.metric.CopyFrom(client_metric(metrics_endpoint))
    if answer.publishing:
        reply.publishing.max_body_size = answer.max_body_bytes
        reply.publishing.validate_message_type = True
    else:
        reply.subscription.fifo = answer.fifo
        reply.subscription.receive_batch_size = answer.batch_size
        if answer.long_polling_ms is not None:
            reply.subscription.long_polling_timeout.CopyFrom(duration(answer.long_polling_ms))
    reply.backoff_policy.CopyFrom(retry_pb(answer.retry))
    return reply


def published_topics(settings: pb.Settings) -> set[str] | None:
    """A producer's declared topics (where its transaction check-backs may go); None for
    a consumer's settings."""
    if settings.WhichOneof("pub_sub") != "publishing":
        return None
    return {t.name for t in settings.publishing.topics}


def orphan_check_pb(check: OrphanCheck) -> s.TelemetryCommand:
    """A transaction check-back as the producer's Telemetry stream carries it."""
    command = s.TelemetryCommand()
    recover = command.recover_orphaned_transaction_command
    stored_into(recover.message, check.message)
    recover.transaction_id = check.transaction_id
    return command


async def answer_settings(
    core: ProxyCore, settings: pb.Settings, ctx: RequestContext
) -> pb.Settings:
    """Record the client and build the Settings it should use."""
    answer = await core.clients.settings(client_settings(settings), ctx)
    return settings_pb(settings, answer, core.clients.config.client_metrics_endpoint)


async def heartbeat(
    core: ProxyCore, request: s.HeartbeatRequest, ctx: RequestContext
) -> s.HeartbeatResponse:
    group = request.group.name if request.HasField("group") else ""
    client_type = client_type_name(request.client_type) if request.client_type else None
    core.clients.heartbeat(client_type, group, ctx)
    return s.HeartbeatResponse(status=st.ok())


async def notify_termination(
    core: ProxyCore, request: s.NotifyClientTerminationRequest, ctx: RequestContext
) -> s.NotifyClientTerminationResponse:
    core.clients.terminate(ctx)
    return s.NotifyClientTerminationResponse(status=st.ok())
