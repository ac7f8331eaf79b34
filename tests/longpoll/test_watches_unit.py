"""Visibility watches on the proxy side: the state machine and the registry's linger."""

from __future__ import annotations

import pytest
from popmq.broker.contract.types import PopRequest
from popmq.broker.contract.watch import VisibilityWatch, WatchKey, WatchState
from popmq.proxy.longpoll.watches import WatchRegistry

# Virtual time (looptime): sleeps and deadlines take no real time, timing asserts are exact.
pytestmark = pytest.mark.looptime


class _Backend:
    def __init__(self, up: bool = True) -> None:
        self.up = up
        self.arms: list[tuple[int, int]] = []
        self.cancels: list[int] = []

    def send_arm(self, watch: VisibilityWatch) -> bool:
        self.arms.append((watch.id, watch.seq))
        return self.up

    def send_cancel(self, watch: VisibilityWatch) -> None:
        self.cancels.append(watch.id)


class _Port:
    name = "b0"

    def __init__(self) -> None:
        self.watch_backend = _Backend()


POP = PopRequest(group="g", topic="t", max_messages=1, invisible_time_ms=1000)


async def test_an_event_for_an_older_arm_is_ignored() -> None:
    backend = _Backend()
    watch = VisibilityWatch(WatchKey("g", "t", POP.filter, False), backend)
    watch.arm()
    assert (watch.state, watch.pending) == (WatchState.ARMED, True)
    watch.arm()  # pending: no second arm on the wire
    assert len(backend.arms) == 1
    watch.on_event(watch.seq + 1)  # not ours
    assert watch.state is WatchState.ARMED and not watch.may_have
    watch.on_event(watch.seq)
    assert watch.state is WatchState.HAS and watch.may_have


async def test_a_lost_link_makes_an_armed_watch_unknown_until_it_is_back() -> None:
    backend = _Backend()
    watch = VisibilityWatch(WatchKey("g", "t", POP.filter, False), backend)
    watch.arm()
    watch.on_link_lost()
    assert watch.state is WatchState.UNKNOWN and watch.may_have and watch.pending
    watch.on_link_up()  # the pending arm was re-sent
    assert watch.state is WatchState.ARMED
    watch.on_event(watch.seq)
    assert watch.state is WatchState.HAS


async def test_arming_on_a_down_link_stays_unknown() -> None:
    watch = VisibilityWatch(WatchKey("g", "t", POP.filter, False), _Backend(up=False))
    watch.arm()
    assert watch.state is WatchState.UNKNOWN and watch.may_have


async def test_the_registry_shares_watches_and_cancels_them_after_the_linger() -> None:
    port = _Port()
    registry = WatchRegistry(linger_s=10)
    first = registry.get(port, POP)  # type: ignore[arg-type]
    assert first is not None and first is registry.get(port, POP)  # type: ignore[arg-type]
    assert port.watch_backend.arms == [(first.id, 1)]  # armed once, on creation
    assert not registry.may_have(port, POP)  # type: ignore[arg-type]
    held = registry.acquire(port, POP)  # type: ignore[arg-type]
    assert held is first
    registry.sweep(now=1e12)  # in use by a hub channel: kept however old
    assert len(registry) == 1
    registry.release(port, first)  # type: ignore[arg-type]
    registry.sweep(now=1e12)
    assert len(registry) == 0 and port.watch_backend.cancels == [first.id]


async def test_a_link_that_cannot_open_leaves_no_watch_armed() -> None:
    """A broken channel (say an unreadable token file) must fail open: the watch goes
    UNKNOWN, so long polls pop the broker (and see its error) instead of trusting it."""
    import asyncio

    from popmq.broker.wire.link import BrokerLink

    def broken_stub() -> object:
        raise ValueError("cannot read the cluster token file")

    link = BrokerLink("b0", broken_stub)
    watch = VisibilityWatch(WatchKey("g", "t", POP.filter, False), link)
    watch.arm()
    assert watch.state is WatchState.ARMED  # queued for the first stream
    async with asyncio.timeout(5):
        await watch.wait()
    assert watch.state is WatchState.UNKNOWN and watch.may_have
    assert link.losses == 0  # it never opened: no stream was lost (losses feed a flapping alert)
    await link.aclose()
