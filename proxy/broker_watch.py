"""Whether the proxy reaches each remote broker: a grpc.health.v1 check every few seconds,
logged when it changes (WARNING when a broker becomes unreachable) and exported as
``popmq_proxy_broker_up{broker}``. Requests still go to every broker; this is for operators."""

from __future__ import annotations

import asyncio
import logging

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from popmq.proxy.events import ProxyEvents

from popmq.config import BrokerAddress, BrokerLinkConfig
from popmq.lifecycle import fan_out
from popmq.security.link import broker_channel

log = logging.getLogger("popmq.proxy.brokers")

CHECK_INTERVAL_S = 5.0
CHECK_TIMEOUT_S = 2.0


async def check_broker(
    address: str, link: BrokerLinkConfig | None = None, deadline_s: float = CHECK_TIMEOUT_S
) -> str | None:
    """None when the broker answers SERVING, else why not (over the proxy's broker link:
    TLS and cluster token as configured)."""
    async with broker_channel(address, (), link) as channel:
        try:
            response = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=deadline_s
            )
        except grpc.RpcError as exc:
            return exc.code().name
    if response.status != health_pb2.HealthCheckResponse.SERVING:
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    return None


async def watch_brokers(
    brokers: list[BrokerAddress],
    metrics: ProxyEvents,
    link: BrokerLinkConfig | None = None,
    interval_s: float = CHECK_INTERVAL_S,
) -> None:
    """Check every broker each `interval_s` until cancelled."""
    up: dict[str, bool] = {}
    while True:
        problems = await fan_out(check_broker(b.address, link) for b in brokers)
        for broker, problem in zip(brokers, problems, strict=True):
            reachable = problem is None
            metrics.broker_up(broker.name, reachable)
            if up.get(broker.name) == reachable:
                continue
            if not reachable:
                log.warning("broker %s at %s is unreachable (%s)", broker.name, broker.address,
                            problem)  # fmt: skip
            elif broker.name in up:
                log.info("broker %s at %s is reachable again", broker.name, broker.address)
            up[broker.name] = reachable
        await asyncio.sleep(interval_s)
