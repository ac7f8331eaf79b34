"""The per-receive seams (docs/benchmarks.md, "Idle polls, wave 10"): the receive path's
metrics are tallied as plain numbers and folded in when the registry is collected, reading the
same as if each had been recorded at once; tracing_on() asks OpenTelemetry nothing per call
until a provider is set."""

from __future__ import annotations

import random
from typing import Any

import pytest
from opentelemetry import trace
from popmq.proxy.metrics import (
    EMPTY_RESPONSES,
    LONG_POLLS,
    POP_WITH_NOTIFY,
    RECEIVE_DURATION,
    RPC_DURATION,
    RPC_REQUESTS,
    ProxyMetrics,
)
from prometheus_client.values import MutexValue

from popmq import tracing


def _samples(metrics: ProxyMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in metrics.registry.collect()
        for sample in family.samples
        if not sample.name.endswith("_created")
    }


def _record_idle_receives(metrics: ProxyMetrics, durations: list[float]) -> None:
    meter = metrics.meter("ReceiveMessage", lambda: 100.0)
    for seconds in durations:
        metrics.receive_started("notify")
        metrics.went_past_first_pop()
        metrics.receive_ended("notify", "empty", seconds, 0)
        meter.record(40401, 100.0 - seconds)


def _recorded_at_once(metrics: ProxyMetrics, durations: list[float]) -> None:
    """The same receives recorded straight into prometheus_client, as main did."""
    for seconds in durations:
        metrics[LONG_POLLS].labels("notify").inc()
        metrics[POP_WITH_NOTIFY].inc()
        metrics[RECEIVE_DURATION].labels("notify", "empty").observe(seconds)
        metrics[EMPTY_RESPONSES].labels("notify").inc()
        elapsed = 100.0 - (100.0 - seconds)  # as the meter reads it off its clock
        metrics[RPC_REQUESTS].labels("ReceiveMessage", "MESSAGE_NOT_FOUND").inc()
        metrics[RPC_DURATION].labels("ReceiveMessage").observe(elapsed)
        metrics.rocketmq_rpc_child("ReceiveMessage", "MESSAGE_NOT_FOUND").observe(elapsed * 1000)


def test_tallied_receive_metrics_read_as_if_recorded_at_once() -> None:
    rng = random.Random(7)
    bounds = [0.0, 0.001, 0.0025, 0.5, 1.0, 3.0, 20.0, 30.0, 31.0]  # on and past the bounds
    first = [rng.choice(bounds) + rng.choice((0.0, 1e-4)) for _ in range(500)]
    then = [rng.choice(bounds) for _ in range(300)]
    tallied, direct = ProxyMetrics(node_id="n"), ProxyMetrics(node_id="n")
    _record_idle_receives(tallied, first)
    _recorded_at_once(direct, first)
    assert _samples(tallied) == pytest.approx(_samples(direct))
    _record_idle_receives(tallied, then)  # folded again: only what came since
    _recorded_at_once(direct, then)
    assert _samples(tallied) == pytest.approx(_samples(direct))
    assert tallied.exposition().count("\n") == direct.exposition().count("\n")


def test_a_receive_takes_no_prometheus_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = ProxyMetrics(node_id="n")
    _record_idle_receives(metrics, [0.5])  # the children exist
    updates: list[Any] = []
    real_inc = MutexValue.inc

    def counting(self: MutexValue, amount: float) -> None:
        updates.append(amount)
        real_inc(self, amount)

    monkeypatch.setattr(MutexValue, "inc", counting)
    _record_idle_receives(metrics, [20.0] * 10)
    assert updates == []  # main: ten locked updates a receive
    value = metrics.registry.get_sample_value(
        "popmq_proxy_long_polls_total", {"strategy": "notify"}
    )
    assert value == 11 and updates  # folded in when collected


def test_tracing_on_asks_nothing_until_a_provider_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[int] = []
    real = trace.get_tracer_provider

    def counting() -> Any:
        asked.append(1)
        return real()

    monkeypatch.setattr(tracing, "_provider_installed", False)
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.setattr(trace, "get_tracer_provider", counting)
    assert not any(tracing.tracing_on() for _ in range(100))
    assert asked == []  # main: an environment lookup per call
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", object())  # set_tracer_provider's global
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: object())
    assert tracing.tracing_on()
