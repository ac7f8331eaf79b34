"""Pops and zero-wait notifies of in-process brokers run on the receive's own task.

`popmq serve` holds its brokers in process (LocalBrokerPort, ``in_process``): a pop there is
plain Python with no turn of the loop between taking messages and returning them, so the long
polls call it directly instead of through a TaskOwner job (a task, a host task and a task
group per burst, and their wake-ups: docs/benchmarks.md, "Receive fan-out, wave 10"). What a
job guaranteed must hold all the same: a held pop that is cancelled holds nothing on the
broker and loses nothing, a woken pop that is cancelled hands its wake to the next one, and a
closing proxy refuses new pops. In-process brokers on virtual time."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.port import in_process
from popmq.broker.contract.types import Message
from popmq.broker.local import LocalBrokerPort
from popmq.proxy.longpoll import calls as calls_module
from popmq.proxy.longpoll.calls import BrokerCalls
from popmq.proxy.longpoll.custody import Custody
from popmq.proxy.longpoll.notify import NotifyStrategy
from popmq.proxy.longpoll.pop import PopStrategy
from popmq.proxy.metrics import ProxyMetrics

from .helpers import local_brokers, make_request, sample, wait_until

# Virtual time (looptime, the brokers on a LoopClock): holds and deadlines are exact.
pytestmark = pytest.mark.looptime

TOPIC = "t"


def _count_spawns(calls: BrokerCalls) -> list[str]:
    """The names of the jobs the calls' owner is asked to run from now on."""
    names: list[str] = []
    spawn = calls.tasks.spawn

    def counting(coro: Coroutine[Any, Any, Any], name: str, **kwargs: Any) -> Any:
        names.append(name)
        return spawn(coro, name, **kwargs)

    calls.tasks.spawn = counting  # type: ignore[method-assign]
    return names


def test_only_a_local_port_is_in_process() -> None:
    assert LocalBrokerPort.in_process is True

    class Remote:
        name = "r"

    assert not in_process(Remote())
    # A mock answers every attribute with a truthy mock: it is not taken for in process.
    from unittest.mock import MagicMock

    assert not in_process(MagicMock())


async def test_pops_of_in_process_brokers_spawn_no_task(tmp_path: Path) -> None:
    """A pop strategy's held pop and notify's first pop and fill pops: no job per pop."""
    metrics = ProxyMetrics()
    calls = BrokerCalls(metrics)
    pop_strategy = PopStrategy(calls, metrics, probe_false_empty=False)
    notify = NotifyStrategy(calls, metrics, probe_false_empty=False)
    spawned = _count_spawns(calls)
    async with local_brokers(tmp_path) as ports:
        # A held pop on b0, woken by a send.
        receive = asyncio.create_task(pop_strategy.receive(ports, make_request(5_000, "b0")))
        await wait_until(lambda: ports[0].broker.engine._hold.total == 1)
        await ports[0].send([Message(topic=TOPIC, body=b"a")])
        assert [m.message.body for m in await receive] == [b"a"]
        # notify: a first pop on b1, then fill pops on the other brokers.
        await ports[1].send([Message(topic=TOPIC, body=b"b")])
        await ports[2].send([Message(topic=TOPIC, body=b"c")])
        got = await notify.receive(ports, make_request(1_000, "b1"))
        assert sorted(m.message.body for m in got) == [b"b", b"c"]
        pops = sample(metrics, "popmq_proxy_broker_rpcs_total", kind="pop")
        assert pops >= 3
        assert [name for name in spawned if name.startswith("pop:")] == []
        await notify.aclose()
        await pop_strategy.aclose()


async def test_a_cancelled_held_pop_holds_nothing_and_loses_nothing(tmp_path: Path) -> None:
    metrics = ProxyMetrics()
    calls = BrokerCalls(metrics)
    strategy = PopStrategy(calls, metrics, probe_false_empty=False)
    async with local_brokers(tmp_path, count=1) as ports:
        hold = ports[0].broker.engine._hold
        receive = asyncio.create_task(strategy.receive(ports, make_request(5_000)))
        await wait_until(lambda: hold.total == 1)
        receive.cancel()  # the client is gone
        with pytest.raises(asyncio.CancelledError):
            await receive
        assert hold.total == 0  # the broker holds nothing for it
        await ports[0].send([Message(topic=TOPIC, body=b"x")])
        got = await strategy.receive(ports, make_request(1_000))
        assert [m.message.body for m in got] == [b"x"]  # nothing was taken by the cancelled one
        await strategy.aclose()


async def test_a_woken_pop_cancelled_before_it_runs_hands_its_wake_on(tmp_path: Path) -> None:
    """Two receives hold on one broker; a send wakes the older one, which is cancelled in
    the same turn of the loop: the younger one gets the message at once, not at its end."""
    metrics = ProxyMetrics()
    calls = BrokerCalls(metrics)
    strategy = PopStrategy(calls, metrics, probe_false_empty=False)
    async with local_brokers(tmp_path, count=1) as ports:
        loop = asyncio.get_running_loop()
        hold = ports[0].broker.engine._hold
        older = asyncio.create_task(strategy.receive(ports, make_request(5_000)))
        await wait_until(lambda: hold.total == 1)
        younger = asyncio.create_task(strategy.receive(ports, make_request(5_000)))
        await wait_until(lambda: hold.total == 2)
        started = loop.time()
        await ports[0].send([Message(topic=TOPIC, body=b"x")])  # wakes the older only
        older.cancel()
        with pytest.raises(asyncio.CancelledError):
            await older
        got = await younger
        assert [m.message.body for m in got] == [b"x"]
        assert loop.time() - started < 1  # virtual time: well before its 5 s deadline
        await strategy.aclose()


async def test_a_closing_proxy_refuses_an_in_process_pop(tmp_path: Path) -> None:
    metrics = ProxyMetrics()
    calls = BrokerCalls(metrics)
    async with local_brokers(tmp_path, count=1) as ports:
        await ports[0].send([Message(topic=TOPIC, body=b"x")])
        await calls.aclose()
        request = replace(make_request(0).pop, poll_time_ms=0)
        custody = Custody(calls.release, request)
        with pytest.raises(RefusedError) as refused:
            await calls.pop(ports[0], request, custody)
        assert refused.value.code is Code.PROXY_TIMEOUT
        assert custody.count == 0  # the broker was not asked


async def test_a_false_empty_probe_of_in_process_brokers_needs_no_task_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe asks each in-process broker in turn (zero-wait notifies are plain looks);
    it still finds a message and counts the false empty."""

    async def no_fan_out(*args: Any, **kwargs: Any) -> list[Any]:
        raise AssertionError("fan_out called for in-process brokers")

    monkeypatch.setattr(calls_module, "fan_out", no_fan_out)
    metrics = ProxyMetrics()
    calls = BrokerCalls(metrics)
    async with local_brokers(tmp_path) as ports:
        await ports[2].send([Message(topic=TOPIC, body=b"x")])
        calls.probe_false_empty(ports, make_request(0).pop, "pop")
        await calls.tasks.wait_idle()
        assert sample(metrics, "popmq_proxy_false_empty_responses_total", strategy="pop") == 1
        await calls.aclose()


async def test_an_in_process_pop_keeps_the_turns_a_job_took(tmp_path: Path) -> None:
    """The pop is made two turns of the loop after the call and the caller is back on the
    third, as when it ran in a job of an idle TaskOwner: arrivals of those turns ride the
    same pop (popping at once left receives a third less full under `bench e2e`)."""
    calls = BrokerCalls(ProxyMetrics())
    async with local_brokers(tmp_path, count=1) as ports:
        port = ports[0]
        loop = asyncio.get_running_loop()
        turn = 0
        ticking = True

        def tick() -> None:  # one call per turn of the loop, while ticking
            nonlocal turn
            turn += 1
            if ticking:
                loop.call_soon(tick)

        popped_at: list[int] = []
        pop = port.broker.pop

        async def recording(request: Any) -> Any:
            popped_at.append(turn)
            return await pop(request)

        port.pop = recording  # type: ignore[method-assign]
        request = replace(make_request(0).pop, poll_time_ms=0)
        loop.call_soon(tick)
        await asyncio.sleep(0)
        started = turn
        await calls.pop(port, request, Custody(calls.release, request))
        ended = turn
        ticking = False
        assert (popped_at[0] - started, ended - started) == (2, 3)
        await calls.aclose()
