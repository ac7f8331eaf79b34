"""Receiving: check the request, clamp the poll time, long-poll through the strategy.

The edge streams the result (status, messages, delivery timestamp) and hands back what it could
not write, which is made visible again soon (RocketMQ nacks it for 1 s).

A receive takes two forms: the client's ``ReceiveRequest`` as it came, and the checked
``ReceivePlan`` (the brokers to ask and the strategy's ``LongPollRequest``, whose ``PopRequest``
carries the group, topic, batch, invisible time, filter and FIFO flag).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass

import anyio
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.port import BrokerPort
from popmq.broker.contract.types import (
    FILTER_SQL92,
    FilterExpression,
    GroupConfig,
    PoppedMessage,
    PopRequest,
)
from popmq.proxy.admission import LongPollAdmission, refuse
from popmq.proxy.cluster import BrokerCluster, TopicRoute
from popmq.proxy.core import validate
from popmq.proxy.core.context import RequestContext
from popmq.proxy.core.times import SecondsNanos, invisible_duration_ms, polling_duration_ms
from popmq.proxy.events import ProxyEvents
from popmq.proxy.longpoll.base import LongPollRequest, LongPollStrategy, is_broker_down
from popmq.proxy.longpoll.calls import BACKOFF_MAX_S, BACKOFF_START_S, remaining_ms
from popmq.proxy.registry import ClientRegistry
from popmq.proxy.renewal import HandleRenewer

from popmq.config import ProxyConfig

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


def filter_of(kind: str, expression: str) -> FilterExpression:
    """A client's filter: ``kind`` is its FilterType name (TAG, SQL, or unspecified)."""
    if kind == "SQL":
        sql = FilterExpression(expression, FILTER_SQL92)
        sql.check()  # ILLEGAL_FILTER_EXPRESSION if malformed; compiled once, cached
        return sql
    text = expression.strip() or "*"
    if text == "*":
        return MATCH_ALL  # the common case: one shared (frozen) object, not one per receive
    tags = FilterExpression(text)
    if not tags.tags():
        raise RefusedError(Code.ILLEGAL_FILTER_EXPRESSION, f"bad tag expression {text!r}")
    return tags


# Every held receive without a filter keeps one (frozen): shared, not 47 B of each.
MATCH_ALL = FilterExpression("*")
PORT_SETS_MAX = 64  # distinct broker sets whose shared tuple a Receiver keeps


@dataclass(slots=True)
class ReceiveRequest:
    """A client's receive as it came (nothing checked yet)."""

    group: str
    topic: str
    batch_size: int
    auto_renew: bool = False
    invisible_time: SecondsNanos | None = None  # None: not set
    poll_time: SecondsNanos | None = None  # None: not set
    filter_kind: str = "TAG"
    filter_expression: str = ""
    broker: str = ""  # the broker of the client's message queue, if it named one


@dataclass(frozen=True, slots=True)
class RenewFor:
    """The client (its registry entry) whose PushConsumer handles this proxy renews."""

    client_id: str
    access_key: str = ""


@dataclass(slots=True)
class ReceivePlan:
    brokers: Sequence[BrokerPort]
    long_poll: LongPollRequest
    renew_for: RenewFor | None = None  # a PushConsumer's receive: this proxy renews the handles


class Receiver:
    def __init__(
        self,
        config: ProxyConfig,
        cluster: BrokerCluster,
        strategy: LongPollStrategy,
        admission: LongPollAdmission,
        registry: ClientRegistry,
        renewer: HandleRenewer,
        metrics: ProxyEvents,
    ) -> None:
        self.config = config
        self.cluster = cluster
        self.strategy = strategy
        self.admission = admission
        self.registry = registry
        self.renewer = renewer
        self.metrics = metrics
        # The brokers a receive asks, one tuple per distinct set (by identity), shared by
        # every plan that names it: a held receive keeps it for its whole wait (a list each
        # was 88 B of each of 10,000 held polls). Bounded, and forgotten whenever the
        # cluster's ports change, so no replaced port (a former leader's) is kept here.
        self._port_sets: dict[tuple[int, ...], tuple[BrokerPort, ...]] = {}
        cluster.listen_changes(self._forget_port_sets, on=True)

    def _forget_port_sets(self) -> None:
        self._port_sets.clear()

    def _shared_ports(self, ports: Sequence[BrokerPort]) -> tuple[BrokerPort, ...]:
        # Keyed by the ports' ids: the tuple kept holds those very objects, so an id found
        # here cannot belong to another one (ports may compare equal by name).
        key = tuple(map(id, ports))
        shared = self._port_sets.get(key)
        if shared is None:
            if len(self._port_sets) >= PORT_SETS_MAX:
                self._port_sets.clear()
            shared = self._port_sets[key] = tuple(ports)
        return shared

    def admit(self, owner: str, group: str) -> None:
        """A long poll starts (a receive, or a pull that may wait): TOO_MANY_REQUESTS when the
        proxy, the client (``owner``) or the group holds too many already."""
        self.admission.enter(owner, group)

    def leave(self, owner: str, group: str) -> None:
        self.admission.leave(owner, group)

    def load_reserve_ms(self) -> int:
        """Reserve for load: per receive held now, plus the event loop's current lag."""
        admission = self.admission
        per_held = self.config.long_polling_reserve_per_held_ms
        return int(admission.active * per_held + admission.lag_ms)

    async def plan(self, request: ReceiveRequest, ctx: RequestContext) -> ReceivePlan:
        config = self.config
        group = validate.group_name(request.group)
        topic = validate.topic_name(request.topic, allow_dlq=True)
        if request.batch_size <= 0 or request.batch_size > config.max_batch:
            raise refuse(
                self.metrics, "batch_size", Code.BAD_REQUEST,
                f"batch size must be in 1..{config.max_batch} (proxy.max_batch), "
                f"not {request.batch_size}",
            )  # fmt: skip
        auto_renew = request.auto_renew and config.auto_renew and self._is_push_consumer(ctx)
        if auto_renew:
            invisible_ms = config.renew_slice_ms  # then renewed slice by slice (renewal.py)
        elif request.auto_renew:
            invisible_ms = config.default_invisible_ms
        else:
            invisible_ms = (
                invisible_duration_ms(request.invisible_time)
                if request.invisible_time is not None
                else 0
            )
            validate.invisible_time(invisible_ms, config.min_invisible_ms, config.max_invisible_ms)
        requested = (
            polling_duration_ms(request.poll_time) if request.poll_time is not None else None
        )
        poll_ms = polling_time_ms(requested, ctx.remaining_ms(), config, self.load_reserve_ms())
        expression = filter_of(request.filter_kind, request.filter_expression)
        found = await self._route_and_group(topic, group, ctx, poll_ms)
        if found is None:  # no broker answered within the poll time: an empty answer
            pop = PopRequest(group=group, topic=topic, queue_id=-1, max_messages=1)
            return ReceivePlan(brokers=[], long_poll=LongPollRequest(pop=pop, poll_ms=0))
        route, group_config, poll_ms = found
        preferred = request.broker or None
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
            brokers=self._shared_ports(self.cluster.live_ports(list(route.brokers))),
            long_poll=LongPollRequest(
                pop=pop, poll_ms=poll_ms, preferred_broker=preferred, source=self.cluster
            ),
            renew_for=RenewFor(ctx.client_id, ctx.access_key) if auto_renew else None,
        )

    async def _route_and_group(
        self, topic: str, group: str, ctx: RequestContext, poll_ms: int
    ) -> tuple[TopicRoute, GroupConfig, int] | None:
        """The topic's route and the group's config, with the poll time left after finding
        them. While no broker of the topic can answer (down, or its group has no leader: a
        leader change), the receive waits for a change of ports within its poll time, as
        the long poll itself does (docs/longpolling.md, "Brokers down or leaderless");
        None if the poll time ran out first. A refusal (no such topic, ...) fails at once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + poll_ms / 1000
        backoff = BACKOFF_START_S
        waited = False
        while True:
            try:
                # Whether the caller may create the topic is asked only when the route is
                # not cached: an ACL lookup per receive otherwise (about 5% of its CPU).
                route = self.cluster.cached_route(topic) or await self.cluster.route(
                    topic, create=ctx.create_topic(topic)
                )
                config = self.cluster.cached_group(group) or await self.cluster.group(group)
                return route, config, (remaining_ms(deadline) if waited else poll_ms)
            except Exception as exc:
                if not is_broker_down(exc):
                    raise
                if not waited:
                    self.metrics.receive_waited_unavailable(self.strategy.name)
                    waited = True
            left = deadline - loop.time()
            if left <= 0:
                return None
            changed = self.cluster.membership_changed()
            with anyio.move_on_after(min(backoff, left)):
                await changed.wait()
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    def _is_push_consumer(self, ctx: RequestContext) -> bool:
        """Renewal needs a client this proxy hears from (telemetry/heartbeat), so it can stop
        when the client goes; one known as another kind of client does not get it."""
        # The caller's own entry: another user's client under the same id earns no renewal.
        info = self.registry.get(ctx.client_id, ctx.access_key) if ctx.client_id else None
        return info is not None and info.client_type in ("", "PUSH_CONSUMER")

    def receive(self, plan: ReceivePlan) -> Awaitable[list[PoppedMessage]]:
        """The strategy's receive itself unless its handles are renewed here: no frame of
        this method's is kept by each held poll (docs/benchmarks.md, "Idle proxy, wave 9")."""
        if plan.renew_for is None:
            return self.strategy.receive(plan.brokers, plan.long_poll)
        return self._receive_renewed(plan, plan.renew_for)

    async def _receive_renewed(self, plan: ReceivePlan, renew_for: RenewFor) -> list[PoppedMessage]:
        popped = await self.strategy.receive(plan.brokers, plan.long_poll)
        if popped:
            pop = plan.long_poll.pop
            self.renewer.track(
                renew_for.client_id, pop.group, pop.topic, popped,
                access_key=renew_for.access_key,
            )  # fmt: skip
        return popped

    def keep_in_doubt(self, message: PoppedMessage) -> None:
        """A message whose write to the client began when the stream failed: it may have
        reached the client, so it counts as delivered and is not released. It keeps its
        lease: the client's ack works, and if none comes it returns when the lease ends,
        with a delivery attempt counted like any un-acked message. Its auto-renewal stops
        (a push consumer that never saw it would never nack it: renewed, it could stay
        invisible for renew_max_ms), so the lease is at most the current slice."""
        self.renewer.forget([message.receipt_handle])
        self.metrics.released("in_doubt")

    def release_unsent(self, plan: ReceivePlan, unsent: list[PoppedMessage]) -> None:
        """Messages popped for a client that vanished: make them visible again at once, in
        the background (the request that popped them is gone), on the long polls' one release
        path (BrokerCalls.release). If this fails they still come back when their invisible
        time ends."""
        if not unsent:
            return
        self.renewer.forget(m.receipt_handle for m in unsent)
        by_port: dict[BrokerPort, list[PoppedMessage]] = {}
        for message in unsent:
            try:
                port = self.cluster.port_for_handle(message.receipt_handle)
            except RefusedError as exc:  # best effort: the invisible time is the safety net
                log.info("could not release an undelivered message: %s", exc)
                self.metrics.released("kept")
                continue
            by_port.setdefault(port, []).append(message)
        calls = self.strategy.calls
        for port, messages in by_port.items():
            calls.release(port, plan.long_poll.pop, messages)
