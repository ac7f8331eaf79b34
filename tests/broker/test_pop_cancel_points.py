"""A held pop cancelled at any of its await points leaves nothing taken (virtual time).

The proxy cancels a held pop when its receive's deadline passes or its client goes: over the
request link the broker's ``serve`` ends the pop's cancel scope and answers "nothing taken";
in one process (``popmq serve``) the receive's cancel scope ends the pop on its own task. Both
are true only if a pop cancelled at any await point between "messages taken" and "answer
handed to the caller" gives back what it took. These tests do not race the clock for that:
``_CancelAt`` runs the pop and lands the cancel at its k-th suspension, for every k until the
pop completes, in both orders a cancel can meet a suspension (before what it waits for is
done; or once it is done, before the pop resumes: the order that loses a result). After each
cancel, a pop without hold must get every message at once, with no delivery attempt counted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine, Generator
from pathlib import Path
from typing import Any

import pytest
from popmq.broker.contract.errors import Code
from popmq.broker.contract.types import AckEntry, Message, PopRequest, PopResult
from popmq.broker.core import Broker
from popmq.broker.local import LocalBrokerPort
from popmq.broker.replication.epochs import EpochHistory
from popmq.broker.replication.leader import ReplicationLeader
from popmq.broker.replication.port import Leading, NodePort
from popmq.broker.replication.role import GroupRole, StaticRoleSource
from popmq.broker.store import changes
from popmq.broker.testing import fast_broker_config, running_broker
from popmq.broker.wire import convert
from popmq.broker.wire.server import BrokerServicer
from popmq.proxy.longpoll.calls import BrokerCalls
from popmq.proxy.longpoll.custody import Custody
from popmq.proxy.metrics import ProxyMetrics

from popmq.clock import LoopClock
from popmq.config import ReplicationConfig

pytestmark = pytest.mark.looptime

TOPIC = "T"
GROUP = "G"
ROLE = GroupRole(epoch=1, leader_name="broker-a", leader_address="127.0.0.1:1", is_leader=True)


class _CancelAt:
    """Awaits ``coro``; at its ``at``-th suspension a cancel lands there, as ``Task.cancel``
    delivers it: ``resolved=False``, while what it waits for is not done (that is cancelled,
    the coroutine sees it so); ``resolved=True``, once it is done (a wake, a barrier's
    answer), before the coroutine resumes. ``landed`` tells whether the pop got that far."""

    def __init__(self, coro: Coroutine[Any, Any, Any], at: int, resolved: bool) -> None:
        self._coro = coro
        self._at = at
        self._resolved = resolved
        self.landed = False

    def __await__(self) -> Generator[Any, Any, Any]:
        coro = self._coro
        value: Any = None
        error: BaseException | None = None
        count = 0
        while True:
            try:
                yielded = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as stop:
                return stop.value
            value, error = None, None
            count += 1
            if count == self._at:
                self.landed = True
                if isinstance(yielded, asyncio.Future) and not yielded.done():
                    if not self._resolved:
                        yielded.cancel()  # Task.cancel() on a task suspended there
                        continue  # resumed, the coroutine finds it cancelled
                    try:
                        yield yielded  # until it is done ...
                    except BaseException as exc:  # handed to the coroutine
                        error = exc
                        continue
                error = asyncio.CancelledError()  # ... then the cancel, before it resumes
                continue
            try:
                value = yield yielded
            except BaseException as exc:  # a cancel of the test task: passed on
                error = exc


def _held(fifo: bool, poll_ms: int = 5_000) -> PopRequest:
    return PopRequest(
        group=GROUP, topic=TOPIC, max_messages=8, invisible_time_ms=60_000,
        poll_time_ms=poll_ms, fifo=fifo,
    )  # fmt: skip


async def _held_or_done(broker: Broker, task: asyncio.Future[Any]) -> None:
    async with asyncio.timeout(10):
        while broker.engine._hold.total != 1 and not task.done():  # noqa: ASYNC110
            await asyncio.sleep(0.001)


PopCall = Callable[[PopRequest], Coroutine[Any, Any, PopResult]]


@contextlib.asynccontextmanager
async def _layer(name: str, root: Path) -> AsyncIterator[tuple[LocalBrokerPort, PopCall]]:
    """The broker and the pop of one layer between the engine and the caller."""
    async with running_broker(fast_broker_config(root / "b"), LoopClock()) as broker:
        local = LocalBrokerPort(broker)
        await local.create_topic(TOPIC, 1)
        if name == "broker":  # LocalBrokerPort: the broker process's port, `popmq serve`'s
            yield local, local.pop
        elif name == "servicer":  # the handler of a unary Pop and of a linked pop

            async def servicer_pop(request: PopRequest) -> PopResult:
                proto = convert.pop_request_to_proto(request)
                response = await BrokerServicer(local).Pop(proto, None)
                return convert.pop_result_from_proto(response)

            yield local, servicer_pop
        elif name == "proxy-in-process":  # the proxy's pop of an in-process broker
            calls = BrokerCalls(ProxyMetrics())

            async def proxy_pop(request: PopRequest) -> PopResult:
                custody = Custody(lambda port, msgs: calls.release(port, request, msgs))
                try:
                    return await calls.pop(local, request, custody)
                except BaseException:
                    custody.abandon()  # as the receive does when it ends without them
                    raise

            try:
                yield local, proxy_pop
            finally:
                await calls.aclose()
        else:  # a replicated leader's port: the sync barrier after the pop
            settings = ReplicationConfig(mode="sync", min_in_sync=2)
            leader = ReplicationLeader(
                root / "b", "b", ROLE, StaticRoleSource(ROLE), settings,
                EpochHistory(root / "b"), clock=LoopClock(),
            )  # fmt: skip
            async with leader:
                node = NodePort("broker-a")
                node.leading = Leading(broker, local, leader)
                loop = asyncio.get_running_loop()
                leader.in_sync.connected("a1")
                await leader.acknowledged("a1", changes.newest(), loop.time(), True, 0)
                await leader.reevaluate()

                async def follower() -> None:  # acknowledges each barrier a turn later
                    while True:
                        await asyncio.sleep(0.01)
                        if leader._waiters:
                            await leader.acknowledged("a1", changes.newest(), loop.time(),
                                                      True, 0)  # fmt: skip

                acks = asyncio.ensure_future(follower())
                try:
                    yield local, node.pop
                finally:
                    acks.cancel()
                    await asyncio.gather(acks, return_exceptions=True)


async def _run_at(
    pop: PopCall, request: PopRequest, at: int, resolved: bool
) -> tuple[_CancelAt, asyncio.Future[PopResult]]:
    cancel = _CancelAt(pop(request), at, resolved)

    async def run() -> PopResult:
        result: PopResult = await cancel
        return result

    return cancel, asyncio.ensure_future(run())


@pytest.mark.parametrize("fifo", [False, True], ids=["normal", "fifo"])
@pytest.mark.parametrize("resolved", [False, True], ids=["while-waiting", "once-answered"])
@pytest.mark.parametrize("layer", ["broker", "servicer", "node", "proxy-in-process"])
async def test_a_held_pop_cancelled_at_any_await_point_leaves_its_messages_visible(
    tmp_path: Path, layer: str, resolved: bool, fifo: bool
) -> None:
    """Pins the windows (each passes on main: no layer awaits between taking messages and
    returning them but the replicated barrier, which hands them back, and the proxy's turn
    after an in-process pop, where custody has them)."""
    async with _layer(layer, tmp_path) as (local, pop):
        broker = local.broker
        at = 0
        sent = 0
        while True:
            at += 1
            assert at < 200, "the pop never completes"
            cancel, task = await _run_at(pop, _held(fifo), at, resolved)
            await _held_or_done(broker, task)  # held (nothing to pop yet), or cancelled
            batch = [Message(topic=TOPIC, body=b"m%d" % (sent + i)) for i in range(3)]
            await local.send(batch)  # wakes it
            sent += 3
            try:
                result = await task
            except asyncio.CancelledError:
                assert cancel.landed
            else:
                assert not cancel.landed  # completed before its at-th suspension: done
                assert len(result.messages) == 3
                assert all(m.delivery_attempt == 1 for m in result.messages)
                break
            await asyncio.sleep(0)  # a release the proxy spawned (its custody) runs
            if layer == "proxy-in-process":
                await asyncio.sleep(0.1)
            again = await local.pop(_held(fifo, poll_ms=0))  # at once: no invisible time
            assert sorted(m.message.body for m in again.messages) == sorted(
                m.body for m in batch
            ), (at, resolved)
            # Never delivered: no attempt counted (a release by a change of invisible time
            # would count one, and FIFO would wait for its back-off).
            assert [m.delivery_attempt for m in again.messages] == [1, 1, 1], at
            acked = await local.ack(
                GROUP, TOPIC, [AckEntry(m.receipt_handle) for m in again.messages]
            )
            assert all(r.code == Code.OK for r in acked)
        assert at > 2  # it had await points to land on
