"""Route lookups of BrokerCluster under concurrency: a failure that comes back after a newer
answer marks nothing down, and concurrent lookups of one expired route share one call.

In-process ports driven by events: the order of answers and failures is set by the test, no
time passes."""

from __future__ import annotations

import asyncio

import anyio
import pytest
from popmq.broker.contract.errors import BrokerUnavailableError, Code, RefusedError
from popmq.broker.contract.types import GroupConfig, QueueInfo, TopicInfo
from popmq.proxy.cluster import BrokerCluster
from popmq.proxy.longpoll.base import is_broker_down

from popmq.clock import ManualClock


class Port:
    """A broker group's port whose answers the test releases (``release``) or fails."""

    def __init__(self, name: str, queues: int = 2) -> None:
        self.name = name
        self.queues = queues
        self.calls = 0
        self.asked = anyio.Event()
        self.gate: anyio.Event | None = None  # set: answers wait for it
        self.error: Exception | None = None
        self.groups: dict[str, GroupConfig] = {}  # settings written (update_group)

    async def _answer(self) -> None:
        self.calls += 1
        self.asked.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            raise self.error

    async def get_topic(self, topic: str, auto_create: bool = False) -> TopicInfo:
        await self._answer()
        infos = [QueueInfo(q, 0, 0) for q in range(self.queues)]
        return TopicInfo(topic, self.queues, infos, "NORMAL")

    async def get_group(self, name: str) -> GroupConfig:
        config = self.groups.get(name, GroupConfig(name, max_attempts=5))  # read when asked
        await self._answer()
        return config

    async def update_group(self, config: GroupConfig) -> GroupConfig:
        self.groups[config.name] = config
        return config

    async def aclose(self) -> None:
        pass


def lost(name: str) -> BrokerUnavailableError:
    return BrokerUnavailableError(name, "request link lost")


# -- a stale failure marks nothing down (a group taken out of routes for CACHE_TTL_S) ----------


async def test_a_route_lookup_failing_after_the_new_leader_answered_marks_nothing_down() -> None:
    """A leader change while a route lookup waits on the old leader: the new leader's port
    answers a fresh lookup; the old lookup's failure, arriving after, left the group marked
    down for 3 s (sends skipped it, its route was cached without it)."""
    clock = ManualClock()
    old, new = Port("ga"), Port("ga", queues=4)
    old.gate, old.error = anyio.Event(), lost("ga")
    cluster = BrokerCluster([old], clock=clock)  # type: ignore[list-item]
    outcomes: list[object] = []

    async def first_lookup() -> None:
        try:
            outcomes.append(await cluster.route("T"))
        except BrokerUnavailableError as exc:
            outcomes.append(exc)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(first_lookup)
        await old.asked.wait()
        cluster.put_port(new)  # type: ignore[arg-type]  # the group's new leader
        assert (await cluster.route("T")).brokers == {"ga": 4}  # not the old lookup's flight
        old.gate.set()  # the old leader's lookup fails now, after the new leader answered
    # The old lookup answers with the group's known queues (it is not down), uncached.
    assert [getattr(o, "brokers", o) for o in outcomes] == [{"ga": 4}]
    assert not cluster.is_down("ga"), "a stale failure marked the group down"
    assert cluster.cached_route("T") is not None and cluster.cached_route("T").brokers == {"ga": 4}


async def test_an_older_lookup_failing_after_a_newer_answer_keeps_the_broker_routed() -> None:
    """Same port: a lookup that started before another lookup's answer and fails after it is
    stale; the route it returns keeps the broker's known queues (a FIFO group stays put) and
    is not cached."""
    port, other = Port("ga"), Port("gb")
    cluster = BrokerCluster([port, other])  # type: ignore[list-item]
    assert (await cluster.route("T")).brokers == {"ga": 2, "gb": 2}
    cluster.forget_topic("T")
    port.gate, port.error, port.asked = anyio.Event(), lost("ga"), anyio.Event()
    routes = []

    async def slow_lookup() -> None:
        routes.append(await cluster.route("T", create=False))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(slow_lookup)
        await port.asked.wait()
        # Another lookup (another auto-create flag: its own flight) sees the broker answer.
        port.gate, port.error, waiting = None, None, port.gate
        assert (await cluster.route("T", create=True)).brokers == {"ga": 2, "gb": 2}
        port.error = lost("ga")
        waiting.set()
    assert not cluster.is_down("ga")
    assert routes[0].brokers == {"ga": 2, "gb": 2}  # its known queues, not down


async def test_a_send_failure_older_than_an_answer_marks_nothing_down() -> None:
    cluster = BrokerCluster([Port("ga")])  # type: ignore[list-item]
    since = cluster.mark()  # a send starts
    await cluster.route("T")  # the broker answers a lookup meanwhile
    cluster.note_unavailable("ga", since)  # the send's failure comes back: stale
    assert not cluster.is_down("ga")
    cluster.note_unavailable("ga", cluster.mark())  # a failure after the answer: down
    assert cluster.is_down("ga")


async def test_a_group_lookup_failing_after_a_newer_answer_marks_nothing_down() -> None:
    old, new = Port("ga"), Port("ga")
    old.gate, old.error = anyio.Event(), lost("ga")
    cluster = BrokerCluster([old])  # type: ignore[list-item]

    async def first_lookup() -> None:
        with pytest.raises(BrokerUnavailableError):  # nobody else to ask, no copy seen
            await cluster.group("g1")

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(first_lookup)
        await old.asked.wait()
        cluster.put_port(new)  # type: ignore[arg-type]
        assert (await cluster.group("g2")).max_attempts == 5
        old.gate.set()
    assert not cluster.is_down("ga")


async def test_a_failure_with_no_newer_answer_still_marks_the_broker_down() -> None:
    """What the marks are for stays: a broker that fails with nothing newer is left out."""
    port, other = Port("ga"), Port("gb")
    port.error = lost("ga")
    cluster = BrokerCluster([port, other])  # type: ignore[list-item]
    assert (await cluster.route("T")).brokers == {"gb": 2}
    assert cluster.is_down("ga")


# -- single flight: one lookup per expired route, its outcome for every waiter ----------------


async def _many_routes(cluster: BrokerCluster, count: int) -> list[object]:
    outcomes: list[object] = []

    async def one() -> None:
        try:
            outcomes.append(await cluster.route("T"))
        except Exception as exc:
            outcomes.append(exc)

    async with anyio.create_task_group() as tasks:
        for _ in range(count):
            tasks.start_soon(one)
    return outcomes


async def test_concurrent_lookups_of_an_expired_route_share_one_call() -> None:
    clock = ManualClock()
    ports = [Port("ga"), Port("gb")]
    cluster = BrokerCluster(ports, clock=clock)  # type: ignore[arg-type]
    await cluster.route("T")
    clock.now_s += 60  # the cached route expired
    for port in ports:
        port.gate = anyio.Event()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(_release_when_asked, ports)
        outcomes = await _many_routes(cluster, 50)
    assert [port.calls for port in ports] == [2, 2], "each of 50 receives asked every broker"
    assert len(outcomes) == 50 and len({id(route) for route in outcomes}) == 1


async def _release_when_asked(ports: list[Port]) -> None:
    for port in ports:
        await port.asked.wait()
    for _ in range(5):  # let every caller reach the shared lookup first
        await asyncio.sleep(0)
    for port in ports:
        assert port.gate is not None
        port.gate.set()


@pytest.mark.parametrize(
    "error",
    [lost("ga"), RefusedError(Code.TOPIC_NOT_FOUND, "no topic T")],
    ids=["unavailable", "not-found"],
)
async def test_the_shared_lookups_failure_reaches_every_waiter(error: Exception) -> None:
    port = Port("ga")
    port.gate, port.error = anyio.Event(), error
    cluster = BrokerCluster([port])  # type: ignore[list-item]
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(_release_when_asked, [port])
        outcomes = await _many_routes(cluster, 20)
    assert port.calls == 1
    assert len(outcomes) == 20
    assert all(type(o) is type(error) for o in outcomes), outcomes
    assert {o.code for o in outcomes} == {error.code}  # type: ignore[attr-defined]
    port.gate, port.error = None, None  # the failure is not kept: the next call asks again
    assert (await cluster.route("T")).brokers == {"ga": 2}
    assert port.calls == 2


async def test_a_lookup_whose_caller_gives_up_is_taken_over_by_a_waiter() -> None:
    """The caller that started the shared lookup is cancelled (its client went away): the
    others do not fail with its cancellation; one of them looks up again."""
    port = Port("ga")
    port.gate = anyio.Event()
    cluster = BrokerCluster([port])  # type: ignore[list-item]
    outcomes: list[object] = []

    async def waiters() -> None:
        outcomes.extend(await _many_routes(cluster, 3))

    first = anyio.CancelScope()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(_cancelled_route, cluster, first)
        await port.asked.wait()
        tasks.start_soon(waiters)
        for _ in range(5):  # every waiter joins the shared lookup
            await asyncio.sleep(0)
        assert port.calls == 1
        first.cancel()  # the caller that leads it goes
        await _wait_calls(port, 2)  # one waiter took over
        port.gate.set()
    assert port.calls == 2
    assert [type(o).__name__ for o in outcomes] == ["TopicRoute"] * 3


async def _cancelled_route(cluster: BrokerCluster, scope: anyio.CancelScope) -> None:
    with scope:
        await cluster.route("T")


async def _wait_calls(port: Port, calls: int) -> None:
    for _ in range(100):
        if port.calls >= calls:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{port.calls} calls, not {calls}")


# -- group configs: one lookup at a time; a change of ports makes lookups under way stale ------


async def test_concurrent_lookups_of_an_expired_group_share_one_call() -> None:
    """Every receive and heartbeat of a group reads its config: when the cached copy expires
    under load, fifty callers asked the brokers fifty times (a herd on the first broker)."""
    clock = ManualClock()
    port = Port("ga")
    cluster = BrokerCluster([port], clock=clock)  # type: ignore[list-item]
    await cluster.group("g")
    clock.now_s += 60  # the cached config expired
    port.gate = anyio.Event()
    configs: list[GroupConfig] = []

    async def one() -> None:
        configs.append(await cluster.group("g"))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(_release_when_asked, [port])
        for _ in range(50):
            tasks.start_soon(one)
    assert port.calls == 2, f"50 callers made {port.calls - 1} lookups, not one"
    assert len(configs) == 50 and len({id(c) for c in configs}) == 1


async def test_a_route_looked_up_while_a_group_joins_is_not_cached_without_it() -> None:
    """A lookup that began before a broker group joined answers its caller but caches
    nothing: the next send routes to the new group at once, not CACHE_TTL_S later."""
    old = Port("ga")
    old.gate = anyio.Event()
    cluster = BrokerCluster([old], dynamic=True)  # type: ignore[list-item]
    routes: list[object] = []

    async def lookup() -> None:
        routes.append(await cluster.route("T"))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(lookup)
        await old.asked.wait()
        cluster.put_port(Port("gb"))  # type: ignore[arg-type]  # a new group joins meanwhile
        old.gate.set()
    assert [getattr(r, "brokers", r) for r in routes] == [{"ga": 2}]
    old.gate = None
    assert (await cluster.route("T")).brokers == {"ga": 2, "gb": 2}


async def test_a_group_lookup_with_no_broker_yet_is_unavailable_not_an_assertion() -> None:
    cluster = BrokerCluster([], dynamic=True)
    with pytest.raises(BrokerUnavailableError, match="no broker"):
        await cluster.group("g")


# -- review (helper review-s10b): admin changes of a group while a lookup of it is under way ----


async def test_a_group_lookup_under_way_does_not_undo_an_update() -> None:
    """`popmq admin groups update` while a lookup of the group (begun before) waits on a
    broker: the lookup's answer, read before the update, replaced the new settings in the
    cache, and receives and heartbeats used the old ones for CACHE_TTL_S."""
    port = Port("ga")
    port.gate = anyio.Event()
    cluster = BrokerCluster([port])  # type: ignore[list-item]
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(cluster.group, "g")
        await port.asked.wait()
        assert (await cluster.update_group(GroupConfig("g", max_attempts=2))).max_attempts == 2
        port.gate.set()  # the lookup under way answers what it read before the update
    assert (await cluster.group("g")).max_attempts == 2


async def test_a_group_deleted_while_looked_up_is_not_looked_up_from_before_the_delete() -> None:
    """`popmq admin groups delete` while a lookup of the group waits on a broker: a caller
    that comes after the delete joined that lookup and got the deleted group's settings, and
    the lookup put them back in the cache the delete had just emptied."""
    port = Port("ga")
    port.groups["g"] = GroupConfig("g", max_attempts=9, fifo=True)
    port.gate = anyio.Event()
    cluster = BrokerCluster([port])  # type: ignore[list-item]
    after: list[GroupConfig] = []

    async def later_caller() -> None:
        after.append(await cluster.group("g"))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(cluster.group, "g")
        await port.asked.wait()
        del port.groups["g"]  # deleted on the broker (its next use registers it anew)
        cluster.forget_group("g")
        tasks.start_soon(later_caller)
        for _ in range(5):
            await asyncio.sleep(0)
        port.gate.set()
    assert [(c.max_attempts, c.fifo) for c in after] == [(5, False)]
    assert port.calls == 2, "the caller after the delete joined the lookup from before it"
    assert (await cluster.group("g")).max_attempts == 5
    assert port.calls == 2  # cached: the settings read after the delete


async def test_a_route_with_no_broker_yet_is_unavailable_not_topic_not_found() -> None:
    """A proxy following etcd before any group has joined: a route lookup said the topic does
    not exist (TOPIC_NOT_FOUND, which clients do not retry, and a receive failed at once
    instead of waiting for a broker as it does while every group is leaderless)."""
    cluster = BrokerCluster([], dynamic=True)
    with pytest.raises(BrokerUnavailableError, match="no broker") as failed:
        await cluster.route("T")
    assert is_broker_down(failed.value)


async def test_no_broker_yet_is_refused_as_a_leaderless_group_is() -> None:
    """A client's send before any group joined sees HA_NOT_AVAILABLE (retried), not an
    internal error."""
    cluster = BrokerCluster([], dynamic=True)
    with pytest.raises(BrokerUnavailableError) as caught:
        await cluster.route("T")
    assert caught.value.code == Code.HA_NOT_AVAILABLE


async def test_updating_a_group_with_no_broker_yet_is_refused_not_an_internal_error() -> None:
    cluster = BrokerCluster([], dynamic=True)
    with pytest.raises(BrokerUnavailableError) as caught:
        await cluster.update_group(GroupConfig("g", max_attempts=3))
    assert caught.value.code == Code.HA_NOT_AVAILABLE
