"""BrokerCluster: the brokers a proxy fronts, by name, and everything derived from them.

It routes by receipt handle (the handle names its broker), finds which brokers serve a topic,
picks the queue for a send, and caches topic and group metadata for a few seconds. The ports
may be in-process (LocalBrokerPort) or remote (RemoteBrokerPort); nothing here cares which.
The caches are soft: losing them loses nothing, and several proxies over the same brokers agree
within CACHE_TTL_S.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import anyio
from popmq.broker.contract.errors import BrokerUnavailableError, Code, RefusedError
from popmq.broker.contract.message_types import (
    CREATABLE,
    MessageType,
    accepted_types,
    parse_message_type,
)
from popmq.broker.contract.port import BrokerPort
from popmq.broker.contract.queues import queue_for_group
from popmq.broker.contract.types import GroupConfig, TopicInfo
from popmq.broker.pop.handle import peek_broker_name
from popmq.proxy.single_flight import SingleFlight

from popmq.clock import SYSTEM, Clock
from popmq.coord.directory import GroupView
from popmq.lifecycle import AsyncClosing, fan_out

log = logging.getLogger(__name__)

CACHE_TTL_S = 3.0
LAST_GROUP_TTL_S = 3600.0


@dataclass(slots=True, frozen=True, order=True)
class QueueRef:
    """One queue of a topic on one broker (an entry of a route)."""

    broker: str
    queue_id: int


@dataclass(slots=True)
class TopicRoute:
    topic: str
    # broker name -> queue count, in the cluster's broker order; only brokers with the topic.
    brokers: dict[str, int]
    # The message types the topic takes on any of its brokers (MessageType names, in
    # message_types.CREATABLE order); each broker enforces its own on send.
    accepts: tuple[str, ...] = ("NORMAL", "FIFO", "DELAY")
    # broker name -> the topic's MessageType name there (UNSPECIFIED: no message yet).
    types: dict[str, str] = field(default_factory=dict)
    # Every queue, built once: routes are cached and read on every send.
    queues: list[QueueRef] = field(init=False)

    def __post_init__(self) -> None:
        self.queues = [QueueRef(b, q) for b, count in self.brokers.items() for q in range(count)]


def accepted_by(infos: Sequence[TopicInfo]) -> tuple[str, ...]:
    """What the topic takes: what every typed copy of it takes (copies no message has typed
    yet take anything). Should typed copies disagree (two first messages of different types
    through different proxies at once), what any of them takes, so sends go on."""
    typed = [parse_message_type(i.message_type) for i in infos]
    sets = [set(accepted_types(t)) for t in typed if t is not MessageType.UNSPECIFIED]
    if not sets:
        sets = [set(accepted_types(MessageType.UNSPECIFIED))]
    taken = set.intersection(*sets) or set.union(*sets)
    return tuple(t.value for t in CREATABLE if t in taken)


K = TypeVar("K")
V = TypeVar("V")


class NoBrokerYetError(BrokerUnavailableError):
    """A proxy following etcd before any broker group joined: receives wait for one, other
    calls are refused as a leaderless group's are (HA_NOT_AVAILABLE: the client retries)."""

    code = Code.HA_NOT_AVAILABLE


class _TtlCache(Generic[K, V]):
    def __init__(self, ttl_s: float, clock: Clock) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._items: dict[K, tuple[float, V]] = {}

    def get(self, key: K) -> V | None:
        hit = self._items.get(key)
        if hit is None or hit[0] < self._clock.monotonic():
            return None
        return hit[1]

    def put(self, key: K, value: V) -> None:
        if len(self._items) > 10_000:  # bounded: stale entries are only an optimisation
            self._items.clear()
        self._items[key] = (self._clock.monotonic() + self._ttl_s, value)

    def drop(self, key: K) -> None:
        self._items.pop(key, None)

    def clear(self) -> None:
        self._items.clear()


class BrokerCluster(AsyncClosing):
    def __init__(
        self,
        ports: Sequence[BrokerPort],
        *,
        auto_create_topics: bool = True,
        dynamic: bool = False,
        clock: Clock = SYSTEM,
    ) -> None:
        # dynamic: brokers come and go while the proxy runs (followed in etcd), so it may
        # start with none.
        if not ports and not dynamic:
            raise ValueError("a proxy needs at least one broker")
        self._ports: dict[str, BrokerPort] = {}
        for port in ports:
            if port.name in self._ports:
                raise ValueError(f"two brokers are named {port.name!r}")
            self._ports[port.name] = port
        self.auto_create_topics = auto_create_topics
        self._clock = clock  # cache lifetimes and down times (virtual in tests)
        self._routes: _TtlCache[str, TopicRoute] = _TtlCache(CACHE_TTL_S, clock)
        self._groups: _TtlCache[str, GroupConfig] = _TtlCache(CACHE_TTL_S, clock)
        # The last config seen of each group: used while no broker answers.
        self._last_groups: _TtlCache[str, GroupConfig] = _TtlCache(LAST_GROUP_TTL_S, clock)
        self._down_until: dict[str, float] = {}  # broker name -> monotonic time
        # Order of what the cluster learns of its brokers: a call takes a mark when it starts
        # (``mark``); an answer, or a new port, records one per broker. A failure that started
        # before the broker's latest sign of life is stale: it marks nothing down (a route
        # lookup to a replaced leader timing out after the new one answered took the group
        # out of routes for CACHE_TTL_S).
        self._marks = itertools.count()
        self._alive_at: dict[str, int] = {}  # broker name -> mark of its latest sign of life
        # One route lookup at a time per (topic, auto-create): an expired route asked for by
        # many sends and receives at once is looked up once, and they share its outcome.
        self._route_flights: SingleFlight[tuple[str, bool], TopicRoute] = SingleFlight()
        self._group_flights: SingleFlight[str, GroupConfig] = SingleFlight()
        # Bumped at each change of ports: a lookup that began before one caches nothing
        # (it may have missed a group that joined, or asked a port since replaced).
        self._membership = 0
        # Bumped when the admin updates or deletes a group: a group lookup that began before
        # caches nothing (what it read may be the old settings, or a deleted group's).
        self._group_changes = 0
        self._round_robin = itertools.count()
        # (topic, broker) -> the queue count last seen: a broker that is down (or a group
        # without a leader) keeps its queues in routes, so a FIFO message group keeps its
        # queue and waits for it instead of moving (which would break its order).
        self._known_queues: dict[tuple[str, str], int] = {}
        self._draining: set[str] = set()  # brokers that take no new sends
        # Set (and replaced) at each change of ports: receives waiting out a leader change
        # ask the new leader at once (popmq.proxy.longpoll.base.StrategyBase._retrying).
        self._changed: anyio.Event | None = None  # made when first awaited (needs a loop)
        self._change_listeners: set[Callable[[], None]] = set()
        # The replicated broker groups as etcd last said (proxy/discovery.py sets it; empty
        # without etcd): leaders, epochs, in-sync sets and lags, for cluster status.
        self.group_views: dict[str, GroupView] = {}

    # -- brokers -----------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return list(self._ports)

    @property
    def ports(self) -> list[BrokerPort]:
        return list(self._ports.values())

    def port(self, name: str) -> BrokerPort:
        port = self._ports.get(name)
        if port is None:
            raise RefusedError(Code.NOT_FOUND, f"no broker named {name!r} behind this proxy")
        return port

    def port_for_handle(self, receipt_handle: str) -> BrokerPort:
        """The broker that issued a receipt handle (read from the handle, not verified here:
        the broker verifies its signature)."""
        if not receipt_handle:
            raise RefusedError(Code.INVALID_RECEIPT_HANDLE, "receipt handle is empty")
        name = peek_broker_name(receipt_handle)
        port = self._ports.get(name)
        if port is None:
            raise RefusedError(
                Code.INVALID_RECEIPT_HANDLE, f"receipt handle names unknown broker {name!r}"
            )
        return port

    async def aclose(self) -> None:
        for port in self._ports.values():
            await port.aclose()

    # -- membership (followed in etcd by popmq.proxy.discovery) ------------------------------
    def put_port(self, port: BrokerPort) -> BrokerPort | None:
        """Add a broker, or replace the port of one (its group elected another leader); the
        replaced port, for the caller to close once its calls are over."""
        old = self._ports.get(port.name)
        self._ports[port.name] = port
        self._down_until.pop(port.name, None)
        self._alive_at[port.name] = next(self._marks)  # calls to the old port are stale now
        self._forget_lookups()
        self._note_change()
        return old

    def _forget_lookups(self) -> None:
        """The ports changed: cached routes and groups, and lookups under way, are stale."""
        self._membership += 1
        self._routes.clear()
        self._route_flights.forget()  # lookups under way asked the old ports: not joined
        self._group_flights.forget()

    def membership_changed(self) -> anyio.Event:
        """An event set at the next put_port or remove_port."""
        if self._changed is None:
            self._changed = anyio.Event()
        return self._changed

    def listen_changes(self, listener: Callable[[], None], *, on: bool) -> None:
        """Call ``listener`` at each put_port / remove_port (``on``), or stop calling it."""
        if on:
            self._change_listeners.add(listener)
        else:
            self._change_listeners.discard(listener)

    def _note_change(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None
        for listener in list(self._change_listeners):
            listener()

    def current_ports(self, names: Sequence[str]) -> list[BrokerPort]:
        """The ports now behind these names (a name gone from the cluster is left out)."""
        return [port for name in names if (port := self._ports.get(name)) is not None]

    def remove_port(self, name: str) -> BrokerPort | None:
        """Take a broker out (`popmq admin brokers remove`); its port, for the caller to close."""
        old = self._ports.pop(name, None)
        self._down_until.pop(name, None)
        self._alive_at.pop(name, None)
        self._draining.discard(name)
        self._known_queues = {k: v for k, v in self._known_queues.items() if k[1] != name}
        self._forget_lookups()
        self._note_change()
        return old

    def set_draining(self, name: str, draining: bool) -> None:
        """A draining broker keeps serving receives and acks but takes no new sends."""
        if draining != (name in self._draining):
            log.info("broker %s %s", name, "drains: no new sends" if draining else "takes sends")
            self._draining.symmetric_difference_update({name})

    @property
    def draining(self) -> frozenset[str]:
        return frozenset(self._draining)

    # -- topics ------------------------------------------------------------------------------
    def cached_route(self, topic: str) -> TopicRoute | None:
        """The topic's route if it is cached (what ``route`` answers without asking anyone)."""
        return self._routes.get(topic)

    async def route(self, topic: str, *, create: bool | None = None) -> TopicRoute:
        """Which brokers serve a topic, with their queue counts. TOPIC_NOT_FOUND if none.

        Concurrent calls for a route not cached share one lookup (single flight): its route,
        or its failure, reaches each of them. A caller that gives up (cancelled) while others
        wait hands the lookup on: one of them looks up again."""
        auto_create = self.auto_create_topics if create is None else create
        return await self._route_flights.run(
            (topic, auto_create),
            lambda: self._routes.get(topic),
            lambda: self._look_up_route(topic, auto_create),
        )

    async def _look_up_route(self, topic: str, auto_create: bool) -> TopicRoute:
        if not self._ports:  # a proxy following etcd before any group has joined
            raise NoBrokerYetError("-", "no broker behind this proxy yet")
        membership = self._membership
        unavailable: list[BrokerUnavailableError] = []
        not_found: list[RefusedError] = []  # a broker's refusal says why (auto-create limits)

        stale: set[str] = set()  # brokers whose failure here came after a newer answer

        async def lookup(port: BrokerPort) -> TopicInfo | None:
            since = self.mark()
            try:
                info = await port.get_topic(topic, auto_create=auto_create)
            except BrokerUnavailableError as exc:
                unavailable.append(exc)
                if self._stale(port.name, since):
                    # It answered (or got a new leader) since this lookup began: not down.
                    # This route keeps its known queues and is not cached.
                    stale.add(port.name)
                    return None
                # A broker that is down leaves the route (as a name server drops it) until
                # it answers again; the others keep serving the topic. Logged when it goes
                # down, not at every lookup while it stays down (a leaderless group).
                if not self.is_down(port.name):
                    log.warning("broker %s left out of the route of %s: %s", port.name, topic, exc)
                self._down_until[port.name] = self._clock.monotonic() + CACHE_TTL_S
                return None
            except RefusedError as exc:
                if exc.code == Code.TOPIC_NOT_FOUND:
                    not_found.append(exc)
                    return None
                raise
            # It answered: not down (a mark left by a lost request link or an earlier lookup
            # would else drop this answer below, and the route be TOPIC_NOT_FOUND).
            self._down_until.pop(port.name, None)
            self._alive_at[port.name] = self.mark()
            return info

        # Brokers known to be down are left out until they are tried again (see is_down).
        ports = self.live_ports()
        infos = await fan_out(lookup(port) for port in ports)
        by_name = {port.name: info for port, info in zip(ports, infos, strict=True)}
        brokers: dict[str, int] = {}
        for name in self._ports:  # cluster order
            info = by_name.get(name)
            if info is not None and info.queue_count > 0:
                brokers[name] = info.queue_count
                self._known_queues[topic, name] = info.queue_count
            elif info is None and (self.is_down(name) or name in stale):
                known = self._known_queues.get((topic, name))
                if known:  # down, but its queues stay (FIFO groups wait for them)
                    brokers[name] = known
        if not any(not self.is_down(name) for name in brokers):
            brokers = {}  # only known-but-down brokers: as unavailable as before
        if not brokers:
            if unavailable:
                raise unavailable[0]
            if not_found:
                raise RefusedError(Code.TOPIC_NOT_FOUND, not_found[0].message)
            raise RefusedError(Code.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist")
        found = [info for info in infos if info is not None and info.queue_count > 0]
        types = {
            port.name: info.message_type
            for port, info in zip(ports, infos, strict=True)
            if info is not None and info.queue_count > 0
        }
        route = TopicRoute(topic, brokers, accepted_by(found), types)
        # Not cached if a broker's answer was stale (what it says now is unknown) or the
        # ports changed meanwhile (a group that joined would stay out of it for CACHE_TTL_S).
        if not stale and membership == self._membership:
            self._routes.put(topic, route)
        return route

    async def topic_infos(self, topic: str) -> dict[str, TopicInfo]:
        """Every broker's TopicInfo for a topic, by broker name in cluster order: fresh (no
        cache, no auto-create), for admin reads. A broker that cannot answer fails the call;
        TOPIC_NOT_FOUND if no broker has the topic."""

        async def lookup(port: BrokerPort) -> TopicInfo | None:
            try:
                return await port.get_topic(topic)
            except RefusedError as exc:
                if exc.code == Code.TOPIC_NOT_FOUND:
                    return None
                raise

        infos = await fan_out(lookup(port) for port in self.ports)
        found = {
            name: info for name, info in zip(self.names, infos, strict=True) if info is not None
        }
        if not found:
            raise RefusedError(Code.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist")
        return found

    def forget_topic(self, topic: str) -> None:
        self._routes.drop(topic)

    def pick_queue(self, route: TopicRoute, message_group: str = "") -> QueueRef:
        """Round robin over the topic's queues; a FIFO message group always maps to one queue.
        Draining brokers get no new sends (unless every broker of the route drains)."""
        queues = route.queues
        if self._draining:
            queues = [q for q in queues if q.broker not in self._draining] or queues
        if message_group:
            return queues[queue_for_group(message_group, len(queues))]
        # Unordered sends skip brokers known to be down (kept in routes only for FIFO).
        queues = [q for q in queues if not self.is_down(q.broker)] or queues
        return queues[next(self._round_robin) % len(queues)]

    # -- broker health ----------------------------------------------------------------------
    def mark(self) -> int:
        """A mark for a call about to start: give it to ``note_unavailable`` if it fails."""
        return next(self._marks)

    def _stale(self, name: str, since: int) -> bool:
        """Whether the broker showed a sign of life (an answer, a new port) after ``since``."""
        return self._alive_at.get(name, -1) > since

    def note_unavailable(self, name: str, since: int | None = None) -> None:
        """A broker did not answer: leave it out of routes and group lookups for a while (a
        name server drops a dead broker the same way); it is tried again after that. With
        ``since`` (the failed call's ``mark``), a failure older than the broker's latest
        answer, or than its current port, is stale and changes nothing."""
        if since is not None and self._stale(name, since):
            return
        if name not in self._down_until:
            log.warning("broker %s is unavailable; serving from the others", name)
        self._down_until[name] = self._clock.monotonic() + CACHE_TTL_S
        self._routes.clear()

    def is_down(self, name: str) -> bool:
        until = self._down_until.get(name)
        if until is None:
            return False
        if until < self._clock.monotonic():
            del self._down_until[name]
            return False
        return True

    def live_ports(self, names: Sequence[str] | None = None) -> list[BrokerPort]:
        """The ports (of ``names``, default all) not known to be down; all of them if every
        one is, so a request still gets a real answer from a broker."""
        ports = [self._ports[n] for n in (names if names is not None else self._ports)]
        if not self._down_until:  # none known down (every receive asks): no check per port
            return ports
        live = [port for port in ports if not self.is_down(port.name)]
        return live or ports

    # -- groups ------------------------------------------------------------------------------
    def cached_group(self, name: str) -> GroupConfig | None:
        """The group's config if it is cached (what ``group`` answers without asking anyone):
        a receive's usual case, without the single flight's two coroutines and closures."""
        return self._groups.get(name)

    async def group(self, name: str) -> GroupConfig:
        """A group's config from any live broker (admin writes it to every broker): brokers
        known to be down are asked last, and if none answers the last copy seen is used."""
        return await self._group_flights.run(
            name, lambda: self._groups.get(name), lambda: self._look_up_group(name)
        )

    async def _look_up_group(self, name: str) -> GroupConfig:
        changes = self._group_changes
        ordered = self.live_ports()
        ordered += [port for port in self.ports if port not in ordered]
        failure: BrokerUnavailableError | None = None
        for port in ordered:
            since = self.mark()
            try:
                config = await port.get_group(name)
            except BrokerUnavailableError as exc:
                self.note_unavailable(port.name, since)
                failure = exc
                continue
            self._alive_at[port.name] = self.mark()
            if changes == self._group_changes:  # else read before an update or a delete
                self._groups.put(name, config)
                self._last_groups.put(name, config)
            return config
        stale = self._last_groups.get(name)
        if stale is not None:
            return stale
        if failure is None:  # a proxy following etcd before any group has joined
            raise NoBrokerYetError("-", "no broker behind this proxy yet")
        raise failure

    def forget_group(self, name: str) -> None:
        """Drop cached settings of a deleted group (the next use reads the brokers): a lookup
        of it under way read them before the delete, so it is not joined and caches nothing."""
        self._group_changed(name)
        self._groups.drop(name)
        self._last_groups.drop(name)

    async def update_group(self, config: GroupConfig) -> GroupConfig:
        if not self._ports:
            raise NoBrokerYetError("-", "no broker behind this proxy yet")
        try:
            results = await fan_out(port.update_group(config) for port in self.ports)
        finally:
            self._group_changed(config.name)  # some brokers may have the new settings
        self._groups.put(config.name, results[0])
        self._last_groups.put(config.name, results[0])
        return results[0]

    def _group_changed(self, name: str) -> None:
        """A lookup of the group under way may have read settings from before this change:
        it answers its own callers, later callers look up anew, and it caches nothing."""
        self._group_changes += 1
        self._group_flights.forget(name)
