"""Client lifecycle: the Settings a client should use, heartbeats, termination.

The answer to a client's Settings is RocketMQ's: the client's own settings with the server's
publishing limits or subscription parameters and retry policy filled in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import GroupConfig
from popmq.proxy.cluster import BrokerCluster
from popmq.proxy.core import validate
from popmq.proxy.core.context import RequestContext
from popmq.proxy.core.receive import filter_of
from popmq.proxy.registry import ClientRegistry

from popmq.config import DEFAULT_RETRY_LEVELS, ProxyConfig, parse_duration_ms

# RocketMQ's producer retry policy (grpcClientProducerBackoff*): 10 ms doubling to 1 s, 3 tries.
PRODUCER_MAX_ATTEMPTS = 3
PRODUCER_BACKOFF_INITIAL_MS = 10
PRODUCER_BACKOFF_MAX_MS = 1_000
PRODUCER_BACKOFF_MULTIPLIER = 2.0
# RocketMQ's ClientType names.
PRODUCER = "PRODUCER"
SIMPLE_CONSUMER = "SIMPLE_CONSUMER"
CONSUMER_TYPES = frozenset(
    {"PUSH_CONSUMER", SIMPLE_CONSUMER, "PULL_CONSUMER", "LITE_PUSH_CONSUMER",
     "LITE_SIMPLE_CONSUMER"}
)  # fmt: skip


@dataclass(slots=True)
class ClientSettings:
    """What a client says of itself in its Telemetry settings."""

    client_type: str  # a ClientType name ("UNKNOWN(n)" for one we do not know)
    # Which settings it sent: "publishing", "subscription", or None.
    role: str | None
    published: set[str] = field(default_factory=set)  # topics in its publishing settings
    subscribed: set[str] = field(default_factory=set)  # topics in its subscription settings
    group: str = ""  # a subscriber's group, as sent
    has_poll_time: bool = False  # a subscriber set its own long polling timeout
    # A subscriber's filters: (FilterType name, expression) per subscribed topic.
    filters: list[tuple[str, str]] = field(default_factory=list)
    language: str = ""
    version: str = ""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int
    # Exponential (initial, max, multiplier) for producers; a list of delays for consumers.
    backoff: tuple[int, int, float] | None = None
    delays_ms: list[int] = field(default_factory=list)


@dataclass(slots=True)
class SettingsAnswer:
    """What the server fills into the client's settings (the rest is the client's own)."""

    retry: RetryPolicy
    publishing: bool = False  # a publisher's answer (else a subscriber's)
    max_body_bytes: int = 0
    fifo: bool = False  # subscribers, from here on
    batch_size: int = 0
    long_polling_ms: int | None = None  # None: the client keeps its own


def producer_retry() -> RetryPolicy:
    backoff = (PRODUCER_BACKOFF_INITIAL_MS, PRODUCER_BACKOFF_MAX_MS, PRODUCER_BACKOFF_MULTIPLIER)
    return RetryPolicy(PRODUCER_MAX_ATTEMPTS, backoff=backoff)


def consumer_retry(group: GroupConfig) -> RetryPolicy:
    """The group's redelivery delays (RocketMQ's levels unless the group has its own)."""
    levels = group.retry_levels or DEFAULT_RETRY_LEVELS
    return RetryPolicy(group.max_attempts, delays_ms=[parse_duration_ms(lv) for lv in levels])


def require_client_id(ctx: RequestContext) -> str:
    if not ctx.client_id:
        raise RefusedError(Code.CLIENT_ID_REQUIRED, "the x-mq-client-id header is required")
    return ctx.client_id


class Clients:
    def __init__(
        self, config: ProxyConfig, cluster: BrokerCluster, registry: ClientRegistry
    ) -> None:
        self.config = config
        self.cluster = cluster
        self.registry = registry

    async def settings(self, settings: ClientSettings, ctx: RequestContext) -> SettingsAnswer:
        """Record the client and say what it should use."""
        client_id = require_client_id(ctx)
        kind = settings.client_type
        group = ""
        if settings.role == "publishing" or kind == PRODUCER:
            topics = settings.published
            answer = SettingsAnswer(
                producer_retry(), publishing=True, max_body_bytes=self.config.max_body_bytes
            )
        elif settings.role == "subscription" or kind in CONSUMER_TYPES:
            topics = settings.subscribed
            group = validate.group_name(settings.group)
            for kind_name, expression in settings.filters:  # a malformed one is refused now
                filter_of(kind_name, expression)
            config = await self.cluster.group(group)
            answer = SettingsAnswer(
                consumer_retry(config), fifo=config.fifo, batch_size=self.config.max_batch
            )
            # Push consumers adopt this as their poll time; simple consumers keep awaitDuration.
            if kind != SIMPLE_CONSUMER or not settings.has_poll_time:
                answer.long_polling_ms = self.config.max_long_polling_ms
        else:
            raise RefusedError(Code.UNRECOGNIZED_CLIENT_TYPE, "settings carry neither pub nor sub")
        self.registry.touch(
            client_id,
            client_type=kind,
            group=group or None,
            topics=validate.client_topics(topics),
            language=ctx.language or settings.language,
            version=ctx.client_version or settings.version,
            peer=ctx.peer,
            access_key=ctx.access_key,
        )
        return answer

    def telemetry(self, ctx: RequestContext, open_: bool) -> None:
        """The client's Telemetry stream opened (after its first settings) or closed."""
        self.registry.set_telemetry(ctx.client_id, open_, ctx.access_key)

    def heartbeat(self, client_type: str | None, group: str, ctx: RequestContext) -> None:
        """``client_type`` None: the client did not say; ``group`` "": none given."""
        client_id = require_client_id(ctx)
        if group:
            group = validate.group_name(group)
        elif client_type in CONSUMER_TYPES:
            raise RefusedError(Code.ILLEGAL_CONSUMER_GROUP, "a consumer heartbeat needs its group")
        self.registry.touch(
            client_id,
            client_type=client_type,
            group=group or None,
            language=ctx.language,
            version=ctx.client_version,
            peer=ctx.peer,
            access_key=ctx.access_key,
        )

    def terminate(self, ctx: RequestContext) -> None:
        self.registry.remove(require_client_id(ctx), ctx.access_key)
