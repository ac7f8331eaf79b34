"""HandleRenewer (proxy/renewal.py): PushConsumer handles renewed until the client is done."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import ChangeInvisibleResult
from popmq.proxy.metrics import AUTO_RENEWALS, ProxyMetrics
from popmq.proxy.registry import ClientRegistry
from popmq.proxy.renewal import RELEASE_INVISIBLE_MS, HandleRenewer

from popmq.clock import LoopClock
from popmq.config import ProxyConfig
from popmq.lifecycle import TaskOwner


class FakePort:
    """change_invisible_time that waits for the test to let it finish."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()
        self.fail_with: RefusedError | None = None

    async def change_invisible_time(
        self, group: str, topic: str, handle: str, invisible_ms: int
    ) -> ChangeInvisibleResult:
        self.calls.append((handle, invisible_ms))
        self.entered.set()
        await self.gate.wait()
        if self.fail_with is not None:
            raise self.fail_with
        return ChangeInvisibleResult(f"{handle}+", 0)


def _services(port: FakePort, **config: Any) -> Any:
    registry = ClientRegistry()
    registry.touch("push-1", client_type="PUSH_CONSUMER", group="g")
    settings = {"renew_slice_ms": 1_000, "renew_ahead_ms": 1_000, **config}
    return SimpleNamespace(
        proxy=ProxyConfig(renew_schedule_period_ms=10_000, **settings),
        metrics=ProxyMetrics(),
        tasks=TaskOwner("proxy"),
        registry=registry,
        cluster=SimpleNamespace(port_for_handle=lambda handle: port),
    )


def _renewer(services: Any) -> HandleRenewer:
    return HandleRenewer(
        services.proxy, services.cluster, services.registry, services.metrics, services.tasks
    )


def _metric(services: Any, outcome: str) -> float:
    return services.metrics[AUTO_RENEWALS].labels(outcome)._value.get()


async def test_an_ack_during_a_renewal_gets_the_renewed_handle() -> None:
    port = FakePort()
    services = _services(port)
    renewer = _renewer(services)
    renewer.track("push-1", "g", "t", [SimpleNamespace(receipt_handle="h1")])
    renewing = asyncio.create_task(renewer.renew_due())  # slice ends within "ahead"
    await asyncio.wait_for(port.entered.wait(), 10)
    assert port.calls == [("h1", 1_000)]
    taken = asyncio.create_task(renewer.take("h1"))
    await asyncio.sleep(0.01)
    assert not taken.done()  # it waits for the renewal that is changing the handle
    port.gate.set()
    assert await taken == "h1+"
    await renewing
    assert len(renewer) == 0 and _metric(services, "renewed") == 1
    assert await renewer.take("unknown") == "unknown"  # never renewed: unchanged
    await services.tasks.aclose(grace_s=0.01)


async def test_a_vanished_client_gets_its_messages_back_soon() -> None:
    port = FakePort()
    port.gate.set()
    services = _services(port)
    renewer = _renewer(services)
    renewer.track("push-1", "g", "t", [SimpleNamespace(receipt_handle="h1")])
    services.registry.remove("push-1")
    await renewer.renew_due()
    assert port.calls == [("h1", RELEASE_INVISIBLE_MS)]
    assert len(renewer) == 0 and _metric(services, "client_gone") == 1
    await services.tasks.aclose(grace_s=0.01)


async def test_failures_are_retried_then_given_up_and_gone_handles_dropped() -> None:
    port = FakePort()
    port.gate.set()
    port.fail_with = RefusedError(Code.INTERNAL_SERVER_ERROR, "broker down")
    services = _services(port, max_renew_retries=2)
    renewer = _renewer(services)
    renewer.track("push-1", "g", "t", [SimpleNamespace(receipt_handle="h1")])
    await renewer.renew_due()
    assert len(renewer) == 1  # kept for another try
    await renewer.renew_due()
    assert len(renewer) == 0 and _metric(services, "gave_up") == 1

    port.fail_with = RefusedError(Code.INVALID_RECEIPT_HANDLE, "acked elsewhere")
    renewer.track("push-1", "g", "t", [SimpleNamespace(receipt_handle="h2")])
    await renewer.renew_due()
    assert len(renewer) == 0 and _metric(services, "handle_gone") == 1
    await services.tasks.aclose(grace_s=0.01)


async def test_the_renewal_loop_belongs_to_the_proxys_task_owner() -> None:
    port = FakePort()
    services = _services(port)
    renewer = _renewer(services)
    renewer.track("push-1", "g", "t", [SimpleNamespace(receipt_handle="h1")])
    assert len(services.tasks) == 1  # started on the first handle, owned there
    await services.tasks.aclose(grace_s=0.01)  # proxy shutdown cancels it
    assert len(services.tasks) == 0


@pytest.mark.looptime
async def test_the_renew_time_limit_runs_on_the_injected_clock() -> None:
    port = FakePort()
    port.gate.set()
    services = _services(port, renew_max_ms=30_000)
    renewer = HandleRenewer(
        services.proxy, services.cluster, services.registry, services.metrics, services.tasks,
        clock=LoopClock(),
    )  # fmt: skip
    renewer.track("push-1", "g", "t", [SimpleNamespace(receipt_handle="h1")])
    # Virtual time: the loop renews at 10 s and 20 s (renew_schedule_period_ms) and drops the
    # handle at 30 s (renew_max_ms), without waiting for real.
    await asyncio.sleep(31)
    assert port.calls == [("h1", 1_000), ("h1+", 1_000)]
    assert len(renewer) == 0 and _metric(services, "max_time") == 1
    await services.tasks.aclose(grace_s=0.01)
